// Shared pieces of `lockstep train`, `lockstep pretrain` and `lockstep compare`: the run options
// as flags, the output folders checked before any work, the initial policy through rl's
// orchestration (include/lockstep/rl/initial_policy.h) with a progress display, and running one
// trainer with a progress display.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/model/weights.h"
#include "lockstep/recipe/selection.h"
#include "lockstep/rl/initial_policy.h"
#include "lockstep/rl/trainer.h"
#include "lockstep/rl/warm_start.h"
#include "lockstep/tensor/device.h"

namespace lockstep::cli {

struct TrainArgs {
  rl::TrainOptions opt;
  SelectionInputs recipe;      // --recipe / --recipe-file (train only)
  std::string sampler_recipe;  // --sampler-recipe NAME or FILE.json ("" : the learner's)
  std::string preset = "tiny-moe";
  std::string model_dir;
  // The warm start's training options (steps, batch, schedule, targeted stop); pretrain_options
  // adds the task, seed and evaluation settings of the run.
  rl::PretrainOptions warm;
  std::string cache_dir = "runs/.cache/pretrain";
  std::string device = "auto";  // --device: cpu, cuda, cuda:N or auto
  int64_t log_every = 10;
  bool json = false;
  bool dry_run = false;
  CLI::App* cmd = nullptr;  // for whether --preset was given
};

// Adds the options every run shares (task, model, loop sizes, objective, eval, checkpoints, warm
// start, output, --dry-run); `train` adds --recipe / --guard itself, `compare` its lists.
void add_train_options(CLI::App& cmd, TrainArgs& a);

// The warm start's training flags, each named prefix + name: "--pretrain-" on train and compare,
// "--" on pretrain (--steps, --batch, --lr, --warmup, --min-lr-ratio, --target, --target-every,
// --target-prompts).
void add_warm_start_options(CLI::App& cmd, rl::PretrainOptions& o, const std::string& prefix);

// The GPU main job's settings: on a GPU, a run given neither --preset nor --model trains this
// preset, and each of these replaces the CPU main job's default unless its flag was given.
struct GpuMainJob {
  static constexpr const char* kPreset = "gpu-moe";
  static constexpr double kLr = 1e-4;           // RL (AdamW)
  static constexpr double kWarmLr = 1e-3;       // the warm start's peak
  static constexpr int64_t kEvalPrompts = 512;  // held-out prompts at each evaluation
  // A gpu-moe checkpoint (fp32 masters and AdamW moments, 1.9 GB, fsynced) takes about 2.7 s on
  // the H200 machine's disk, 30x an RL step: every 50 steps, not the CPU job's 10.
  static constexpr int64_t kCheckpointEvery = 50;
};

// Resolves --device into a.opt.device (UsageError when it cannot run here) and, on a GPU, applies
// GpuMainJob. `warm_prefix` is how the command names its warm-start flags ("--pretrain-" on train
// and compare, "--" on pretrain).
void resolve_run_device(TrainArgs& a, const std::string& warm_prefix);

// TrainOptions::validate as a UsageError.
void validate_train_options(const rl::TrainOptions& o);

// --sampler-recipe: a built-in name or a recipe JSON file; unset when empty or when it equals the
// learner's recipe (one shared contract). UsageError naming the flag for an unknown name or a bad
// file.
std::optional<Recipe> resolve_sampler_recipe(const std::string& arg, const Recipe& learner);

// Whether the run makes (or reuses) the cached warm start: a preset and --pretrain-steps > 0.
bool uses_warm_start(const TrainArgs& a);

// Every output location of a run, before any work (UsageError, exit 2): the run folder `out`
// (flag names it; it must be new or empty, and creatable), the warm-start cache when the run uses
// one (writable, not inside the run folder), and neither may hold or be an input (--model,
// --recipe-file).
void check_run_outputs(const TrainArgs& a, std::string_view flag, const std::filesystem::path& out);

// Opens --model / --preset once (rl::open_policy_source), as UsageError on bad input.
rl::PolicySource open_source(const TrainArgs& a, int64_t min_context, bool allow_checkpoint);

// The warm start of a run (options and cache) and what it will do, for --dry-run.
rl::WarmStartRequest warm_start_request(const TrainArgs& a);
std::string describe_warm_start(const rl::PolicySource& s, const TrainArgs& a);

// The initial policy (rl::make_initial_policy) with the warm start's progress on stderr.
rl::InitialPolicy initial_policy(rl::PolicySource&& s, const TrainArgs& a);

// " until 50% validation accuracy" (the targeted stop of `o`), or "" without one.
std::string target_text(const rl::PretrainOptions& o);
// The --task option's help: the task names the registry knows ("task (add, count, ...)").
std::string task_help();
// The outcome of a warm start from its warm_start.json (rl::pretrain_result_json): "340 steps,
// validation accuracy 53.1% reached the target 50%".
std::string describe_warm_start_outcome(const Json& info);
// A warning when the step cap ended the warm start below its target ("" otherwise); it names
// the flags to change with `prefix` (add_warm_start_options).
std::string warm_start_warning(const Json& info, const std::string& prefix);

// The warm-start options of a run.
rl::PretrainOptions pretrain_options(const TrainArgs& a);

// Runs the trainer with a progress display on stderr (bar on a terminal, plain lines otherwise);
// SIGINT ends the run after the current step with a checkpoint (a second SIGINT kills it).
rl::TrainResult run_with_progress(rl::Trainer& t, int64_t log_every);

// --gpus L:S of `train` (src/cli/train_gpus.cpp): L data-parallel learner ranks, S sampler GPUs.
struct GpuSplit {
  int learners = 1;
  int samplers = 0;
};
// Where `train` places its learner ranks and sampler: --gpus, --learner-ranks, --async-rollout.
struct ParallelArgs {
  GpuSplit gpus;
  int learner_ranks = 1;  // --learner-ranks: CPU threads over the fake transport
  int async_rollout = 0;
  // Whether --gpus uses more than one GPU (learner ranks on cuda:0..L-1, the sampler on cuda:L).
  bool multi_gpu() const { return gpus.learners + gpus.samplers > 1; }
};
// "L:S" (L >= 1, S >= 0) or "N" (= N:0); UsageError naming the flag otherwise.
GpuSplit parse_gpus(const std::string& text);
// Adds --gpus, --learner-ranks and --async-rollout (0 or 1) to `train`.
void add_gpus_options(CLI::App& cmd, ParallelArgs& p);
// Before any work (UsageError, exit 2): more GPUs than `found` has (naming how many it found and
// why none, when none), more than one sampler GPU, several learner GPUs without NCCL, a rank
// count that is not a power of two, --gpus with --learner-ranks. 1:0 (the default) passes: the
// single-device run on --device.
void check_gpus(const ParallelArgs& p, const DeviceReport& found);
// After --device is resolved into o.device: sets o.learner_ranks, o.sampler_device and
// o.async_rollout, refusing a --device that contradicts --gpus and --learner-ranks on a GPU
// (UsageError).
void apply_parallel(const ParallelArgs& p, rl::TrainOptions& o);

// "runs/20261201-171500-add-nvfp4_per_token-tis" (a suffix -2, -3, ... when it exists).
std::filesystem::path default_run_dir(const std::filesystem::path& parent, const std::string& name);

}  // namespace lockstep::cli
