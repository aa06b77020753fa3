// Where a run's policy of version 0 comes from: a model directory, a run's checkpoint folder
// (trained with the run's recipe), or a preset's random weights followed by the cached supervised
// warm start. `lockstep train`, `pretrain` and `compare` open the source once (a checkpoint is
// read once), check it before any work, and make the initial policy from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "lockstep/model/weights.h"
#include "lockstep/recipe/recipe.h"
#include "lockstep/rl/warm_start.h"

namespace lockstep::rl {

struct PolicySourceOptions {
  std::string model_dir;  // a model directory or a checkpoint folder; empty: the preset
  std::string preset = "tiny-moe";
  uint64_t init_seed = 0;              // seed of the preset's random weights
  bool allow_checkpoint = true;        // false: a checkpoint folder is refused (compare)
  std::string model_flag = "--model";  // how messages name model_dir
};

enum class PolicySourceKind { kPreset, kModelDir, kCheckpoint };

// A source, opened and checked: its weights read once (a model directory or a checkpoint) or made
// (a preset's random weights), all finite, and the RL tasks can run on its config.
struct PolicySource {
  PolicySourceKind kind = PolicySourceKind::kPreset;
  std::string where;                        // "preset tiny-moe" or the folder
  std::string init_source;                  // the warm-start key's "preset:NAME" / "model_dir:DIR"
  model::ModelWeights weights;              // F32
  std::optional<Recipe> checkpoint_recipe;  // the recipe a checkpoint was trained with
  Json meta = Json::object();               // run_meta.json's "model": source, path or preset
};

// Throws std::invalid_argument naming the folder or preset and the rule broken: an unknown
// preset, a folder that is neither a model directory nor a checkpoint, a checkpoint where
// allow_checkpoint is false, a model the RL tasks cannot run on (vocabulary, or a context shorter
// than min_context tokens), a non-finite weight. Model-file errors (model::WeightsError) pass
// through, naming the file and the tensor.
PolicySource open_policy_source(const PolicySourceOptions& options, int64_t min_context);

// A checkpoint continues the recipe it was trained with: std::invalid_argument naming both
// recipes unless `recipe` is that one (same content). Other sources fit every recipe.
void check_source_recipe(const PolicySource& source, const Recipe& recipe);

// Whether `dir` is a learner checkpoint folder (learner.json inside), e.g. RUN_DIR/checkpoint.
bool is_checkpoint_dir(const std::filesystem::path& dir);

// The warm start a preset source gets before RL; none for a model directory or a checkpoint, or
// when options.steps is 0.
struct WarmStartRequest {
  PretrainOptions options;
  std::filesystem::path cache_dir;
};
// What make_initial_policy will do, known before any work (--dry-run, the plan line).
struct WarmStartPlan {
  bool needed = false;        // a preset source and options.steps > 0
  bool cached = false;        // its cache entry exists with this key
  std::filesystem::path dir;  // cache_dir / hash
};
WarmStartPlan plan_warm_start(const PolicySource& source, const WarmStartRequest& request);

struct InitialPolicy {
  model::ModelWeights weights;
  Json meta = Json::object();           // {"model": {...}, "warm_start": {...} or null}
  std::optional<WarmStart> warm_start;  // the cache entry (weights moved out), when one ran
};

// The policy of version 0: the source's weights (moved out of `source`), after the cached warm
// start for a preset source when request.options.steps > 0. on_step: the warm start's progress
// (not called when the entry is cached).
InitialPolicy make_initial_policy(PolicySource&& source, const WarmStartRequest& request,
                                  const std::function<void(const PretrainProgress&)>& on_step = {});

}  // namespace lockstep::rl
