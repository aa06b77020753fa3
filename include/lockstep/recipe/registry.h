// The registry of named recipes (built from the same JSON schema as recipe files, so every
// built-in round-trips through a file exactly), "extends" resolution, name suggestions, and the
// capabilities a recipe needs (for `lockstep doctor`).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lockstep/recipe/recipe.h"

namespace lockstep {

struct RecipeInfo {
  std::string name;
  std::string purpose;
  std::string extends;  // the built-in it is written as a change of ("" for none)
  Json source;          // its registry entry as written (with "extends")
  Recipe recipe;        // resolved, flattened, validated
};

// All built-ins, in registry order. Built once, on first use.
const std::vector<RecipeInfo>& builtin_recipes();
const RecipeInfo* find_builtin_recipe(std::string_view name);
// Throws RecipeError "unknown recipe 'X' (from WHERE); closest: a, b, c; `lockstep recipes`
// lists all" when `name` is not a built-in.
const RecipeInfo& builtin_recipe_or_throw(std::string_view name, std::string_view where);
// Built-in names ordered by edit distance to `name` (substring matches first), at most `max`.
std::vector<std::string> closest_recipe_names(std::string_view name, size_t max = 3);

// Resolves "extends" (a built-in name) by merging `j` onto the base's flattened JSON
// (RFC 7386 merge patch: objects merge key by key, arrays and scalars replace), then parses and
// validates. `default_name` names the recipe when `j` has no "name".
Recipe resolve_recipe_json(const Json& j, const std::string& where,
                           const std::string& default_name);

// One-line summaries for `lockstep recipes`.
std::string forward_summary(const Recipe& r);
std::string backward_summary(const Recipe& r);
std::string coverage_summary(const Recipe& r);

// What running the recipe needs, as capability ids: "quantize:nvfp4/per_row",
// "quantize:nvfp4/per_group/2d", "round:stochastic", "transform:hadamard16",
// "gemm:nvfp4xnvfp4", ... (sorted, unique; modules a recipe can never quantize are ignored).
std::vector<std::string> recipe_requirements(const Recipe& r);

}  // namespace lockstep
