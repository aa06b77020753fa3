// Applying a recipe to a model: for every layer and module class, which formats its GEMMs use,
// its backward mode, and the rule that decided it (scope, layer rules, pattern overrides, code).
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/recipe/recipe.h"

namespace lockstep {

// Explicit per-module parameters given in code: the highest precedence of all. A nullopt spec
// keeps the matching modules bf16.
struct CodeOverride {
  std::string pattern;  // glob over module paths, as in PatternOverride
  std::optional<LinearSpec> spec;
};

struct ModuleChoice {
  std::string path;  // "layers.12.experts_fc1", "lm_head"
  ModuleClass cls = ModuleClass::kQkv;
  int layer = -1;  // -1 for lm_head
  bool quantized = false;
  // The operands each GEMM really uses: all bf16 when not quantized; dgrad / wgrad bf16 when
  // the backward mode is high_precision or dequantized (the bf16 values' origin differs).
  LinearSpec spec;
  std::array<Format, size_t(Gemm::kCount)> gemm{};  // gemm_format of each
  BackwardMode backward_mode = BackwardMode::kHighPrecision;
  std::string rule;  // why, e.g. "coverage.last_fraction_bf16 (last 3 of 20 layers)"
};

struct ModelPlan {
  std::string recipe;
  int layers = 0;
  std::vector<std::array<ModuleChoice, kLayerModuleClasses>> per_layer;
  ModuleChoice lm_head;
};

// The deepest model a plan is made for. Real language models have at most a few hundred layers
// (Qwen3-235B 94, Llama-3.1-405B 126); 1024 leaves room while bounding describe's memory and time
// (about 1 MB and well under a second).
inline constexpr int kMaxModelLayers = 1024;

// "layers.<layer>.<class>", or "lm_head" for ModuleClass::kLmHead.
std::string module_path(int layer, ModuleClass c);
// Whole-string glob: '*' any run of characters (dots included), '?' one character.
bool glob_match(std::string_view pattern, std::string_view text);

// Rule order (later wins): scope -> layer rules (first_n, last_n, last_fraction, exclude_layers)
// -> shared_experts_bf16 -> recipe pattern overrides (last match wins) -> code overrides.
// Throws RecipeError when layers is outside [1, kMaxModelLayers] or layer is out of range.
ModuleChoice resolve_module(const Recipe& r, int layer, ModuleClass c, int layers,
                            std::span<const CodeOverride> code = {});
ModelPlan resolve_model(const Recipe& r, int layers, std::span<const CodeOverride> code = {});

// {"fprop": F, "dgrad": F, "wgrad": F, "backward_mode": M} (+ "rule" when explain).
Json choice_json(const ModuleChoice& m, bool explain = false);
// {"recipe", "layers": [{"layer", "modules": {...}}], "lm_head"} (the describe --json schema).
Json plan_json(const ModelPlan& p, bool explain = false);

}  // namespace lockstep
