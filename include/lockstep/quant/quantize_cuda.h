// CUDA backend of the quantizers (CONTRACT.md sections 2-8): the same bytes as the CPU reference
// in quantize.h, produced on the device. Two levels: a device API (inputs and outputs already in
// device memory, for benchmarks and GPU callers) and host convenience wrappers with the CPU API's
// signatures (copy in, run, copy out) used by dispatch.h and the cross-backend tests.
// Only available when built with -DLOCKSTEP_CUDA=ON (LOCKSTEP_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/device_buffer.h"

namespace lockstep::cuda {

enum class InputType : uint8_t { kF32, kBF16 };

// x: [rows, cols] row-major in device memory, fp32 or bf16. type_max as in MatrixF32.
struct DeviceMatrix {
  const void* data = nullptr;
  InputType type = InputType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
  float type_max = 3.4028234663852886e38f;
  std::string name = "tensor";
};

// A quantized tensor in device memory. `meta` carries every QTensor field except the byte vectors,
// which live in the device buffers below with the same sizes and layouts.
struct DeviceQTensor {
  QTensor meta;
  DeviceBuffer data, block_scale, amax, scale_inv, data_colwise, block_scale_colwise;
  // Scratch reused across calls (domain amax keys and values, Hadamard output).
  DeviceBuffer ws_keys, ws_dom, ws_tmp;
};

// Group offsets of a grouped buffer: `host` (validation, metadata) and the same values on the device.
struct DeviceGroups {
  std::vector<int64_t> host;
  DeviceBuffer device;
  explicit DeviceGroups(std::span<const int64_t> offsets) : host(offsets.begin(), offsets.end()) {
    device.upload(std::span<const int64_t>(host.data(), host.size()));
  }
  int64_t groups() const { return host.empty() ? 0 : int64_t(host.size()) - 1; }
};

// ---- device API (asynchronous on `stream`; buffers in `out` are resized as needed) ----------
// Throws QuantError for the shapes and combinations the CPU reference refuses.
void quantize_device(const DeviceMatrix& x, const QuantConfig& spec, DeviceQTensor& out,
                     const DeviceGroups* groups = nullptr, cudaStream_t stream = nullptr);
void quantize_nvfp4_joint_device(std::span<const DeviceMatrix> xs, const QuantConfig& spec,
                                 std::span<DeviceQTensor> outs, cudaStream_t stream = nullptr);
// out: [rows, cols] fp32. colwise selects the MXFP8 columnwise copy.
void dequantize_device(const DeviceQTensor& q, float* out, bool colwise = false, cudaStream_t stream = nullptr);
// out: [rows, cols] fp32, the transform of CONTRACT.md section 6 (bf16-rounded values).
void hadamard16_rows_device(const DeviceMatrix& x, float* out, cudaStream_t stream = nullptr);

// Copy a device result to a host QTensor (synchronizes `stream`).
QTensor to_host(const DeviceQTensor& q, cudaStream_t stream = nullptr);
// Copy a host QTensor to the device (for dequantize).
void to_device(const QTensor& q, DeviceQTensor& out, cudaStream_t stream = nullptr);

// ---- host convenience: the CPU API's signatures, run on the current CUDA device ------------
QTensor quantize_cuda(const MatrixF32& x, const QuantConfig& spec);
QTensor quantize_grouped_cuda(const MatrixF32& x, std::span<const int64_t> offsets, const QuantConfig& spec);
std::vector<QTensor> quantize_nvfp4_joint_cuda(std::span<const MatrixF32> xs, const QuantConfig& spec);
std::vector<float> dequantize_cuda(const QTensor& q);
std::vector<float> dequantize_colwise_cuda(const QTensor& q);
std::vector<float> hadamard16_rows_cuda(const MatrixF32& x);

// Copy a host fp32 matrix to the device as fp32 or as bf16 (bf16 only when every value is
// exactly a bf16, which the caller guarantees; values are rounded otherwise).
DeviceBuffer upload_matrix(const MatrixF32& x, InputType type, cudaStream_t stream = nullptr);

// Runs every fp32 bit pattern through the fast element encoders (numerics/fast_codecs.h) on the
// device and compares with the reference encoders; counts[3] = mismatches for E2M1, E4M3, E5M2.
uint64_t codec_mismatches_cuda(uint64_t counts[3]);

}  // namespace lockstep::cuda

namespace lockstep::cuda {

// ---- MoE producer fusions (definitions: quant/moe_fused.h), NVFP4 per-row, one pass ---------
// x: [tokens, cols] device; d_src_rows: [out_rows] int32 device (-1 = zero padding row);
// groups: offsets over the out_rows output rows.
void permute_quantize_nvfp4_device(const DeviceMatrix& x, const int32_t* d_src_rows, int64_t out_rows,
                                   const DeviceGroups& groups, const QuantConfig& spec, DeviceQTensor& out,
                                   cudaStream_t stream = nullptr);
// fc1: [rows, 2H] device (gate | up); d_prob: [rows] fp32 device.
void swiglu_quantize_nvfp4_device(const DeviceMatrix& fc1, const float* d_prob, const QuantConfig& spec,
                                  DeviceQTensor& out, cudaStream_t stream = nullptr);
// Host convenience versions with moe_fused.h's signatures.
QTensor permute_quantize_nvfp4_cuda(const MatrixF32& x, std::span<const int32_t> src_rows,
                                    std::span<const int64_t> offsets, const QuantConfig& spec);
QTensor swiglu_quantize_nvfp4_cuda(const MatrixF32& fc1, std::span<const float> prob, const QuantConfig& spec);

}  // namespace lockstep::cuda

namespace lockstep::cuda {

// ---- benchmark (lockstep bench quantize --device cuda, lockstep_test_backend --mode perf) -----
struct BenchRow {
  std::string name;      // "nvfp4 per_row (per-token)"
  double us = 0;         // median time per call
  double bytes = 0;      // bytes that must move: input read once + every output written once
  double gbps = 0;       // bytes / time
  double ratio = 0;      // gbps / device-to-device copy bandwidth of the same input, same run
  double target = 0;     // the target ratio (0: none)
};
// Input: rows x cols bf16 (random normal, on the device). filter: substring of the row names.
std::vector<BenchRow> bench_quantize_cuda(int64_t rows, int64_t cols, const std::string& filter = "", int iters = 20);
std::string format_bench_table(const std::vector<BenchRow>& rows);

}  // namespace lockstep::cuda
