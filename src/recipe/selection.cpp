// Recipe selection with one precedence (code > file > flag > environment > default), recipe
// files, the DISABLE_BACKWARD_QUANT alias, and the provenance record of each choice.
#include "lockstep/recipe/selection.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/file_io.h"

namespace lockstep {
namespace {

std::optional<std::string> getenv_opt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace

std::string_view recipe_source_name(RecipeSource s) {
  switch (s) {
    case RecipeSource::kCode:
      return "code";
    case RecipeSource::kFile:
      return "file";
    case RecipeSource::kFlag:
      return "flag";
    case RecipeSource::kEnv:
      return "env";
    default:
      return "default";
  }
}

void SelectionInputs::read_environment() {
  env_recipe = getenv_opt(kRecipeEnvVar);
  env_disable_backward_quant = getenv_opt(kDisableBackwardQuantEnvVar);
}

Recipe parse_recipe_text(std::string_view text, const std::string& where,
                         const std::string& default_name, RecipeProvenance* prov) {
  // The schema nests 6 levels deep; refusing far deeper input keeps the recursive parts of the
  // JSON library (printing a value in an error message, destruction) off deep recursion.
  constexpr int kMaxDepth = 64;
  auto depth_limit = [&](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxDepth)
      throw RecipeError(
          fmt::format("recipe file '{}' nests JSON deeper than {} levels", where, kMaxDepth));
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), depth_limit);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for 1e999
    throw RecipeError(fmt::format("recipe file '{}' is not valid JSON: {}", where, e.what()));
  }
  Recipe r = resolve_recipe_json(j, where, default_name);
  if (prov != nullptr) {
    prov->extends = j.is_object() ? j.value("extends", "") : "";
    prov->fields_from_file.clear();
    for (const auto& [k, v] : j.items()) prov->fields_from_file.push_back(k);
  }
  return r;
}

Recipe load_recipe_file(const std::string& path, RecipeProvenance* prov) {
  std::string text;
  try {
    text = read_input_file(path);  // regular files only: a FIFO or device is refused
  } catch (const InputPathError& e) {
    throw RecipeError(fmt::format("cannot read recipe file '{}' ({})", path, e.what()));
  }
  return parse_recipe_text(text, path, std::filesystem::path(path).stem().string(), prov);
}

void force_high_precision_backward(Recipe& r) {
  r.linear.backward_mode = BackwardMode::kHighPrecision;
  for (auto& [c, s] : r.modules) s.backward_mode = BackwardMode::kHighPrecision;
  for (auto& o : r.coverage.overrides)
    if (o.patch.contains("backward_mode")) o.patch["backward_mode"] = "high_precision";
}

SelectedRecipe select_recipe(const SelectionInputs& in) {
  const bool has_file = in.recipe_file.has_value();
  const bool has_name = in.recipe_name.has_value();
  if (has_file && has_name)
    throw RecipeError(fmt::format(
        "--recipe {} and --recipe-file {} both given; use one (a recipe file can build on a named "
        "recipe with \"extends\": \"{}\")",
        *in.recipe_name, *in.recipe_file, *in.recipe_name));
  const bool has_env = in.env_recipe.has_value() && !in.env_recipe->empty();

  SelectedRecipe out;
  RecipeProvenance& p = out.provenance;
  auto shadow = [&](bool present, const std::string& what, const char* by) {
    if (present) p.shadowed.push_back(fmt::format("{} ignored: {} takes precedence", what, by));
  };
  const std::string env_desc = has_env ? fmt::format("{}={}", kRecipeEnvVar, *in.env_recipe) : "";
  if (in.code_recipe) {
    validate(*in.code_recipe);
    out.recipe = *in.code_recipe;
    p.source = RecipeSource::kCode;
    p.detail = "recipe given in code";
    shadow(has_file, "--recipe-file " + in.recipe_file.value_or(""), "the recipe given in code");
    shadow(has_name, "--recipe " + in.recipe_name.value_or(""), "the recipe given in code");
    shadow(has_env, env_desc, "the recipe given in code");
  } else if (has_file) {
    out.recipe = load_recipe_file(*in.recipe_file, &p);
    p.source = RecipeSource::kFile;
    p.detail = *in.recipe_file;
    shadow(has_env, env_desc, "--recipe-file");
  } else if (has_name) {
    out.recipe = builtin_recipe_or_throw(*in.recipe_name, "--recipe").recipe;
    p.source = RecipeSource::kFlag;
    p.detail = "--recipe " + *in.recipe_name;
    shadow(has_env, env_desc, "--recipe");
  } else if (has_env) {
    out.recipe = builtin_recipe_or_throw(*in.env_recipe, env_desc).recipe;
    p.source = RecipeSource::kEnv;
    p.detail = env_desc;
  } else {
    out.recipe = builtin_recipe_or_throw(kDefaultRecipe, "default").recipe;
    p.source = RecipeSource::kDefault;
    p.detail = "default";
  }
  p.backward_mode_source = "recipe";

  const std::string dbq = in.env_disable_backward_quant.value_or("");
  if (dbq == "1") {
    force_high_precision_backward(out.recipe);
    p.backward_mode_source = fmt::format("env {}=1 (alias of backward_mode high_precision)",
                                         kDisableBackwardQuantEnvVar);
  } else if (dbq != "" && dbq != "0") {
    throw RecipeError(fmt::format("{}={}: expected 0 or 1", kDisableBackwardQuantEnvVar, dbq));
  }
  return out;
}

Json provenance_json(const RecipeProvenance& p) {
  Json j;
  j["source"] = recipe_source_name(p.source);
  j["detail"] = p.detail;
  if (!p.extends.empty()) j["extends"] = p.extends;
  if (p.source == RecipeSource::kFile) j["fields_from_file"] = p.fields_from_file;
  j["backward_mode_source"] = p.backward_mode_source;
  j["shadowed"] = p.shadowed;
  return j;
}

}  // namespace lockstep
