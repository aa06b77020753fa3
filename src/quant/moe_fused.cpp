// The MoE producer fusions (moe_fused.h). On the CPU literally the unfused composition (gather, or
// weighted SwiGLU, then the reference quantizer), which the CUDA fusions must match.
#include "lockstep/quant/moe_fused.h"

#include <fmt/format.h>

#include "lockstep/numerics/transcendental.h"
#include "quantize_cpu.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "quantize_cuda_entry.h"
#endif

namespace lockstep {
namespace {

void check_fused_cfg(const QuantConfig& cfg, const char* what) {
  if (cfg.format != Format::kNvfp4 || cfg.scaling != Scaling::kPerRow || cfg.block2d ||
      cfg.colwise || !cfg.rowwise || cfg.hadamard)
    throw QuantError(
        fmt::format("{}: the fused MoE path produces the nvfp4 per_row 1-D rowwise copy", what));
}

void check_host(const Tensor& t, const char* what) {
  if (!t.is_cpu()) throw QuantError(fmt::format("{}: {} is not on the cpu", what, t.describe()));
}

std::vector<int32_t> host_i32(const Tensor& t, const char* what) {
  if (t.dtype() != DType::kI32 || t.dim() != 1)
    throw QuantError(
        fmt::format("{}: src_rows must be a 1-D I32 tensor, got {}", what, t.describe()));
  auto v = t.contiguous().data<int32_t>();
  return {v.begin(), v.end()};
}

}  // namespace

Tensor permute_rows(const Tensor& x, const Tensor& src_rows) {
  check_host(x, "permute_rows");
  std::vector<float> storage;
  const cpu::MatrixF32 m = cpu::as_matrix(x, storage, "x");
  const std::vector<int32_t> src = host_i32(src_rows, "permute_rows");
  Tensor out(DType::kF32, {int64_t(src.size()), m.cols});
  float* o = out.ptr<float>();
  for (size_t i = 0; i < src.size(); ++i) {
    const int32_t s = src[i];
    if (s < 0) continue;
    if (s >= m.rows)
      throw QuantError(fmt::format(
          "routing index {} at output row {} is outside a tensor of {} rows", s, i, m.rows));
    std::copy(m.values.begin() + s * m.cols, m.values.begin() + (s + 1) * m.cols,
              o + int64_t(i) * m.cols);
  }
  return out;
}

QTensor permute_quantize(const Tensor& x, const Tensor& src_rows, std::span<const int64_t> offsets,
                         const QuantConfig& cfg, std::string_view name) {
  check_fused_cfg(cfg, "permute_quantize");
  if (x.is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    return cuda::permute_quantize(x, src_rows, offsets, cfg, name);
#else
    throw QuantError("permute_quantize: built without CUDA");
#endif
  }
  QTensor q =
      quantize_grouped(permute_rows(x, src_rows), offsets, cfg, std::string(name) + ".permuted");
  q.source_dtype = x.dtype();
  return q;
}

Tensor swiglu_weighted(const Tensor& fc1, const Tensor& prob) {
  check_host(fc1, "swiglu_weighted");
  check_host(prob, "swiglu_weighted");
  std::vector<float> storage;
  const cpu::MatrixF32 m = cpu::as_matrix(fc1, storage, "fc1");
  const std::vector<float> p = to_f32(prob);
  if (m.cols % 2 != 0 || int64_t(p.size()) != m.rows)
    throw QuantError(
        fmt::format("tensor 'fc1' {}: SwiGLU needs an even column count (gate | up) and one router "
                    "probability per row ({} given)",
                    fc1.describe(), p.size()));
  const int64_t h = m.cols / 2;
  Tensor y = Tensor::empty(DType::kF32, {m.rows, h});
  float* yv = y.ptr<float>();
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < h; ++c)
      yv[r * h + c] = num::swiglu_weighted_f32(m.values[size_t(r * m.cols + c)],
                                               m.values[size_t(r * m.cols + h + c)], p[size_t(r)]);
  return y;
}

QTensor swiglu_quantize(const Tensor& fc1, const Tensor& prob, const QuantConfig& cfg,
                        std::string_view name) {
  check_fused_cfg(cfg, "swiglu_quantize");
  if (fc1.is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    return cuda::swiglu_quantize(fc1, prob, cfg, name);
#else
    throw QuantError("swiglu_quantize: built without CUDA");
#endif
  }
  QTensor q = quantize(swiglu_weighted(fc1, prob), cfg, std::string(name) + ".swiglu");
  q.source_dtype = fc1.dtype();
  return q;
}

}  // namespace lockstep
