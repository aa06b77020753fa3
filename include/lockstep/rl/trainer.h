// The RL trainer (`lockstep train`): GRPO with the TIS / TRIAGE guards over the learner and the
// sampler, one policy version per update exported by the converter and verified by the sampler,
// held-out evaluation, metrics.jsonl rows, atomic checkpoints and bit-identical resume, and the
// run's report. The loop and every metrics key are described in docs/rl.md, "The trainer".
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/diag/metrics.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/model/weights.h"
#include "lockstep/recipe/json.h"
#include "lockstep/recipe/recipe.h"
#include "lockstep/rl/objectives.h"

namespace lockstep::rl {

// Everything that defines a run besides the recipe and the initial weights. Stored in
// run_meta.json ("options"), so --resume continues with exactly these.
struct TrainOptions {
  // Where the learner, the samplers and the reference run. Not part of the run's identity (not
  // stored in "options"): a checkpoint continues on any device (--resume --device).
  Device device = Device::cpu();
  // Data-parallel learner ranks, each a full replica (not part of the run's identity either: the
  // bits do not depend on it, so --resume may change it). 1, or a power of two dividing
  // grad_slots. On the CPU the ranks are threads over the fake transport; on a GPU rank r runs on
  // cuda:(device.index + r) over NCCL. docs/multi-gpu.md.
  int learner_ranks = 1;
  // Where the sampler (and the bf16 evaluation sampler) runs when not on `device`: its own GPU
  // (--gpus L:1). Not part of the run's identity.
  std::optional<Device> sampler_device;
  std::string task = "add";
  int difficulty = 2;
  std::string guard = "tis";   // none, tis, triage (TIS + gate + repair), triage-gate
  bool deterministic = false;  // the learner's forward uses the sampler's per-row functions
  uint64_t seed = 0;           // task prompts, sampling (Philox per step), stochastic rounding
  int64_t steps = 100;         // RL steps: each ends with one new policy version
  int64_t prompts = 32;        // P prompts per step
  int64_t group = 8;           // G samples per prompt
  int64_t max_new = 8;         // tokens per response at most (a response reaching it is wrong)
  double temperature = 1.0;    // sampling temperature; the learner's log-probs use the same
  double lr = 2e-3;
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  int64_t minibatches = 1;  // optimizer steps per RL step (prompts % minibatches == 0)
  // Gradient slots M: each minibatch's responses cut into M contiguous fixed parts, each slot's
  // gradient taken alone (one backward, the minibatch's normalisation) and the M summed in one
  // fixed pairwise tree (dist::tree_sum). A power of two, at most the responses of a minibatch; 1
  // is one backward over the whole minibatch. Fixing M fixes the bits whatever learner_ranks.
  int64_t grad_slots = 1;
  double kl_coef = 0.0;  // k3 KL to the initial policy (always logged)
  double tis_cap = 2.0;
  GateOptions gate;              // TRIAGE gate (segment, thresholds, weights)
  RepairOptions repair;          // TRIAGE repair (segment, margin, scale, weight)
  float format_bonus = 0.0f;     // reward_with_format's bonus (0: exact match only)
  std::string reward = "exact";  // exact (0/1, with format_bonus) or prefix (partial credit)
  int64_t eval_every = 10;       // evaluation every N steps (and at 0 and the last step)
  int64_t eval_prompts = 128;
  std::string eval_split = "heldout";  // heldout (reported) or validation (choosing defaults)
  int64_t checkpoint_every = 10;
  int64_t sampler_batch = 128;  // sequences the sampler decodes together
  // The sampler's recipe when it differs from the learner's (a bf16 learner behind an FP8 or
  // NVFP4 rollout engine): the converter exports every version with it; the learner, the
  // reference policy and the optimizer use the run's recipe. Unset: one shared contract.
  std::optional<Recipe> sampler_recipe;
  std::string kv_cache = "bf16";  // the sampler's KV cache: bf16 or fp8 (E4M3, per-head scales)
  // The learner's K / V rounding: "bf16" (whatever the sampler's cache holds) or "match" (the
  // rounding of the sampler's cache, so an fp8 cache is no source of learner-sampler gap).
  std::string learner_kv = "bf16";
  bool routing_replay = false;  // the learner reuses the sampler's experts (MoE)
  // Overlapped rollouts (--async-rollout): 0, each step's batch is sampled by the policy the step
  // starts from; 1, a background thread samples step k + 1's batch with the sampler's version
  // k - 1 while the learner trains step k, so step k's batch comes from version max(0, k - 2)
  // (docs/rl.md, "Overlapped rollouts"). Part of the run's identity: the bits depend on it.
  int async_rollout = 0;

  // Throws std::invalid_argument naming the option and the rule (unknown task or guard, a
  // difficulty outside the task's range, non-positive sizes, a --max-new that cannot hold the
  // task's answer, ...).
  void validate() const;
};
Json options_to_json(const TrainOptions& o);
// Throws std::invalid_argument naming `where` and the field for a missing or mistyped field.
TrainOptions options_from_json(const Json& j, const std::string& where);

// The longest prompt + response of a run (prompt length of the task at this difficulty + max_new),
// which the model's context must hold.
int64_t max_sequence_length(const TrainOptions& o);

struct TrainCallbacks {
  std::function<void(const diag::MetricsRow&)> on_row;  // after each row is written
  std::function<bool()> stop_requested;  // checked after every step: true ends the run cleanly
};

struct TrainResult {
  int64_t steps_done = 0;                     // the step the run ended at
  bool finished = false;                      // reached options.steps
  std::optional<double> start_eval_accuracy;  // step 0
  std::optional<double> end_eval_accuracy;    // the last step
  // The same evaluations through the versions' bf16 export (eval_accuracy_bf16): the rise over
  // the bf16 warm start, apart from what the sampler's quantization lost at the start.
  std::optional<double> start_eval_accuracy_bf16, end_eval_accuracy_bf16;
  double elapsed_s = 0.0;        // wall time of the run, resumed parts included
  std::filesystem::path report;  // RUN_DIR/report.html
};

// Where a resumed run continues (TrainOptions' fields of the same names).
struct ResumePlacement {
  Device device = Device::cpu();
  int learner_ranks = 1;
  std::optional<Device> sampler_device;
  // The --async-rollout the caller asks for, when it asks: refused unless it is the run's own
  // (the run's bits depend on it).
  std::optional<int> async_rollout;
};

// Run folder layout:
//   run_meta.json   options, recipe, model, warm start, provenance; results at the end
//   metrics.jsonl   one row per step (row 0: the initial evaluation)
//   reference/      the initial policy (config.json, model.safetensors): KL reference
//   checkpoint/     learner.safetensors + learner.json (learner.h), trainer.json
//   report.html     written at the end
class Trainer {
 public:
  // A new run in run_dir, which must not exist or be an empty folder. init: the policy of
  // version 0 (the warm start), F32. meta: run_meta.json provenance (argv, seeds, and any extra
  // fields: model source, warm start). Validates everything before creating anything.
  static std::unique_ptr<Trainer> create(const std::filesystem::path& run_dir,
                                         const TrainOptions& options, const SelectedRecipe& recipe,
                                         const model::ModelWeights& init, RunMetaExtras meta);
  // Continues run_dir from its checkpoint on `where` (any device and rank count: the run's bits
  // do not depend on them). Throws std::invalid_argument (nothing changed) when the folder is not
  // a run, its checkpoint belongs to another model, recipe or options, the rank count does not
  // divide the run's --grad-slots, where.async_rollout is not the run's, or an --async-rollout 1
  // checkpoint lacks the batch sampled for its next step.
  static std::unique_ptr<Trainer> resume(const std::filesystem::path& run_dir,
                                         const ResumePlacement& where = {});

  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs from the current step to options().steps (or until stop_requested), then writes
  // report.html and the results into run_meta.json.
  TrainResult run(const TrainCallbacks& callbacks = {});

  const TrainOptions& options() const;
  const Recipe& recipe() const;
  int64_t step() const;  // completed steps (the checkpoint's step right after resume)
  const std::filesystem::path& run_dir() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Refuses (std::invalid_argument naming the folder) a new run's folder that exists and is not an
// empty folder, so a run never writes into another run's files.
void check_new_run_dir(const std::filesystem::path& dir);

// Whether `dir` looks like a run folder (run_meta.json with command "train" and a checkpoint).
bool is_run_dir(const std::filesystem::path& dir);

}  // namespace lockstep::rl
