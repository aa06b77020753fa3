// Coverage rules: which module of which layer a recipe quantizes, and with what, applied in the
// documented order (scope, layer rules, shared experts, pattern overrides, code overrides).
#include "lockstep/recipe/coverage.h"

#include <fmt/format.h>

#include <algorithm>

namespace lockstep {
namespace {

bool is_routed_expert(ModuleClass c) {
  return c == ModuleClass::kExpertsFc1 || c == ModuleClass::kExpertsFc2;
}
bool is_shared_expert(ModuleClass c) {
  return c == ModuleClass::kSharedFc1 || c == ModuleClass::kSharedFc2;
}

// Why the coverage rules keep (layer, c) in bf16, or "" when they quantize it.
std::string coverage_bf16_reason(const Recipe& r, int layer, ModuleClass c, int layers) {
  const Coverage& cv = r.coverage;
  if (c == ModuleClass::kRouter || c == ModuleClass::kLmHead)
    return "router and lm_head stay bf16 unless an override says otherwise";
  if (cv.scope == CoverageScope::kExperts && !is_routed_expert(c))
    return "coverage.scope experts covers routed experts only";
  if (layer < cv.first_n_bf16)
    return fmt::format("coverage.first_n_bf16 (first {} layers)", cv.first_n_bf16);
  if (layer >= layers - cv.last_n_bf16)
    return fmt::format("coverage.last_n_bf16 (last {} layers)", cv.last_n_bf16);
  const int tail = bf16_tail_layers(cv.last_fraction_bf16, layers);
  if (layer >= layers - tail)
    return fmt::format("coverage.last_fraction_bf16 {} (last {} of {} layers)",
                       cv.last_fraction_bf16, tail, layers);
  if (std::find(cv.exclude_layers.begin(), cv.exclude_layers.end(), layer) !=
      cv.exclude_layers.end())
    return fmt::format("coverage.exclude_layers ({})", layer);
  if (is_shared_expert(c) && cv.shared_experts_bf16) return "coverage.shared_experts_bf16";
  return "";
}

}  // namespace

std::string module_path(int layer, ModuleClass c) {
  if (c == ModuleClass::kLmHead) return "lm_head";
  return fmt::format("layers.{}.{}", layer, module_class_name(c));
}

bool glob_match(std::string_view p, std::string_view t) {
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi, ++ti;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++, mark = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1, ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

ModuleChoice resolve_module(const Recipe& r, int layer, ModuleClass c, int layers,
                            std::span<const CodeOverride> code) {
  if (layers < 1) throw RecipeError(fmt::format("a model needs at least 1 layer, got {}", layers));
  if (layers > kMaxModelLayers)
    throw RecipeError(fmt::format("a model of {} layers is deeper than the {} lockstep plans for",
                                  layers, kMaxModelLayers));
  if (c == ModuleClass::kLmHead) {
    layer = -1;
  } else if (layer < 0 || layer >= layers) {
    throw RecipeError(fmt::format("layer {} is out of range for a {}-layer model", layer, layers));
  }
  ModuleChoice m;
  m.path = module_path(layer, c);
  m.cls = c;
  m.layer = layer;
  LinearSpec spec = r.spec_for(c);
  m.rule = coverage_bf16_reason(r, layer, c, layers);
  m.quantized = m.rule.empty();
  if (m.quantized) m.rule = fmt::format("coverage.scope {}", scope_name(r.coverage.scope));

  for (size_t i = 0; i < r.coverage.overrides.size(); ++i) {
    const PatternOverride& o = r.coverage.overrides[i];
    if (!glob_match(o.pattern, m.path)) continue;
    m.quantized = !o.bf16;
    const std::string where = fmt::format("recipe '{}' coverage.overrides[{}]", r.name, i);
    spec = o.patch.empty() ? r.spec_for(c) : linear_from_json(o.patch, r.spec_for(c), where);
    m.rule = fmt::format("coverage.overrides[{}] '{}' ({})", i, o.pattern,
                         o.bf16 ? "bf16" : "quantized");
  }
  for (const CodeOverride& o : code) {
    if (!glob_match(o.pattern, m.path)) continue;
    m.quantized = o.spec.has_value();
    if (o.spec) spec = *o.spec;
    m.rule = fmt::format("code override '{}'", o.pattern);
  }

  if (!m.quantized) {
    m.spec = LinearSpec{};  // every operand bf16
    m.backward_mode = BackwardMode::kHighPrecision;
  } else {
    m.spec = spec;
    m.backward_mode = spec.backward_mode;
    // Under high_precision and dequantized the backward GEMMs run in bf16; only where the bf16
    // operands come from differs (saved originals vs. rebuilt from the forward's codes).
    if (spec.backward_mode != BackwardMode::kQuantized)
      m.spec[Gemm::kDgrad] = m.spec[Gemm::kWgrad] = GemmSpec{};
  }
  for (size_t g = 0; g < size_t(Gemm::kCount); ++g) m.gemm[g] = gemm_format(m.spec.gemm[g]);
  return m;
}

ModelPlan resolve_model(const Recipe& r, int layers, std::span<const CodeOverride> code) {
  ModelPlan p;
  p.recipe = r.name;
  p.layers = layers;
  p.lm_head = resolve_module(r, -1, ModuleClass::kLmHead, layers, code);
  p.per_layer.resize(size_t(layers));
  for (int l = 0; l < layers; ++l)
    for (int c = 0; c < kLayerModuleClasses; ++c)
      p.per_layer[size_t(l)][size_t(c)] = resolve_module(r, l, ModuleClass(c), layers, code);
  return p;
}

Json choice_json(const ModuleChoice& m, bool explain) {
  Json j;
  for (size_t g = 0; g < size_t(Gemm::kCount); ++g)
    j[std::string(gemm_name(Gemm(g)))] = format_name(m.gemm[g]);
  j["backward_mode"] = backward_mode_name(m.backward_mode);
  if (explain) j["rule"] = m.rule;
  return j;
}

Json plan_json(const ModelPlan& p, bool explain) {
  Json j;
  j["recipe"] = p.recipe;
  j["layers"] = Json::array();
  for (int l = 0; l < p.layers; ++l) {
    Json lj;
    lj["layer"] = l;
    lj["modules"] = Json::object();
    for (const ModuleChoice& m : p.per_layer[size_t(l)])
      lj["modules"][std::string(module_class_name(m.cls))] = choice_json(m, explain);
    j["layers"].push_back(std::move(lj));
  }
  j["lm_head"] = choice_json(p.lm_head, explain);
  return j;
}

}  // namespace lockstep
