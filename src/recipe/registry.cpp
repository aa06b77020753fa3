// The built-in recipes, written in the recipe-file schema (one table, parsed once), plus
// "extends" resolution, closest-name suggestions, summaries and derived requirements.
#include "lockstep/recipe/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace lockstep {
namespace {

// The table: exactly the recipe-file schema (docs/recipes.md); "extends" may name an earlier row.
constexpr std::string_view kRegistryJson = R"JSON([
{"name": "bf16", "purpose": "Reference: every GEMM in bf16 with fp32 accumulation.",
 "fprop": {"activation": {"format": "bf16"}, "weight": {"format": "bf16"}},
 "backward_mode": "high_precision", "coverage": {"scope": "all_linear"}},

{"name": "fp8_per_tensor",
 "purpose": "FP8 with one fp32 scale per tensor; E4M3 forward, E5M2 gradients (TE hybrid).",
 "fprop": {"activation": {"format": "fp8", "scaling": "per_tensor"},
           "weight": {"format": "fp8", "scaling": "per_tensor"}},
 "dgrad": {"grad_output": {"format": "fp8", "scaling": "per_tensor", "elem": "e5m2"},
           "weight": {"format": "fp8", "scaling": "per_tensor"}},
 "wgrad": {"grad_output": {"format": "fp8", "scaling": "per_tensor", "elem": "e5m2"},
           "activation": {"format": "fp8", "scaling": "per_tensor"}},
 "backward_mode": "quantized", "coverage": {"scope": "all_linear"}},

{"name": "fp8_block",
 "purpose": "DeepSeek-V3 style FP8: 1x128 activation/gradient and 128x128 weight blocks, the Hopper route.",
 "fprop": {"activation": {"format": "fp8", "scaling": "block_1x128", "pow2": true},
           "weight": {"format": "fp8", "scaling": "block_128x128", "pow2": true}},
 "dgrad": {"grad_output": {"format": "fp8", "scaling": "block_1x128", "pow2": true},
           "weight": {"format": "fp8", "scaling": "block_128x128", "pow2": true}},
 "wgrad": {"grad_output": {"format": "fp8", "scaling": "block_1x128", "pow2": true},
           "activation": {"format": "fp8", "scaling": "block_1x128", "pow2": true}},
 "backward_mode": "quantized", "coverage": {"scope": "all_linear"}},

{"name": "mxfp8", "purpose": "MXFP8 (E4M3, 32-element blocks, E8M0 scales) for every operand.",
 "fprop": {"activation": {"format": "mxfp8"}, "weight": {"format": "mxfp8"}},
 "dgrad": {"grad_output": {"format": "mxfp8"}, "weight": {"format": "mxfp8"}},
 "wgrad": {"grad_output": {"format": "mxfp8"}, "activation": {"format": "mxfp8"}},
 "backward_mode": "quantized", "coverage": {"scope": "all_linear"}},

{"name": "nvfp4_per_token",
 "purpose": "NVFP4 experts with per-token activation and per-row weight amax, MXFP8 backward.",
 "fprop": {"activation": {"format": "nvfp4", "scaling": "per_row"},
           "weight": {"format": "nvfp4", "scaling": "per_row"}},
 "dgrad": {"grad_output": {"format": "mxfp8"}, "weight": {"format": "mxfp8"}},
 "wgrad": {"grad_output": {"format": "mxfp8"}, "activation": {"format": "mxfp8"}},
 "backward_mode": "quantized",
 "coverage": {"scope": "experts", "last_fraction_bf16": 0.15, "shared_experts_bf16": true}},

{"name": "nvfp4_per_token_bf16_bwd", "extends": "nvfp4_per_token",
 "purpose": "nvfp4_per_token forward; backward GEMMs on the saved original bf16 operands.",
 "backward_mode": "high_precision"},

{"name": "nvfp4_per_token_dequant_bwd", "extends": "nvfp4_per_token",
 "purpose": "nvfp4_per_token forward; backward GEMMs on bf16 rebuilt from the forward's NVFP4 values.",
 "backward_mode": "dequantized"},

{"name": "nvfp4_per_token_w_per_tensor", "extends": "nvfp4_per_token",
 "purpose": "nvfp4_per_token with one weight amax per expert instead of per row.",
 "fprop": {"weight": {"scaling": "per_group"}}},

{"name": "nvfp4_per_tensor", "extends": "nvfp4_per_token",
 "purpose": "NVFP4 with batch-dependent per-tensor activation amax; kept for comparison.",
 "fprop": {"activation": {"scaling": "per_tensor"}, "weight": {"scaling": "per_group"}}},

{"name": "nvfp4_block",
 "purpose": "NVFP4 everywhere: 16x16 weight blocks, stochastic rounding on gradients, Hadamard on wgrad.",
 "fprop": {"activation": {"format": "nvfp4", "scaling": "per_tensor"},
           "weight": {"format": "nvfp4", "scaling": "per_group", "block2d": true}},
 "dgrad": {"grad_output": {"format": "nvfp4", "scaling": "per_tensor", "stochastic": true},
           "weight": {"format": "nvfp4", "scaling": "per_group", "block2d": true}},
 "wgrad": {"grad_output": {"format": "nvfp4", "scaling": "per_tensor", "stochastic": true, "hadamard": true},
           "activation": {"format": "nvfp4", "scaling": "per_tensor", "hadamard": true}},
 "backward_mode": "quantized",
 "coverage": {"scope": "experts", "last_fraction_bf16": 0.15, "shared_experts_bf16": true}},

{"name": "w4a16_nvfp4",
 "purpose": "Weight-only NVFP4 (per-row amax), bf16 activations; backward on the dequantized weights.",
 "fprop": {"activation": {"format": "bf16"}, "weight": {"format": "nvfp4", "scaling": "per_row"}},
 "backward_mode": "dequantized",
 "coverage": {"scope": "experts", "last_fraction_bf16": 0.15, "shared_experts_bf16": true}},

{"name": "w4a8_nvfp4_mxfp8",
 "purpose": "NVFP4 weights (per-row amax) with MXFP8 activations; MXFP8 backward.",
 "fprop": {"activation": {"format": "mxfp8"}, "weight": {"format": "nvfp4", "scaling": "per_row"}},
 "dgrad": {"grad_output": {"format": "mxfp8"}, "weight": {"format": "mxfp8"}},
 "wgrad": {"grad_output": {"format": "mxfp8"}, "activation": {"format": "mxfp8"}},
 "backward_mode": "quantized",
 "coverage": {"scope": "experts", "last_fraction_bf16": 0.15, "shared_experts_bf16": true}}
])JSON";
constexpr size_t kBuiltinCount = 12;

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// In a patch, an operand object that names a "format" replaces the base operand instead of
// merging into it (a new format starts from that format's defaults, never from stale fields).
void drop_replaced_operands(Json& base, const Json& patch) {
  for (const char* g : {"fprop", "dgrad", "wgrad"}) {
    if (!patch.contains(g) || !patch[g].is_object() || !base.contains(g)) continue;
    for (const auto& [k, v] : patch[g].items())
      if (v.is_object() && v.contains("format") && base[g].contains(k)) base[g].erase(k);
  }
  if (patch.contains("modules") && patch["modules"].is_object() && base.contains("modules"))
    for (const auto& [k, v] : patch["modules"].items())
      if (base["modules"].contains(k)) drop_replaced_operands(base["modules"][k], v);
}

std::vector<RecipeInfo> build_registry() {
  const Json all = Json::parse(kRegistryJson);
  std::vector<RecipeInfo> out;
  out.reserve(all.size());
  for (const Json& entry : all) {
    RecipeInfo info;
    info.name = entry.at("name").get<std::string>();
    info.purpose = entry.value("purpose", "");
    info.extends = entry.value("extends", "");
    info.source = entry;
    if (!info.extends.empty()) {
      auto base = std::find_if(out.begin(), out.end(),
                               [&](const RecipeInfo& r) { return r.name == info.extends; });
      if (base == out.end())
        throw std::logic_error("built-in recipe " + info.name + " extends a later or unknown one");
      Json merged = to_json(base->recipe);
      Json patch = entry;
      patch.erase("extends");
      drop_replaced_operands(merged, patch);
      merged.merge_patch(patch);
      info.recipe = recipe_from_json(merged, "built-in recipe '" + info.name + "'");
    } else {
      info.recipe = recipe_from_json(entry, "built-in recipe '" + info.name + "'");
    }
    out.push_back(std::move(info));
  }
  if (out.size() != kBuiltinCount) throw std::logic_error("built-in recipe table size changed");
  return out;
}

std::string operand_summary(const QuantSpec& op) {
  if (op.format == Format::kBf16) return "bf16";
  std::string s = fmt::format("{} {}", format_name(op.format), scaling_name(op.scaling));
  if (op.elem == ElemCodec::kE5M2) s += " e5m2";
  if (op.block2d) s += " 2d";
  if (op.pow2) s += " pow2";
  if (op.eps != 0.0f) s += fmt::format(" eps={}", op.eps);
  if (op.stochastic) s += " sr";
  if (op.hadamard) s += " rht";
  return s;
}

}  // namespace

const std::vector<RecipeInfo>& builtin_recipes() {
  static const std::vector<RecipeInfo> registry = build_registry();
  return registry;
}

const RecipeInfo* find_builtin_recipe(std::string_view name) {
  for (const auto& r : builtin_recipes())
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<std::string> closest_recipe_names(std::string_view name, size_t max) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& r : builtin_recipes()) {
    const bool sub = !name.empty() && (r.name.find(name) != std::string::npos ||
                                       name.find(r.name) != std::string::npos);
    scored.emplace_back(sub ? 0 : 1 + edit_distance(name, r.name), r.name);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && out.size() < max; ++i) out.push_back(scored[i].second);
  return out;
}

const RecipeInfo& builtin_recipe_or_throw(std::string_view name, std::string_view where) {
  if (const RecipeInfo* r = find_builtin_recipe(name)) return *r;
  std::string close;
  for (const auto& n : closest_recipe_names(name)) close += (close.empty() ? "" : ", ") + n;
  throw RecipeError(fmt::format(
      "unknown recipe '{}' ({}); closest: {}; `lockstep recipes` lists all", name, where, close));
}

Recipe resolve_recipe_json(const Json& j, const std::string& where,
                           const std::string& default_name) {
  if (!j.is_object())
    throw RecipeError(where + ": a recipe must be a JSON object, got " + j.type_name());
  Json flat = j;
  if (j.contains("extends")) {
    if (!j["extends"].is_string()) throw RecipeError(where + ".extends: expected a recipe name");
    const std::string base = j["extends"].get<std::string>();
    Json merged = to_json(builtin_recipe_or_throw(base, where + ".extends").recipe);
    flat.erase("extends");
    drop_replaced_operands(merged, flat);
    merged.merge_patch(flat);
    flat = std::move(merged);
    // merge_patch keeps the base's name when the file gives none: name it after the file.
    if (!j.contains("name")) flat["name"] = default_name;
  } else if (!flat.contains("name")) {
    flat["name"] = default_name;
  }
  return recipe_from_json(flat, where);
}

std::string forward_summary(const Recipe& r) {
  const GemmSpec& f = r.linear[Gemm::kFprop];
  if (gemm_format(f) == Format::kBf16 && r.modules.empty()) return "bf16";
  return fmt::format("x {}, w {}", operand_summary(f.a), operand_summary(f.b));
}

std::string backward_summary(const Recipe& r) {
  const LinearSpec& s = r.linear;
  switch (s.backward_mode) {
    case BackwardMode::kHighPrecision:
      return "bf16 on saved bf16 operands (high_precision)";
    case BackwardMode::kDequantized:
      return "bf16 on operands dequantized from the forward (dequantized)";
    default:
      break;
  }
  const GemmSpec& d = s[Gemm::kDgrad];
  const GemmSpec& w = s[Gemm::kWgrad];
  return fmt::format("dgrad dy {}, w {}; wgrad dy {}, x {}", operand_summary(d.a),
                     operand_summary(d.b), operand_summary(w.a), operand_summary(w.b));
}

std::string coverage_summary(const Recipe& r) {
  const Coverage& c = r.coverage;
  std::string s(scope_name(c.scope));
  if (c.last_fraction_bf16 > 0)
    s += fmt::format("; last {:g}% layers bf16", c.last_fraction_bf16 * 100);
  if (c.first_n_bf16 > 0) s += fmt::format("; first {} layers bf16", c.first_n_bf16);
  if (c.last_n_bf16 > 0) s += fmt::format("; last {} layers bf16", c.last_n_bf16);
  if (c.shared_experts_bf16) s += "; shared experts bf16";
  if (!c.exclude_layers.empty()) s += fmt::format("; {} excluded layers", c.exclude_layers.size());
  if (!c.overrides.empty()) s += fmt::format("; {} pattern overrides", c.overrides.size());
  return s;
}

std::vector<std::string> recipe_requirements(const Recipe& r) {
  std::set<std::string> req;
  auto add_linear = [&](const LinearSpec& s) {
    for (size_t g = 0; g < size_t(Gemm::kCount); ++g) {
      const GemmSpec& gs = s.gemm[g];
      const bool uses_bf16_backward = g != 0 && s.backward_mode != BackwardMode::kQuantized;
      const GemmSpec eff = uses_bf16_backward ? GemmSpec{} : gs;
      req.insert(fmt::format("gemm:{}x{}", format_name(eff.a.format), format_name(eff.b.format)));
      for (const QuantSpec* op : {&eff.a, &eff.b}) {
        if (op->format == Format::kBf16) continue;
        req.insert(fmt::format("quantize:{}/{}{}", format_name(op->format),
                               scaling_name(op->scaling), op->block2d ? "/2d" : ""));
        if (op->stochastic) req.insert("round:stochastic");
        if (op->hadamard) req.insert("transform:hadamard16");
      }
    }
    if (s.backward_mode == BackwardMode::kDequantized) req.insert("dequantize:saved_operands");
  };
  add_linear(r.linear);
  for (const auto& [c, s] : r.modules) add_linear(s);
  for (const auto& o : r.coverage.overrides)
    if (!o.patch.empty()) add_linear(linear_from_json(o.patch, r.linear, "override"));
  return {req.begin(), req.end()};
}

}  // namespace lockstep
