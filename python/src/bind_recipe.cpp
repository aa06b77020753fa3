// Python bindings of the recipes: the built-in registry, recipe files and JSON, the selection
// precedence (code > file > name > LOCKSTEP_RECIPE > bf16), describe, and the spec one module
// gets. JSON crosses the boundary as text (the Python layer parses it with the json module).
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "bridge.h"
#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/recipe/selection.h"

namespace lockstep::py {
namespace {

std::string recipes_json() {
  Json out = Json::array();
  for (const RecipeInfo& r : builtin_recipes()) {
    Json j;
    j["name"] = r.name;
    j["purpose"] = r.purpose;
    j["extends"] = r.extends.empty() ? Json(nullptr) : Json(r.extends);
    j["forward"] = forward_summary(r.recipe);
    j["backward"] = backward_summary(r.recipe);
    j["backward_mode"] = backward_mode_name(r.recipe.linear.backward_mode);
    j["coverage"] = coverage_summary(r.recipe);
    j["requires"] = recipe_requirements(r.recipe);
    j["recipe"] = to_json(r.recipe);
    out.push_back(std::move(j));
  }
  return out.dump();
}

ModuleClass parse_class(const std::string& s) {
  if (auto c = module_class_from_name(s)) return *c;
  throw ArgError(
      fmt::format("unknown module class '{}' (qkv, attn_out, router, experts_fc1, "
                  "experts_fc2, shared_fc1, shared_fc2, lm_head)",
                  s));
}

// The recipe selected by the library's precedence from what Python passed and the environment.
nb::tuple select_py(std::optional<std::string> name, std::optional<std::string> file) {
  SelectionInputs in;
  in.recipe_name = std::move(name);
  in.recipe_file = std::move(file);
  in.read_environment();
  SelectedRecipe s = select_recipe(in);
  return nb::make_tuple(s.recipe, provenance_json(s.provenance).dump());
}

}  // namespace

// The LinearSpec a module of class `cls` runs with: the recipe's spec for the class (for
// quantized modules when no class is given), or, with layer >= 0, the choice the coverage rules
// make for that layer of a `layers`-layer model (bf16 when the rules keep it bf16).
// The spec is resolved by resolve_module in every case, so the rules a model applies (the bf16
// backward GEMMs of the high_precision and dequantized modes) apply here too; without a layer, a
// code override forces the module quantized with the class's (or the recipe's) spec.
LinearSpec module_spec(const Recipe& r, const std::string& cls, int layer, int layers) {
  const ModuleClass c = cls.empty() ? ModuleClass::kExpertsFc1 : parse_class(cls);
  if (layer >= 0) return resolve_module(r, layer, c, layers).spec;
  const CodeOverride all{"*", cls.empty() ? r.linear : r.spec_for(c)};
  return resolve_module(r, 0, c, 1, std::span<const CodeOverride>(&all, 1)).spec;
}

void bind_recipe(nb::module_& m) {
  nb::class_<Recipe>(m, "Recipe", "A precision recipe (docs/recipes.md)")
      .def_static(
          "from_name",
          [](const std::string& n) {
            return builtin_recipe_or_throw(n, "Recipe.from_name").recipe;
          },
          nb::arg("name"))
      .def_static(
          "from_file", [](const std::string& p) { return load_recipe_file(p); }, nb::arg("path"))
      .def_static(
          "from_json_text",
          [](const std::string& text, const std::string& where, const std::string& name) {
            return parse_recipe_text(text, where, name);
          },
          nb::arg("text"), nb::arg("where") = "<json>", nb::arg("default_name") = "custom")
      .def_static("select", &select_py, nb::arg("name").none() = nb::none(),
                  nb::arg("file").none() = nb::none(),
                  "(recipe, provenance JSON) by the library's precedence, environment included")
      .def_prop_ro("name", [](const Recipe& r) { return r.name; })
      .def_prop_ro("purpose", [](const Recipe& r) { return r.purpose; })
      .def("to_json_text", [](const Recipe& r) { return to_json(r).dump(); })
      .def(
          "describe_json_text",
          [](const Recipe& r, int layers, bool explain) {
            return plan_json(resolve_model(r, layers), explain).dump();
          },
          nb::arg("layers") = 48, nb::arg("explain") = false)
      .def(
          "module_spec_json_text",
          [](const Recipe& r, const std::string& cls, int layer, int layers) {
            return to_json(module_spec(r, cls, layer, layers)).dump();
          },
          nb::arg("module_class") = "", nb::arg("layer") = -1, nb::arg("layers") = 1)
      .def("requirements", [](const Recipe& r) { return recipe_requirements(r); })
      .def("__eq__", [](const Recipe& a, const Recipe& b) { return a == b; });
  m.def("recipes_json_text", &recipes_json, "Every built-in recipe as `lockstep recipes --json`");
  m.def("force_high_precision_backward", [](Recipe r) {
    force_high_precision_backward(r);
    return r;
  });
}

}  // namespace lockstep::py
