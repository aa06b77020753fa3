// `lockstep recipes` (the registry) and `lockstep describe` (a recipe resolved onto every layer
// and module of a model): thin printing layers over recipe/registry.h and recipe/coverage.h.
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "commands.h"
#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/recipe/selection.h"

namespace lockstep::cli {
namespace {

// Default model depth for describe: the 48 layers of Qwen3-30B-A3B.
constexpr int kDefaultDescribeLayers = 48;

void run_recipes(bool json) {
  if (json) {
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
    fmt::print("{}\n", out.dump(2));
    return;
  }
  size_t w = 0;
  for (const RecipeInfo& r : builtin_recipes()) w = std::max(w, r.name.size());
  for (const RecipeInfo& r : builtin_recipes()) {
    fmt::print("{:<{}}  {}\n", r.name, w, r.purpose);
    fmt::print("{:<{}}  forward:  {}\n", "", w, forward_summary(r.recipe));
    fmt::print("{:<{}}  backward: {}\n", "", w, backward_summary(r.recipe));
    fmt::print("{:<{}}  coverage: {}{}\n", "", w, coverage_summary(r.recipe),
               r.extends.empty() ? "" : "; extends " + r.extends);
  }
  fmt::print("\nSelect with --recipe NAME, --recipe-file FILE.json or {}; default {}.\n",
             kRecipeEnvVar, kDefaultRecipe);
}

std::string_view mode_abbrev(BackwardMode m) {
  switch (m) {
    case BackwardMode::kQuantized:
      return "q";
    case BackwardMode::kHighPrecision:
      return "hp";
    default:
      return "dq";
  }
}

std::string cell(const ModuleChoice& m) {
  return fmt::format("{}/{}/{} {}", format_name(m.gemm[0]), format_name(m.gemm[1]),
                     format_name(m.gemm[2]), mode_abbrev(m.backward_mode));
}

void print_plan_text(const SelectedRecipe& sel, const ModelPlan& plan, bool explain) {
  fmt::print("recipe {} (from {}: {}), {} layers\n", sel.recipe.name,
             recipe_source_name(sel.provenance.source), sel.provenance.detail, plan.layers);
  fmt::print("backward_mode {} (from {})\n", backward_mode_name(sel.recipe.linear.backward_mode),
             sel.provenance.backward_mode_source);
  for (const auto& s : sel.provenance.shadowed) fmt::print("note: {}\n", s);
  fmt::print(
      "cells: fprop/dgrad/wgrad format, backward mode (q quantized, hp high_precision, "
      "dq dequantized)\n\n");
  // Rows: runs of consecutive layers whose modules all resolve the same way.
  std::vector<std::string> header{"layers"};
  for (int c = 0; c < kLayerModuleClasses; ++c)
    header.emplace_back(module_class_name(ModuleClass(c)));
  std::vector<std::vector<std::string>> rows;
  int start = 0;
  for (int l = 1; l <= plan.layers; ++l) {
    auto same = [&](int a, int b) {
      for (int c = 0; c < kLayerModuleClasses; ++c)
        if (cell(plan.per_layer[size_t(a)][size_t(c)]) !=
                cell(plan.per_layer[size_t(b)][size_t(c)]) ||
            (explain && plan.per_layer[size_t(a)][size_t(c)].rule !=
                            plan.per_layer[size_t(b)][size_t(c)].rule))
          return false;
      return true;
    };
    if (l < plan.layers && same(start, l)) continue;
    std::vector<std::string> row{start == l - 1 ? fmt::format("{}", start)
                                                : fmt::format("{}-{}", start, l - 1)};
    for (int c = 0; c < kLayerModuleClasses; ++c)
      row.push_back(cell(plan.per_layer[size_t(start)][size_t(c)]));
    rows.push_back(std::move(row));
    start = l;
  }
  std::vector<size_t> w(header.size());
  for (size_t i = 0; i < header.size(); ++i) {
    w[i] = header[i].size();
    for (const auto& r : rows) w[i] = std::max(w[i], r[i].size());
  }
  auto print_row = [&](const std::vector<std::string>& r) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) line += fmt::format("{:<{}}  ", r[i], w[i]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  };
  print_row(header);
  for (const auto& r : rows) print_row(r);
  fmt::print("lm_head: {}\n", cell(plan.lm_head));
  if (explain) {
    fmt::print("\nrules (first layer of each row):\n");
    for (const auto& r : rows) {
      const int first = std::stoi(r[0]);
      for (int c = 0; c < kLayerModuleClasses; ++c) {
        const ModuleChoice& m = plan.per_layer[size_t(first)][size_t(c)];
        fmt::print("  layers {} {}: {}\n", r[0], module_class_name(m.cls), m.rule);
      }
    }
    fmt::print("  lm_head: {}\n", plan.lm_head.rule);
  }
}

struct DescribeArgs {
  SelectionInputs sel;
  std::string positional;
  int layers = kDefaultDescribeLayers;
  bool json = false;
  bool explain = false;
};

void run_describe(DescribeArgs& a) {
  if (!a.positional.empty()) {
    if (a.sel.recipe_name)
      throw UsageError(fmt::format("recipe given twice: '{}' and --recipe {}", a.positional,
                                   *a.sel.recipe_name));
    a.sel.recipe_name = a.positional;
  }
  if (a.layers < 1 || a.layers > kMaxModelLayers)
    throw UsageError(
        fmt::format("--layers {}: expected 1 to {} (real models have at most a few hundred layers)",
                    a.layers, kMaxModelLayers));
  a.sel.read_environment();
  const SelectedRecipe s = select_recipe(a.sel);
  const ModelPlan plan = resolve_model(s.recipe, a.layers);
  if (a.json) {
    fmt::print("{}\n", plan_json(plan, a.explain).dump(2));
  } else {
    print_plan_text(s, plan, a.explain);
  }
}

}  // namespace

void register_recipe_commands(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* rec =
      app.add_subcommand("recipes",
                         "List the named precision recipes: purpose, forward, backward, coverage.\n"
                         "Example: lockstep recipes --json");
  rec->add_flag("--json", *json, "machine-readable output (includes each recipe's full content)");
  rec->callback([json] { run_recipes(*json); });

  auto d = std::make_shared<DescribeArgs>();
  CLI::App* desc =
      app.add_subcommand("describe",
                         "Show the resolved precision of every layer and module under a recipe.\n"
                         "Example: lockstep describe nvfp4_per_token --layers 20 --json");
  desc->add_option("RECIPE", d->positional,
                   "recipe name (default: --recipe-file, then $LOCKSTEP_RECIPE, then bf16)");
  add_recipe_options(*desc, d->sel);
  add_integer_option(*desc, "--layers", d->layers, 1, int(kMaxModelLayers),
                     fmt::format("number of transformer layers (1 to {})", kMaxModelLayers));
  desc->add_flag("--json", d->json, "print {recipe, layers: [{layer, modules}], lm_head} as JSON");
  desc->add_flag("--explain", d->explain, "also show which rule decided each module");
  desc->callback([d] { run_describe(*d); });
}

}  // namespace lockstep::cli
