// quantize_with_amax (quant/given_amax.h): the input rules, then the CPU row quantizer or the
// CUDA row kernels with the caller's amax in place of their amax pass.
#include <fmt/format.h>

#include "lockstep/numerics/codecs.h"
#include "lockstep/quant/given_amax.h"
#include "quantize_rows_cpu.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "quantize_cuda_entry.h"
#endif

namespace lockstep {

int64_t nvfp4_outer_domains(std::span<const int64_t> offsets, Scaling scaling) {
  if (scaling == Scaling::kPerGroup) return offsets.empty() ? 0 : int64_t(offsets.size()) - 1;
  return 1;
}

QTensor quantize_with_amax(const Tensor& x, std::span<const int64_t> offsets, const Tensor& amax,
                           const QuantConfig& cfg, std::string_view name) {
  if (x.dim() != 2)
    throw QuantError(
        fmt::format("tensor '{}' {}: quantization takes 2-D tensors", name, x.describe()));
  const std::string at = fmt::format("tensor '{}' {}", name, x.describe());
  if (cfg.format != Format::kNvfp4 ||
      (cfg.scaling != Scaling::kPerTensor && cfg.scaling != Scaling::kPerGroup))
    throw QuantError(fmt::format(
        "{}: a supplied amax applies to nvfp4 per_tensor / per_group scaling (the outer "
        "domains an optimizer step can reduce over), not {} {}",
        at, format_name(cfg.format), scaling_name(cfg.scaling)));
  if (!cfg.rowwise || cfg.colwise || cfg.stochastic || cfg.hadamard)
    throw QuantError(fmt::format(
        "{}: a supplied amax serves the rowwise copy only, rounded to nearest, without the "
        "Hadamard transform (the amax of a transformed or transposed copy is not the weight's)",
        at));
  validate_quant_input(name, x.rows(), x.cols(), offsets, cfg);
  const int64_t ndom = nvfp4_outer_domains(offsets, cfg.scaling);
  if (!amax.defined() || amax.dtype() != DType::kF32 || amax.numel() != ndom)
    throw QuantError(
        fmt::format("{}: the supplied amax must be F32 with {} value(s) (one per "
                    "outer domain), got {}",
                    at, ndom, amax.defined() ? amax.describe() : "none"));
  if (amax.device() != x.device())
    throw QuantError(fmt::format("{}: the supplied amax is on {}, the tensor on {}", at,
                                 amax.device().str(), x.device().str()));
  QTensor q;
  if (x.is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    q = cuda::quantize_with_amax(x.contiguous(), offsets, amax.contiguous(), cfg, name);
#else
    throw std::runtime_error(
        fmt::format("{} is on a CUDA device, but this lockstep was built without CUDA", at));
#endif
  } else {
    const std::vector<float> a = to_f32(amax);
    for (float v : a)
      if (!(v >= 0.0f) && !num::is_nan(v))
        throw QuantError(fmt::format("{}: supplied amax {} is negative", at, v));
    int64_t nonfinite = 0;
    q = cpu::quantize_rows(x.contiguous(), offsets, cfg, nonfinite, a);
  }
  q.source_dtype = x.dtype();
  return q;
}

}  // namespace lockstep
