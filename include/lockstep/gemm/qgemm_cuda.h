// CUDA backend of the quantized GEMMs of qgemm.h (docs/gemm.md): a tensor-core decode kernel for
// small M (1..16 rows per group, packed weights streamed), a Hopper wgmma kernel and an mma.sync
// tiled kernel for any M, all dequantizing exactly into bf16 with an fp32 reduction order fixed by
// K alone (batch-invariant), and a cuBLAS fast path (not batch-invariant). Outer scales and the
// epilogue of docs/gemm.md section 4 come last. Only with -DLOCKSTEP_CUDA=ON.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/gemm/qgemm.h"
#include "lockstep/tensor/device_buffer.h"

namespace lockstep::cuda {

// A GEMM operand [rows, K] in device memory (raw pointers; what the kernels read).
struct GemmOperandView {
  Format format = Format::kBf16;
  ElemCodec elem = ElemCodec::kE4M3;     // fp8 / mxfp8 element codec
  int64_t rows = 0;
  int64_t cols = 0;                      // K
  const void* data = nullptr;            // bf16 bits [rows, K] | nvfp4 [rows, K/2] | fp8, mxfp8 [rows, K]
  const uint8_t* block_scale = nullptr;  // compact: nvfp4 E4M3 [rows, K/16], mxfp8 E8M0 [rows, K/32]
  const float* outer = nullptr;          // [rows] outer scale (docs/gemm.md section 2); nullptr = 1
  // fp8 block_1x128 / block_128x128: the scale_inv of the block holding (r, k), expanded per row to
  // [rows, K/128] (one per 128-wide k chunk); nullptr for every other format. An operand with chunk
  // scales makes the GEMM use the chunked accumulation of docs/gemm.md section 3 (tiled kernel only).
  const float* chunk_scale = nullptr;
  // Opt-in, W operand of the decode kernel: `data` and `block_scale` are not written by any work
  // earlier in the stream that may still be running when this call's kernel starts (weights, not
  // activations; a weight conversion or update before the call must have completed, for example
  // through an event or a synchronisation). With programmatic dependent launch a kernel may then
  // read them before the previous kernels have completed, overlapping its first weight loads with
  // their tail. Only the timing changes, never a result bit.
  bool preload = false;
};

// An operand uploaded from a host GemmOperand: swizzled scales are made compact, the outer scale of
// every row is expanded to [rows] (nvfp4 S_dec of the row's domain, fp8 scale_inv), dense values
// are rounded to bf16, fp8 1x128 / 128x128 block scales become per-row chunk scales.
struct DeviceGemmOperand {
  GemmOperandView view;
  DeviceBuffer data, block_scale, outer, chunk_scale;
  std::string name;
};
DeviceGemmOperand upload_gemm_operand(const GemmOperand& op, cudaStream_t stream = nullptr);

// One group of a (grouped) GEMM as the kernels see it: A rows [a_row0, a_row0 + rows) times W
// rows [w_row0, w_row0 + N); output rows = A rows. Rows at index >= tokens are padding: output +0.
struct GemmGroupDesc {
  int64_t a_row0 = 0;
  int64_t w_row0 = 0;
  int32_t rows = 0;
  int32_t tokens = 0;
};
// Device table of groups, built once per grouping (kept out of the launch path so that launches
// can be captured in a CUDA graph).
struct DeviceGroupTable {
  DeviceBuffer table;  // GemmGroupDesc[groups]
  int groups = 0;
  int64_t max_rows = 0;
  int64_t total_rows = 0;
  std::vector<GemmGroupDesc> host;  // the same table on the host (the cuBLAS path loops over it)
};
DeviceGroupTable make_group_table(std::span<const int64_t> offsets, int64_t n_per_group,
                                  std::span<const int64_t> group_rows = {}, cudaStream_t stream = nullptr);
DeviceGroupTable make_dense_table(int64_t m, cudaStream_t stream = nullptr);

// Epilogue on the device (the same steps as GemmEpilogue; row amax is computed by the host wrapper).
struct DeviceEpilogue {
  float alpha = 1.0f;
  const float* bias = nullptr;         // [groups * N] (group g uses [gN, gN + N)), or [N] dense
  bool swiglu = false;
  const float* router_prob = nullptr;  // [total rows]
  bool out_bf16 = false;
};
// Output [total_rows, N] (N/2 with swiglu): exactly one of d_f32 / d_bf16.
struct GemmOutView {
  float* d_f32 = nullptr;
  uint16_t* d_bf16 = nullptr;
};

enum class QgemmKernel : uint8_t {
  kAuto,    // decode when every group has <= 16 rows, K % 128 == 0 and its shared memory fits (decode_fits),
            // else wgmma where available, else tiled
            // (always tiled when an operand has fp8 chunk scales)
  kDecode,  // small-M streaming kernel
  kTiled,   // tiled tensor-core kernel (any M; the only one that takes fp8 1x128 / 128x128 operands)
  kWgmma,   // Hopper wgmma kernel (sm_90, K % 64 == 0), batch-invariant like kTiled
  kCublas,  // NOT batch-invariant: exact bf16 dequantize + cuBLAS (fp32 accumulate) + epilogue
  kFast,    // the fast path: the kernel measured fastest for the call (qgemm_pick_fast); NOT guaranteed
            // batch-invariant (it may be kCublas)
};
// Whether libcublas was found (dlopen) for QgemmKernel::kCublas.
bool qgemm_cublas_available();
// Whether QgemmKernel::kWgmma runs here for reduction length k (an sm_90 GPU, k % 64 == 0).
bool qgemm_wgmma_available(int64_t k);
const char* qgemm_kernel_name(QgemmKernel k);
// Which kernel kAuto picks.
QgemmKernel qgemm_pick_kernel(const GemmOperandView& a, const GemmOperandView& w, const DeviceGroupTable& g);
// Which kernel kFast picks for W of format wf, `groups` groups of at most max_rows rows and
// reduction length k (fp8 chunk-scaled operands aside, which only the tiled kernel takes), from
// `lockstep bench gemm` on the H200 (bench/RESULTS.md, seventh and eighth sessions):
// - max_rows <= 16: as kAuto (the decode kernel where it fits);
// - nvfp4 or fp8 W, and grouped calls with mxfp8 W: the wgmma kernel (grouped nvfp4, 128 experts x
//   128-1024 rows: 1.3-2.5x faster than dequantize + cuBLAS, which dequantizes every expert's W;
//   dense 4096^3 / 8192^3 nvfp4 and fp8 within 3 %; grouped mxfp8 and fp8 are not benchmarked);
// - dense calls with mxfp8 W, and bf16 W: cuBLAS (dense 4096^3 mxfp8: 1.15x faster than wgmma;
//   bf16 W needs no dequantize, so cuBLAS is the bf16 baseline itself);
// - where the pick does not run (no sm_90 / K % 64, libcublas missing): the other, else tiled.
QgemmKernel qgemm_fast_kernel(Format wf, int64_t groups, int64_t max_rows, int64_t k);
QgemmKernel qgemm_pick_fast(const GemmOperandView& a, const GemmOperandView& w, const DeviceGroupTable& g);

// D = A W^T per group, asynchronous on `stream`. n: W rows per group (N). `workspace` is resized
// as needed (fp32 results before a SwiGLU epilogue, the cuBLAS path's bf16 operands). Throws
// GemmError on shapes or formats the kernels do not take. Launches only kernels once `workspace`
// is large enough (graph-capturable).
void qgemm_device(const GemmOperandView& a, const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                  const DeviceEpilogue& ep, GemmOutView out, DeviceBuffer& workspace,
                  QgemmKernel kernel = QgemmKernel::kAuto, cudaStream_t stream = nullptr);

// Host convenience with the CPU API's signatures: upload, run, download (row amax on the host).
GemmResult qgemm_cuda(const GemmOperand& a, const GemmOperand& w, const GemmEpilogue& ep = {},
                      QgemmKernel kernel = QgemmKernel::kAuto);
GemmResult grouped_qgemm_cuda(const GemmOperand& a, std::span<const int64_t> offsets, const GemmOperand& w,
                              const GemmEpilogue& ep = {}, std::span<const int64_t> group_rows = {},
                              QgemmKernel kernel = QgemmKernel::kAuto);

// ---- benchmark (lockstep bench gemm) -------------------------------------------------------
struct GemmBenchRow {
  std::string section;  // "decode", "moe-decode", "dense", "grouped"
  std::string name;     // "nvfp4 w4a16 14336x4096 M=1"
  double us = 0;        // median time per call
  double bytes = 0;     // packed weight bytes (data + scales) that must be read
  double gbps = 0;      // bytes / time
  double ratio_copy = 0;      // gbps / device copy bandwidth (decode); 0 when not applicable
  double tflops = 0;          // 2 M N K / time
  double baseline_us = 0;     // cuBLAS bf16 (or per-expert loop) on the same shape, same run
  double ratio_baseline = 0;  // baseline_us / us (> 1: faster than bf16)
  double target = 0;          // the target for the ratio that matters (0: none)
  bool target_is_copy = false;
};
struct GemmBenchResult {
  std::string gpu;
  double copy_gbps = 0;  // device-to-device copy, (read + write) bytes / time
  bool have_cublas = false;
  std::vector<GemmBenchRow> rows;
};
// filter: substring of section or name; quick: smaller shapes (CI smoke run).
GemmBenchResult bench_gemm_cuda(const std::string& filter = "", bool quick = false, int iters = 20);

}  // namespace lockstep::cuda
