// Choosing the recipe of a run, with one precedence (docs/recipes.md "Selection"):
//   recipe given in code > --recipe-file FILE.json > --recipe NAME > LOCKSTEP_RECIPE > "bf16",
// plus DISABLE_BACKWARD_QUANT=1 (alias of the high_precision backward mode), and the provenance
// of every choice, which run_meta.json records.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lockstep/recipe/recipe.h"

namespace lockstep {

enum class RecipeSource : uint8_t { kCode, kFile, kFlag, kEnv, kDefault };
std::string_view recipe_source_name(RecipeSource s);  // "code", "file", "flag", "env", "default"

inline constexpr const char* kRecipeEnvVar = "LOCKSTEP_RECIPE";
inline constexpr const char* kDisableBackwardQuantEnvVar = "DISABLE_BACKWARD_QUANT";
inline constexpr const char* kDefaultRecipe = "bf16";

struct SelectionInputs {
  std::optional<Recipe> code_recipe;                      // a Recipe object passed by a C++ caller
  std::optional<std::string> recipe_file;                 // --recipe-file
  std::optional<std::string> recipe_name;                 // --recipe
  std::optional<std::string> env_recipe;                  // LOCKSTEP_RECIPE (empty counts as unset)
  std::optional<std::string> env_disable_backward_quant;  // DISABLE_BACKWARD_QUANT

  // Fills the two environment fields from the process environment (flags are left as they are).
  void read_environment();
};

struct RecipeProvenance {
  RecipeSource source = RecipeSource::kDefault;
  std::string detail;                         // "--recipe nvfp4_per_token", "LOCKSTEP_RECIPE=...",
                                              // the file path, "default"
  std::string extends;                        // a file's base recipe, if any
  std::vector<std::string> fields_from_file;  // top-level keys the file set itself
  std::string backward_mode_source;           // "recipe", or "env DISABLE_BACKWARD_QUANT=1 ..."
  std::vector<std::string> shadowed;          // lower-precedence inputs that were ignored
};

struct SelectedRecipe {
  Recipe recipe;
  RecipeProvenance provenance;
};

// Throws RecipeError when both a file and a name are given, on an unknown name (listing the
// closest names), on an unreadable or invalid file, and on a DISABLE_BACKWARD_QUANT value other
// than 0 or 1.
SelectedRecipe select_recipe(const SelectionInputs& in);

// Reads a recipe file (same schema as the built-ins; "extends" names a built-in). A file without
// "name" is named after its stem. Fills prov->extends and prov->fields_from_file when given.
Recipe load_recipe_file(const std::string& path, RecipeProvenance* prov = nullptr);
// The text of a recipe file, parsed and validated as load_recipe_file does; `where` names it in
// messages, `default_name` is the name when the text gives none. Throws RecipeError only.
Recipe parse_recipe_text(std::string_view text, const std::string& where,
                         const std::string& default_name, RecipeProvenance* prov = nullptr);

// Sets every backward mode in the recipe (top level, per class, pattern patches) to high_precision.
void force_high_precision_backward(Recipe& r);

Json provenance_json(const RecipeProvenance& p);

// Adds --recipe and --recipe-file to a CLI11 subcommand (any type with add_option); use with
// SelectionInputs::read_environment() and select_recipe() inside the callback.
template <class App>
void add_recipe_options(App& app, SelectionInputs& in) {
  app.add_option(
      "--recipe", in.recipe_name,
      "named recipe (`lockstep recipes` lists them); default: $LOCKSTEP_RECIPE, then bf16");
  app.add_option("--recipe-file", in.recipe_file,
                 "recipe JSON file (same schema as the built-ins, may \"extends\" one); "
                 "not together with --recipe");
}

}  // namespace lockstep
