// Precision recipes: for every linear module class, which format each operand of each GEMM
// (fprop, dgrad, wgrad) uses, how the backward pass gets its operands, and which layers are
// covered. One JSON schema serves the built-in registry and user recipe files (docs/recipes.md).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/quant/format.h"
#include "lockstep/recipe/json.h"

namespace lockstep {

// A recipe or recipe-selection error the user can fix; the message names the recipe, the field
// path (e.g. "dgrad.grad_output.pow2") and the rule broken. The CLI maps it to exit code 2.
class RecipeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// ---- registries (one row per enumerator; static_asserts in recipe.cpp keep them in order) ----

enum class Gemm : uint8_t { kFprop, kDgrad, kWgrad, kCount };

// Backward modes (docs/recipes.md "Backward modes").
enum class BackwardMode : uint8_t {
  kQuantized,      // dgrad / wgrad use the recipe's backward operand formats
  kHighPrecision,  // dgrad / wgrad use the saved original bf16 operands
  kDequantized,  // dgrad / wgrad use bf16 operands rebuilt exactly from the fprop's quantized ones
  kCount,
};

// The linear module classes of one transformer layer, plus the LM head.
enum class ModuleClass : uint8_t {
  kQkv,
  kAttnOut,
  kRouter,
  kExpertsFc1,  // routed experts: gate+up
  kExpertsFc2,  // routed experts: down
  kSharedFc1,   // shared expert: gate+up
  kSharedFc2,   // shared expert: down
  kLmHead,
  kCount,
};

enum class CoverageScope : uint8_t {
  kExperts,    // routed MoE experts only (experts_fc1, experts_fc2)
  kAllLinear,  // qkv, attn_out, routed and shared experts; never router or lm_head
  kCount,
};

std::string_view gemm_name(Gemm g);
std::string_view backward_mode_name(BackwardMode m);
std::string_view module_class_name(ModuleClass c);
std::string_view scope_name(CoverageScope s);
std::optional<BackwardMode> backward_mode_from_name(std::string_view n);
std::optional<ModuleClass> module_class_from_name(std::string_view n);
std::optional<CoverageScope> scope_from_name(std::string_view n);
// The two operand names of a GEMM: fprop {activation, weight}, dgrad {grad_output, weight},
// wgrad {grad_output, activation}. The first is the left operand (rows = tokens or out features).
std::array<std::string_view, 2> gemm_operand_names(Gemm g);
// Module classes in describe order: the 7 per-layer classes then lm_head.
inline constexpr int kLayerModuleClasses = 7;

// ---- the recipe --------------------------------------------------------------------------------

// The two operands of one GEMM, each a quantization choice (QuantSpec, quant/format.h; bf16 =
// not quantized). Fields that do not apply to an operand's format keep their defaults.
struct GemmSpec {
  QuantSpec a;  // left operand (see gemm_operand_names)
  QuantSpec b;  // right operand
  bool operator==(const GemmSpec&) const = default;
};

// How one linear module runs: its three GEMMs and its backward mode.
struct LinearSpec {
  std::array<GemmSpec, size_t(Gemm::kCount)> gemm{};
  BackwardMode backward_mode = BackwardMode::kQuantized;
  const GemmSpec& operator[](Gemm g) const { return gemm[size_t(g)]; }
  GemmSpec& operator[](Gemm g) { return gemm[size_t(g)]; }
  bool operator==(const LinearSpec&) const = default;
};

// A module-path pattern rule, applied after the coverage rules; the last matching one wins.
// Paths are "layers.<i>.<class>" and "lm_head"; '*' matches any run of characters, '?' one.
struct PatternOverride {
  std::string pattern;
  bool bf16 = true;  // true: keep the module bf16; false: quantize it with the class's spec
  Json patch;        // when quantized: fprop/dgrad/wgrad/backward_mode fields merged onto it
  bool operator==(const PatternOverride&) const = default;
};

struct Coverage {
  CoverageScope scope = CoverageScope::kExperts;
  double last_fraction_bf16 = 0.0;  // last ceil(f * layers) layers bf16; at most 6 decimals
  int first_n_bf16 = 0;
  int last_n_bf16 = 0;
  bool shared_experts_bf16 = false;
  std::vector<int> exclude_layers;  // layer numbers kept bf16
  std::vector<PatternOverride> overrides;
  bool operator==(const Coverage&) const = default;
};

struct Recipe {
  std::string name;
  std::string purpose;  // one line
  LinearSpec linear;    // every quantized module class unless `modules` says otherwise
  std::map<ModuleClass, LinearSpec> modules;  // per-class replacements (full specs)
  Coverage coverage;
  bool operator==(const Recipe&) const = default;

  // The spec a quantized module of class `c` uses (before pattern patches).
  const LinearSpec& spec_for(ModuleClass c) const;
};

// Throws RecipeError naming the recipe and field when an operand is not a choice the format
// table allows (quant_spec_violation: scaling, element codec or option the format does not take),
// stochastic rounding on a non-gradient operand, hadamard on one operand of a GEMM only,
// last_fraction_bf16 outside [0, 1] or with more than 6 decimals, negative layer counts.
void validate(const Recipe& r);

// ceil(fraction * layers) computed exactly: the fraction is taken as an integer number of
// millionths (validated), so 0.15 * 20 gives 3, not the 4 that ceil(3.0000000000000004) gives.
int bf16_tail_layers(double fraction, int layers);

// The format a GEMM is reported as: its lowest-precision operand (nvfp4 < mxfp8 < fp8 < bf16).
Format gemm_format(const GemmSpec& g);

// ---- JSON (docs/recipes.md "Schema") -------------------------------------------------------

// Full, flattened content: every field written, no "extends". from_json(to_json(r)) == r.
Json to_json(const Recipe& r);
Json to_json(const LinearSpec& s);
Json to_json(const QuantSpec& op);
// Parses a flattened recipe object ("extends" must already be resolved; see registry.h).
// Unknown keys are errors. `where` prefixes error messages (a file path or recipe name).
Recipe recipe_from_json(const Json& j, const std::string& where);
// Parses fprop/dgrad/wgrad/backward_mode fields of `j` onto `base` (missing fields keep base).
LinearSpec linear_from_json(const Json& j, const LinearSpec& base, const std::string& where);

}  // namespace lockstep
