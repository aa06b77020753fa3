// Recipe name tables, validation (operands by the format table, quant_spec_violation) and the
// exact bf16-tail rule. JSON (de)serialization lives in recipe_json.cpp.
#include "lockstep/recipe/recipe.h"

#include <fmt/format.h>

#include <cmath>

namespace lockstep {
namespace {

constexpr std::array<std::string_view, size_t(Gemm::kCount)> kGemms{"fprop", "dgrad", "wgrad"};
constexpr std::array<std::string_view, size_t(BackwardMode::kCount)> kBackwardModes{
    "quantized", "high_precision", "dequantized"};
constexpr std::array<std::string_view, size_t(ModuleClass::kCount)> kModuleClasses{
    "qkv",         "attn_out",   "router",     "experts_fc1",
    "experts_fc2", "shared_fc1", "shared_fc2", "lm_head"};
constexpr std::array<std::string_view, size_t(CoverageScope::kCount)> kScopes{"experts",
                                                                              "all_linear"};
static_assert(size_t(ModuleClass::kLmHead) == kLayerModuleClasses,
              "per-layer module classes come before lm_head");

template <class E, size_t N>
std::optional<E> from_table(const std::array<std::string_view, N>& t, std::string_view n) {
  for (size_t i = 0; i < N; ++i)
    if (t[i] == n) return E(i);
  return std::nullopt;
}

bool is_gradient_operand(Gemm g, int operand) {
  return g != Gemm::kFprop && operand == 0;  // dgrad / wgrad: the left operand is grad_output
}

void validate_operand(const QuantSpec& op, const std::string& where, bool gradient) {
  if (const std::string why = quant_spec_violation(op); !why.empty())
    throw RecipeError(where + ": " + why);
  if (op.stochastic && !gradient)
    throw RecipeError(
        where + ": stochastic rounding is for gradient operands only (CONTRACT.md section 5)");
}

void validate_linear(const LinearSpec& s, const std::string& where) {
  for (size_t g = 0; g < size_t(Gemm::kCount); ++g) {
    const auto names = gemm_operand_names(Gemm(g));
    const GemmSpec& gs = s.gemm[g];
    const std::string gw = where + std::string(gemm_name(Gemm(g)));
    validate_operand(gs.a, gw + "." + std::string(names[0]), is_gradient_operand(Gemm(g), 0));
    validate_operand(gs.b, gw + "." + std::string(names[1]), is_gradient_operand(Gemm(g), 1));
    // The transform must be applied to both operands along K, or it does not cancel.
    if (gs.a.hadamard != gs.b.hadamard)
      throw RecipeError(gw + ": hadamard must be set on both operands of the GEMM or on neither");
  }
}

}  // namespace

std::string_view gemm_name(Gemm g) { return kGemms[size_t(g)]; }
std::string_view backward_mode_name(BackwardMode m) { return kBackwardModes[size_t(m)]; }
std::string_view module_class_name(ModuleClass c) { return kModuleClasses[size_t(c)]; }
std::string_view scope_name(CoverageScope s) { return kScopes[size_t(s)]; }

std::optional<BackwardMode> backward_mode_from_name(std::string_view n) {
  return from_table<BackwardMode>(kBackwardModes, n);
}
std::optional<ModuleClass> module_class_from_name(std::string_view n) {
  return from_table<ModuleClass>(kModuleClasses, n);
}
std::optional<CoverageScope> scope_from_name(std::string_view n) {
  return from_table<CoverageScope>(kScopes, n);
}

std::array<std::string_view, 2> gemm_operand_names(Gemm g) {
  switch (g) {
    case Gemm::kFprop:
      return {"activation", "weight"};
    case Gemm::kDgrad:
      return {"grad_output", "weight"};
    default:
      return {"grad_output", "activation"};
  }
}

const LinearSpec& Recipe::spec_for(ModuleClass c) const {
  auto it = modules.find(c);
  return it == modules.end() ? linear : it->second;
}

int bf16_tail_layers(double fraction, int layers) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw RecipeError(
        fmt::format("coverage.last_fraction_bf16 must lie in [0, 1], got {}", fraction));
  const double scaled = fraction * 1e6;
  const long long ppm = std::llround(scaled);
  // 0.15 * 1e6 is 150000.00000000003 in binary; anything within 1e-6 of an integer is that
  // integer, anything further has more than 6 decimals and is refused rather than guessed.
  if (std::fabs(scaled - double(ppm)) > 1e-6)
    throw RecipeError(fmt::format(
        "coverage.last_fraction_bf16 = {} has more than 6 decimal digits; give at most 6",
        fraction));
  if (layers <= 0) return 0;
  return int((ppm * layers + 999999) / 1000000);  // exact ceil(ppm * layers / 1e6)
}

void validate(const Recipe& r) {
  const std::string where = "recipe '" + r.name + "': ";
  if (r.name.empty()) throw RecipeError("a recipe needs a non-empty name");
  validate_linear(r.linear, where);
  for (const auto& [c, s] : r.modules)
    validate_linear(s, where + "modules." + std::string(module_class_name(c)) + ".");
  const Coverage& cv = r.coverage;
  try {
    bf16_tail_layers(cv.last_fraction_bf16, 1);
  } catch (const RecipeError& e) {
    throw RecipeError(where + e.what());
  }
  if (cv.first_n_bf16 < 0 || cv.last_n_bf16 < 0)
    throw RecipeError(where + "coverage.first_n_bf16 and last_n_bf16 must be >= 0");
  for (int l : cv.exclude_layers)
    if (l < 0) throw RecipeError(where + fmt::format("coverage.exclude_layers has {} (< 0)", l));
  for (size_t i = 0; i < cv.overrides.size(); ++i) {
    const PatternOverride& o = cv.overrides[i];
    const std::string ow = where + fmt::format("coverage.overrides[{}]", i);
    if (o.pattern.empty()) throw RecipeError(ow + ": pattern is empty");
    if (o.bf16 && !o.patch.empty())
      throw RecipeError(ow + ": a bf16 override takes no fprop/dgrad/wgrad/backward_mode fields");
    if (!o.patch.empty()) validate_linear(linear_from_json(o.patch, r.linear, ow), ow + ".");
  }
}

Format gemm_format(const GemmSpec& g) {
  return format_info(g.a.format).rank <= format_info(g.b.format).rank ? g.a.format : g.b.format;
}

}  // namespace lockstep
