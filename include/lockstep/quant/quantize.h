// The quantizer entry points: quantize, quantize_grouped, quantize_joint, dequantize and the
// Hadamard transform, each one call that runs on the device its input lives on (CPU reference or
// CUDA kernels, which produce the same bytes). Bytes follow CONTRACT.md sections 2-8 and 12.
// Options travel in QuantConfig (a QuantSpec plus the call's options), so the API grows by adding
// fields.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/quant/format.h"
#include "lockstep/quant/qtensor.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

// A contract violation by the caller's data (shape not a multiple of the block, unsupported
// combination, non-finite input where refused). The message names the tensor and the rule.
class QuantError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One quantize call: the quantization choice (QuantSpec, format.h) plus what the call adds. A
// spec converts to the config with the call's defaults; the API grows by adding fields.
struct QuantConfig : QuantSpec {
  QuantConfig() = default;
  QuantConfig(const QuantSpec& spec) : QuantSpec(spec) {}  // NOLINT: implicit by design
  bool rowwise = true;                                     // produce the rowwise copy
  bool colwise = false;     // produce the columnwise copy (CONTRACT.md section 12)
  uint64_t seed = 0;        // Philox key for stochastic rounding
  uint32_t rng_stream = 0;  // Philox stream id for stochastic rounding
  ScaleLayout scale_layout = ScaleLayout::kCompact;
  Stream stream;  // CUDA stream the work is ordered on (ignored on the CPU)
};

// What a quantizer learns about its input on the way, for callers that would otherwise read the
// input again (the CLI refuses non-finite inputs). The CPU quantizer gathers it in the same pass;
// for a CUDA input it costs a host copy.
struct QuantStats {
  int64_t nonfinite = 0;  // NaN and +-inf elements
};

// Quantize a 2-D F32 / BF16 (/ F16 on the CPU) tensor. Scaling::kPerGroup needs quantize_grouped.
// `stats`, when given, receives the input's statistics.
QTensor quantize(const Tensor& x, const QuantConfig& cfg, std::string_view name = "tensor",
                 QuantStats* stats = nullptr);

// Quantize a grouped (MoE) buffer: rows offsets[g]..offsets[g+1] form group g. Scaling kPerGroup
// gives one domain per group; the other scalings behave as for an ungrouped tensor, so a group
// quantized alone gives the same bytes as inside the buffer (CONTRACT.md section 8).
QTensor quantize_grouped(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                         std::string_view name = "tensor", QuantStats* stats = nullptr);

// NVFP4 joint quantization: all tensors share one amax A (the max of theirs), e.g. an expert's
// gate and up projections. cfg.scaling must be kPerTensor. names: one per tensor, or empty.
std::vector<QTensor> quantize_joint(std::span<const Tensor> xs, const QuantConfig& cfg,
                                    std::span<const std::string> names = {});

struct DequantConfig {
  Copy copy = Copy::kRowwise;  // which copy to rebuild X from
  DType dtype = DType::kF32;   // F32, or BF16 (the fp32 value rounded to nearest even)
  Stream stream;
};
// Reconstruct X [rows, cols] from one copy, on the QTensor's device. A --hadamard tensor comes back
// in the transformed domain (what the GEMM consumes); undo_hadamard maps it back.
Tensor dequantize(const QTensor& q, const DequantConfig& cfg = {});

// Undoes the random Hadamard transform (CONTRACT.md section 6) of values rebuilt from one copy of
// a --hadamard QTensor, in place: along rows for the rowwise copy, along columns (the rows of X^T)
// for the columnwise copy. values: [rows, cols] row-major on the host. The transform's bf16
// rounding and the quantization error stay.
void undo_hadamard(std::span<float> values, int64_t rows, int64_t cols, Copy copy);

// The random Hadamard transform of CONTRACT.md section 6 along each row (cols % 16 == 0), rounded
// to bf16 and widened back: an F32 tensor of x's shape on x's device.
Tensor hadamard16_rows(const Tensor& x, Stream stream = {});

// The shape and option rules every backend enforces before quantizing a [rows, cols] tensor
// called `name` (offsets: group offsets, empty when ungrouped). Throws QuantError naming the
// tensor, its shape and the rule broken.
void validate_quant_input(std::string_view name, int64_t rows, int64_t cols,
                          std::span<const int64_t> offsets, const QuantConfig& cfg);

// Count of NaN and +-inf values.
int64_t count_nonfinite(std::span<const float> values);

// The largest finite value of a source dtype (FP8 falls back to it when 448 / amax overflows):
// FLT_MAX for F32, 0x7F7F for BF16, 65504 for F16.
float source_type_max(DType dtype);

}  // namespace lockstep
