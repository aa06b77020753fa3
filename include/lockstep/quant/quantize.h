// CPU reference quantizers and dequantizers for every format and scaling of CONTRACT.md
// sections 2-8. These functions are the specification that CUDA kernels are tested against.
// Options travel in QuantSpec, so the API grows by adding fields.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
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

struct QuantSpec {
  Format format = Format::kNvfp4;
  Scaling scaling = Scaling::kPerTensor;
  ElemCodec elem = ElemCodec::kE4M3;  // FP8 / MXFP8 element codec
  bool block2d = false;               // NVFP4: 16x16 blocks (weights)
  bool rowwise = true;                // MXFP8: produce the rowwise copy
  bool colwise = false;               // MXFP8: also produce the columnwise copy
  bool pow2 = false;                  // FP8: power-of-two scales
  float eps = 0.0f;                   // FP8: amax floor
  bool stochastic = false;            // stochastic rounding of elements (section 5)
  uint64_t seed = 0;                  // Philox key for stochastic rounding
  uint32_t stream = 0;                // Philox stream id for stochastic rounding
  bool hadamard = false;              // NVFP4: random Hadamard transform along rows (section 6)
  ScaleLayout scale_layout = ScaleLayout::kCompact;
};

// A read-only fp32 view of a row-major [rows, cols] input, plus the largest finite value of the
// input's original type (FP8 falls back to it when 448 / amax overflows: FLT_MAX for fp32,
// 0x7F7F for bf16, 65504 for fp16).
struct MatrixF32 {
  std::span<const float> values;
  int64_t rows = 0;
  int64_t cols = 0;
  float type_max = 3.4028234663852886e38f;
  std::string name = "tensor";  // for error messages
};

// Widen a 2-D F32 / BF16 / F16 tensor to fp32 (exact) and describe it. `storage` keeps the values.
MatrixF32 as_matrix_f32(const Tensor& t, std::vector<float>& storage, const std::string& name);

// Quantize one tensor. Scaling::kPerGroup needs quantize_grouped.
QTensor quantize(const MatrixF32& x, const QuantSpec& spec);
QTensor quantize(const Tensor& x, const QuantSpec& spec, const std::string& name = "tensor");

// Quantize a grouped (MoE) buffer: rows offsets[g]..offsets[g+1] form group g. Scaling kPerGroup
// gives one NVFP4 domain per group; the other scalings behave as for an ungrouped tensor, so a
// group quantized alone gives the same bytes as inside the buffer (CONTRACT.md section 8).
QTensor quantize_grouped(const MatrixF32& x, std::span<const int64_t> offsets,
                         const QuantSpec& spec);

// NVFP4 joint quantization: all tensors share one amax A (the max of theirs), e.g. an expert's
// gate and up projections. spec.scaling must be kPerTensor.
std::vector<QTensor> quantize_nvfp4_joint(std::span<const MatrixF32> xs, const QuantSpec& spec);

// Reconstruct fp32 values [rows, cols] (rowwise copy; the columnwise copy if only that exists).
std::vector<float> dequantize(const QTensor& q);
// Reconstruct the MXFP8 columnwise copy.
std::vector<float> dequantize_colwise(const QTensor& q);

// The random Hadamard transform of CONTRACT.md section 6 along each row (cols % 16 == 0),
// rounded to bf16 and widened back to fp32.
std::vector<float> hadamard16_rows(const MatrixF32& x);

// The shape and option rules every backend enforces before quantizing a [rows, cols] tensor
// called `name` (offsets: group offsets, empty when ungrouped). Throws QuantError naming the
// tensor, its shape and the rule broken.
void validate_quant_input(const std::string& name, int64_t rows, int64_t cols, std::span<const int64_t> offsets,
                          const QuantSpec& spec);

// Count of NaN and +-inf values.
int64_t count_nonfinite(std::span<const float> values);

}  // namespace lockstep
