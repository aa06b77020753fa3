// The GEMM entry points: D = A W^T for quantized (QTensor) and dense (Tensor) operands on either
// device, dense and grouped (MoE), with the fused epilogues. Each is one call that runs where its
// operands live; the kernel is the library's choice unless GemmConfig::kernel names one.
// docs/gemm.md states the semantics: the fp32 accumulation order, where block scales apply, the
// epilogue order and the error bound.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "lockstep/quant/qtensor.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

// A GEMM contract violation by the caller (shapes, offsets, an operand the GEMM cannot read).
// The message names the operands, their shapes and the rule broken.
class GemmError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One GEMM operand: a quantized tensor or a dense tensor (a view; the tensor must outlive the
// call). A dense operand is used at its dtype's precision: BF16 values as they are (format bf16),
// F32 values unrounded (format f32, tests), F64 values in the float64 path (gradient checks).
class GemmArg {
 public:
  GemmArg(const QTensor& q) : q_(&q) {}  // NOLINT: implicit by design
  GemmArg(const Tensor& t) : t_(&t) {}   // NOLINT: implicit by design
  bool quantized() const { return q_ != nullptr; }
  const QTensor& q() const { return *q_; }
  const Tensor& t() const { return *t_; }
  Device device() const { return q_ ? q_->device() : t_->device(); }
  Format format() const;
  // The operand matrix a copy describes: the rowwise copy is X [rows, cols] (K = cols), the
  // columnwise copy is X^T [cols, rows] (K = rows).
  int64_t rows(Copy c) const;
  int64_t cols(Copy c) const;
  std::string describe(Copy c, std::string_view name) const;  // "'w' [64, 256] nvfp4 per_row"

 private:
  const QTensor* q_ = nullptr;
  const Tensor* t_ = nullptr;
};

// Applied to D[i, j] = RN(RN(outer_a(i) * outer_w(j)) * acc[i, j]) in this order:
//   1. v = RN(alpha * D)                        (alpha = 1 is the identity, bit for bit)
//   2. v = RN(v + bias[j])                      when bias is given
//   3. swiglu: y[i, c] = RN(RN(silu(v[i, c]) * v[i, I + c]) * p_i), c < I = N / 2,
//      p_i = router_prob[i] (1 when absent), silu of numerics/transcendental.h; output [M, I]
//   4. bf16 RNE when the output dtype is BF16
//   5. row_amax[i] = amax (CONTRACT.md section 0) of output row i as written (after step 4),
//      which is the outer amax a per-row NVFP4 quantization of the output would compute.
struct GemmEpilogue {
  float alpha = 1.0f;
  Tensor bias;          // F32 [N] (grouped: [groups * N]); undefined = none
  bool swiglu = false;  // N = 2I: columns [0, I) gate, [I, 2I) up
  Tensor router_prob;   // F32 [M]; undefined = 1
  bool row_amax = false;
};

// Batch-invariant: the order of every output element's reduction depends only on K (and the
// operands' formats), never on M, the batch position or the device's launch shape. Fast: the
// fastest kernel measured for the shape, which may reduce in another order (within the bound).
enum class GemmOrder : uint8_t { kBatchInvariant, kFast };

// The kernels a caller may choose (GemmConfig::kernel) and GemmResult::kernel reports. Each CUDA
// kernel has variants that give the same bits (the library picks one; tests, benchmarks and the
// kernel lab force one through GemmConfig::variant).
enum class GemmKernel : uint8_t {
  kAuto,        // the library's choice for the order and the shape
  kCpu,         // the CPU path (batch-invariant, fp32, ascending k)
  kCudaDecode,  // small M (<= 16 rows per group), packed W streamed (batch-invariant)
  kCudaWgmma,   // Hopper wgmma, any M, batch-invariant
  kCudaCublas,  // exact bf16 dequantize + cuBLAS (NOT batch-invariant)
  kCudaTiled,   // mma.sync tiles, any M; the only one taking fp8 1x128 / 128x128
  kCount,
};
std::string_view gemm_kernel_name(GemmKernel k);
std::optional<GemmKernel> gemm_kernel_from_name(std::string_view name);

struct GemmConfig {
  GemmEpilogue epilogue;
  GemmOrder order = GemmOrder::kBatchInvariant;
  // Which copy of each operand: fprop Y = X W^T is (rowwise, rowwise); dgrad dX = dY W is
  // (rowwise, colwise); wgrad dW = dY^T X is (colwise, colwise).
  Copy a_copy = Copy::kRowwise;
  Copy w_copy = Copy::kRowwise;
  DType out_dtype = DType::kF32;  // F32 or BF16 (F64 operands give F64)
  Stream stream;                  // CUDA stream (ignored on the CPU)
  GemmKernel kernel = GemmKernel::kAuto;
  // Tests, benchmarks and the kernel lab: one variant of `kernel` by name (for example
  // "cuda_wgmma_wreg128"; GemmResult::variant names the one that ran). Empty: the library's choice.
  std::string_view variant;
  // Grouped calls: tokens per group (I64 [groups], on the operands' device); rows of a group past
  // its token count are padding rows whose output is +0. Undefined = every row is a token.
  Tensor group_rows;
  // Grouped calls with device-resident offsets: a host bound on rows per group, for the kernel
  // choice without reading the offsets back (-1: unknown, kernels that take any M are chosen).
  int64_t max_group_rows = -1;
};

struct GemmResult {
  Tensor d;         // [M, N] (N / 2 with swiglu), out_dtype, on the operands' device
  Tensor row_amax;  // F32 [M] when asked
  GemmKernel kernel = GemmKernel::kAuto;  // the kernel that ran
  std::string_view variant;               // and its variant ("cpu", "cuda_wgmma_wreg128", ...)
};

// D = A W^T: A [M, K] and W [N, K] as the copies in cfg describe them.
GemmResult qgemm(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg = {});

// Grouped (MoE) GEMM; offsets: I64 [groups + 1] on the host or the operands' device.
// - a_copy rowwise (groups along M, fprop and dgrad): A [sum_rows, K], rows
// offsets[e]..offsets[e+1]
//   are group e; W holds one [N, K] operand per group: rowwise, W [groups * N, K] with group e in
//   rows [eN, (e+1)N); columnwise, the columnwise copies of the groups of a grouped W
//   [groups * K, N] (W quantized with quantize_grouped, or a dense W split into equal groups).
//   Output [sum_rows, N]; group e's rows equal qgemm(A rows of e, W of e) bit for bit.
// - a_copy and w_copy columnwise (groups along K, wgrad): A [sum_rows, Na] and W [sum_rows, Nw]
//   grouped by the same offsets; D_e = A_e^T W_e; output [groups * Na, Nw]. Plain epilogue only.
GemmResult grouped_qgemm(const GemmArg& a, const Tensor& offsets, const GemmArg& w,
                         const GemmConfig& cfg = {});

}  // namespace lockstep
