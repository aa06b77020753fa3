// The CUDA GEMMs as their kernels see them, private to src/gemm (and the benchmarks and GPU tests,
// which include src/): raw-pointer operand views, the group table, the device epilogue and
// output, and the one launch entry qgemm_device that every caller goes through. The library
// prepares these from Tensors and QTensors (qgemm_cuda_entry.cu); kernel choice lives in
// choose_kernel, written once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "../tensor/cuda_util.h"
#include "lockstep/gemm/qgemm.h"
#include "qgemm_variant.h"

namespace lockstep::cuda {

// A GEMM operand [rows, K] in device memory, K-major (what the kernels read).
struct GemmOperandView {
  Format format = Format::kBf16;
  ElemCodec elem = ElemCodec::kE4M3;  // fp8 / mxfp8 element codec
  int64_t rows = 0;
  int64_t cols = 0;            // K
  const void* data = nullptr;  // bf16 bits [rows, K] | nvfp4 [rows, K/2] | fp8, mxfp8 [rows, K]
  const uint8_t* block_scale =
      nullptr;                   // compact: nvfp4 E4M3 [rows, K/16], mxfp8 E8M0 [rows, K/32]
  const float* outer = nullptr;  // [rows] outer scale (docs/gemm.md section 2); nullptr = 1
  // fp8 block_1x128 / block_128x128: the scale_inv of the block holding (r, k), per row and
  // 128-wide k chunk [rows, K/128]; nullptr for every other format. An operand with chunk scales
  // makes the GEMM use the chunked accumulation of docs/gemm.md section 3 (tiled kernel only).
  const float* chunk_scale = nullptr;
  // Opt-in, W operand of the decode kernel: `data` and `block_scale` are not written by any work
  // earlier in the stream that may still be running when this call's kernel starts (weights, not
  // activations). With programmatic dependent launch the kernel may then read them before the
  // previous kernels have completed. Only the timing changes, never a result bit.
  bool preload = false;
};

// One group of a (grouped) GEMM as the kernels see it: A rows [a_row0, a_row0 + rows) times W
// rows [w_row0, w_row0 + N); output rows = A rows. Rows at index >= tokens are padding: output +0.
struct GemmGroupDesc {
  int64_t a_row0 = 0;
  int64_t w_row0 = 0;
  int32_t rows = 0;
  int32_t tokens = 0;
};

// The group table of a call: on the device always (device_table()); on the host too when the
// offsets are (the cuBLAS path loops over it). max_rows bounds the rows of every group (the
// kernels' row tiles). `groups` is the number of entries the kernels visit (their grids' z): from
// host offsets every group in order; from device offsets (up to 1024 groups) the groups with rows
// come first and only min(groups, total rows) entries are visited, since no more groups than rows
// can have any.
struct DeviceGroupTable {
  int groups = 0;
  int64_t max_rows = 0;
  int64_t total_rows = 0;
  std::vector<GemmGroupDesc> host;  // empty when the offsets live only on the device
  // Built from host offsets (the cuBLAS path needs them); a host table has at least one group.
  bool on_host() const { return !host.empty(); }
  // The table on the device, `groups` entries, for the kernels that read it. A host table goes up
  // (kernel parameters, no host wait) on the stream it was made for, at the first call: a call that
  // cuBLAS serves whole (no epilogue kernel) uploads nothing.
  const GemmGroupDesc* device_table() const;

  // Set by make_group_table / make_group_table_device.
  Device device;
  Stream stream;
  mutable Tensor storage;                        // owns the device table
  mutable const GemmGroupDesc* table = nullptr;  // the device table once built
};
// From host offsets (validated): uploaded through kernel parameters (no host wait).
DeviceGroupTable make_group_table(std::span<const int64_t> offsets, int64_t n_per_group,
                                  std::span<const int64_t> group_rows, Device device,
                                  Stream stream);
// From device offsets (I64 [groups + 1]) and optional device tokens per group: built by a kernel
// (groups with rows first, up to 1024 groups).
// max_rows is the caller's bound; a group with more rows, offsets that decrease or tokens outside
// 0..rows stop the kernel with a trap (the device cannot throw).
DeviceGroupTable make_group_table_device(const int64_t* offsets, int groups, const int64_t* tokens,
                                         int64_t n_per_group, int64_t max_rows, int64_t total_rows,
                                         Device device, Stream stream);

// Epilogue on the device (the steps of GemmEpilogue 1-4; the row amax runs after the GEMM).
struct DeviceEpilogue {
  float alpha = 1.0f;
  const float* bias = nullptr;  // [groups * N] (group g uses [gN, gN + N)), or [N] dense
  bool swiglu = false;
  const float* router_prob = nullptr;  // [total rows]
  bool out_bf16 = false;
};
// Output [total_rows, N] (N/2 with swiglu): exactly one of d_f32 / d_bf16.
struct GemmOutView {
  float* d_f32 = nullptr;
  uint16_t* d_bf16 = nullptr;
};

bool cublas_available();
// sm_90 GPU and k % 64 == 0.
bool wgmma_available(int64_t k);

// The kernel variant a call runs: `forced` (requested_variant of the GemmConfig) when not kAuto,
// else the library's choice for the order, W format, groups, rows per group and K (docs/gemm.md
// "Kernel policy").
GemmVariant choose_kernel(GemmVariant forced, GemmOrder order, const GemmOperandView& a,
                          const GemmOperandView& w, const DeviceGroupTable& groups);

// D = A W^T per group, asynchronous on `stream`; n: W rows per group (N). Scratch memory comes from
// `scratch` (the caller's pool). Returns the variant that ran (a wgmma request names the one it
// chose).
// Throws GemmError on shapes or formats the kernel does not take.
GemmVariant qgemm_device(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                         const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                         Scratch& scratch, GemmVariant kernel, GemmOrder order,
                         cudaStream_t stream);

// Row amax of a [rows, cols] output (F32 or BF16 bits) into amax [rows] (CONTRACT.md section 0).
void launch_row_amax(const void* d, bool bf16, int64_t rows, int64_t cols, float* amax,
                     cudaStream_t stream);

// Row-major D [m, n] (fp32 or bf16) = A [m, k] W [n, k]^T with cuBLAS, bf16 operands, fp32
// accumulation (the benchmarks' baseline); batch > 1: strided batched with the given strides.
void cublas_gemm_bf16(const void* a, const void* w, void* d, bool d_f32, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream, int batch = 1, int64_t stride_a = 0,
                      int64_t stride_w = 0, int64_t stride_d = 0);

}  // namespace lockstep::cuda
