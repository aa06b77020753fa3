// CPU reference of the MoE producer fusions (moe_fused.h): literally the unfused composition
// (gather, or weighted SwiGLU, then the CPU reference quantizer), which the CUDA fusions must match.
#include <fmt/format.h>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/quant/moe_fused.h"

namespace lockstep {
namespace {
void check_fused_spec(const QuantSpec& spec, const char* what) {
  if (spec.format != Format::kNvfp4 || spec.scaling != Scaling::kPerRow || spec.block2d)
    throw QuantError(fmt::format("{}: the fused MoE path produces nvfp4 per_row 1-D blocks", what));
}
}  // namespace

std::vector<float> permute_rows_cpu(const MatrixF32& x, std::span<const int32_t> src_rows) {
  std::vector<float> out(src_rows.size() * size_t(x.cols), 0.0f);
  for (size_t i = 0; i < src_rows.size(); ++i) {
    const int32_t s = src_rows[i];
    if (s < 0) continue;
    if (s >= x.rows) throw QuantError(fmt::format("routing index {} at output row {} is outside tensor '{}' with {} rows", s, i, x.name, x.rows));
    std::copy(x.values.begin() + s * x.cols, x.values.begin() + (s + 1) * x.cols, out.begin() + int64_t(i) * x.cols);
  }
  return out;
}

QTensor permute_quantize_nvfp4_cpu(const MatrixF32& x, std::span<const int32_t> src_rows,
                                   std::span<const int64_t> offsets, const QuantSpec& spec) {
  check_fused_spec(spec, "permute_quantize");
  std::vector<float> g = permute_rows_cpu(x, src_rows);
  MatrixF32 m{g, int64_t(src_rows.size()), x.cols, x.type_max, x.name + ".permuted"};
  return quantize_grouped(m, offsets, spec);
}

std::vector<float> swiglu_weighted_cpu(const MatrixF32& fc1, std::span<const float> prob) {
  if (fc1.cols % 2 != 0 || int64_t(prob.size()) != fc1.rows)
    throw QuantError(fmt::format("tensor '{}' [{}, {}]: SwiGLU needs an even column count (gate | up) and one router probability per row ({} given)",
                                 fc1.name, fc1.rows, fc1.cols, prob.size()));
  const int64_t h = fc1.cols / 2;
  std::vector<float> y(size_t(fc1.rows * h));
  for (int64_t r = 0; r < fc1.rows; ++r)
    for (int64_t c = 0; c < h; ++c)
      y[size_t(r * h + c)] = num::swiglu_weighted_f32(fc1.values[size_t(r * fc1.cols + c)],
                                                      fc1.values[size_t(r * fc1.cols + h + c)], prob[size_t(r)]);
  return y;
}

QTensor swiglu_quantize_nvfp4_cpu(const MatrixF32& fc1, std::span<const float> prob, const QuantSpec& spec) {
  check_fused_spec(spec, "swiglu_quantize");
  std::vector<float> y = swiglu_weighted_cpu(fc1, prob);
  MatrixF32 m{y, fc1.rows, fc1.cols / 2, fc1.type_max, fc1.name + ".swiglu"};
  return quantize(m, spec);
}

}  // namespace lockstep
