// Shared pieces of the model commands (forward, sample, align, bench model): where the weights come
// from (a model directory or a built-in preset with random weights) and the recipe.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/model/weights.h"
#include "lockstep/recipe/selection.h"

namespace lockstep::cli {

struct ModelSource {
  std::string model_dir;
  std::string preset;
  uint64_t init_seed = 0;
};
// Adds --model and --preset (+ --init-seed) to a subcommand.
void add_model_source_options(CLI::App& app, ModelSource& src, bool allow_preset);
// Loads the directory or builds the preset's random weights; user errors become UsageError.
model::ModelWeights load_model_source(const ModelSource& src);

// The recipe of a run from --recipe / --recipe-file / LOCKSTEP_RECIPE (UsageError on bad input).
SelectedRecipe select_run_recipe(SelectionInputs in);

}  // namespace lockstep::cli
