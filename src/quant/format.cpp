// The one verdict on a quantization choice (format.h): every caller that accepts a QuantSpec (the
// quantizer, the recipe checks, the GEMM operand checks, the quantized-file reader) asks this
// function, so they cannot disagree about what a format allows.
#include "lockstep/quant/format.h"

#include <fmt/format.h>

#include <cmath>

namespace lockstep {

std::string scaling_names(Format f) {
  std::string s;
  for (const ScalingInfo& r : kScalings)
    if (format_takes(f, r.scaling)) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

std::string quant_spec_violation(const QuantSpec& s) {
  const FormatInfo& info = format_info(s.format);
  const std::string name(info.name);
  if (!info.quantized) {
    if (s == QuantSpec{s.format}) return "";
    return name + " is not quantized and takes no scaling, element codec or rounding options";
  }
  if (!format_takes(s.format, s.scaling))
    return fmt::format("{} takes scaling {}, not {}", name, scaling_names(s.format),
                       scaling_name(s.scaling));
  // "fp8 and mxfp8": the quantized formats whose row passes `takes`.
  auto formats_taking = [](auto takes) {
    std::string list;
    for (const FormatInfo& r : kFormats)
      if (r.quantized && takes(r)) list += (list.empty() ? "" : " and ") + std::string(r.name);
    return list;
  };
  if (!format_takes(s.format, s.elem))
    return fmt::format("elem applies to {} only, not {} (its element codec is fixed)",
                       formats_taking([](const FormatInfo& r) { return r.codecs != 0; }), name);
  struct Opt {
    QuantOption bit;
    bool set;
    const char* field;
    const char* what;
  };
  for (const Opt& o : {Opt{kOptBlock2d, s.block2d, "block2d", "16x16 blocks"},
                       Opt{kOptHadamard, s.hadamard, "hadamard", "the Hadamard transform"},
                       Opt{kOptPow2, s.pow2, "pow2", "power-of-two scales"},
                       Opt{kOptEps, s.eps != 0.0f, "eps", "an amax floor"},
                       Opt{kOptStochastic, s.stochastic, "stochastic", "stochastic rounding"}}) {
    if (o.set && !format_takes(s.format, o.bit))
      return fmt::format(
          "{} ({}) applies to {} only, not {}", o.field, o.what,
          formats_taking([&](const FormatInfo& r) { return (r.options & o.bit) != 0; }), name);
  }
  if (!(std::isfinite(s.eps) && s.eps >= 0.0f))
    return fmt::format("eps {} must be a finite amax floor >= 0", s.eps);
  if (s.block2d && s.scaling == Scaling::kPerRow)
    return "block2d (16x16 tiles spanning 16 rows) cannot use per_row outer scales; use "
           "per_tensor or per_group";
  return "";
}

}  // namespace lockstep
