// Shared pieces of `lockstep train`, `lockstep pretrain` and `lockstep compare`: the run options
// as flags, the initial policy (a model directory, a run's checkpoint, or a preset with the cached
// warm start), and running one trainer with a progress display.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <optional>
#include <string>

#include "lockstep/model/weights.h"
#include "lockstep/recipe/selection.h"
#include "lockstep/rl/trainer.h"
#include "lockstep/rl/warm_start.h"

namespace lockstep::cli {

struct TrainArgs {
  rl::TrainOptions opt;
  SelectionInputs recipe;      // --recipe / --recipe-file (train only)
  std::string sampler_recipe;  // --sampler-recipe NAME or FILE.json ("" : the learner's)
  std::string preset = "tiny-moe";
  std::string model_dir;
  int64_t pretrain_steps = rl::PretrainOptions{}.steps;
  int64_t pretrain_batch = rl::PretrainOptions{}.batch;
  double pretrain_lr = rl::PretrainOptions{}.lr;
  std::string cache_dir = "runs/.cache/pretrain";
  int64_t log_every = 10;
  bool json = false;
};

// Adds the options every run shares (task, model, loop sizes, objective, eval, checkpoints, warm
// start, output); `train` adds --recipe / --guard itself, `compare` its lists.
void add_train_options(CLI::App& cmd, TrainArgs& a);

// --sampler-recipe: a built-in name or a recipe JSON file; unset when empty or when it equals the
// learner's recipe (one shared contract). UsageError naming the flag for an unknown name or a bad
// file.
std::optional<Recipe> resolve_sampler_recipe(const std::string& arg, const Recipe& learner);

// The policy of version 0 and what run_meta.json records about where it came from.
struct InitialPolicy {
  model::ModelWeights weights;
  Json meta = Json::object();  // {"model": {...}, "warm_start": {...}}
};
// --model DIR (a model directory, or a run's checkpoint folder trained with the same recipe), else
// the preset's random weights (seed --seed) after the cached warm start (--pretrain-steps > 0).
// preset_given: --preset was given explicitly (refused together with --model). Bad input throws
// UsageError before anything is written.
InitialPolicy initial_policy(const TrainArgs& a, const Recipe& recipe, bool preset_given);

// Checks the model against the run's options (vocabulary, context) without loading weights where
// possible: the preset's config, or the directory's config.json. UsageError on a mismatch.
void check_model_source(const TrainArgs& a, bool preset_given);

// Whether `dir` is a learner checkpoint folder (learner.json inside), e.g. RUN_DIR/checkpoint.
bool is_checkpoint_dir(const std::string& dir);

// The warm-start options of a run.
rl::PretrainOptions pretrain_options(const TrainArgs& a);

// Runs the trainer with a progress display on stderr (bar on a terminal, plain lines otherwise);
// SIGINT ends the run after the current step with a checkpoint (a second SIGINT kills it).
rl::TrainResult run_with_progress(rl::Trainer& t, int64_t log_every);

// "runs/20261201-171500-add-nvfp4_per_token-tis" (a suffix -2, -3, ... when it exists).
std::filesystem::path default_run_dir(const std::filesystem::path& parent, const std::string& name);

}  // namespace lockstep::cli
