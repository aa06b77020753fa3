// The trainer's state (Trainer::Impl), shared by the step loop (trainer.cpp) and the run folder
// code (trainer_run_dir.cpp: create, resume, checkpoints, run_meta.json).
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>

#include "async_rollout.h"
#include "dir_util.h"
#include "learner_ranks.h"
#include "lockstep/diag/metrics.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/sampler.h"
#include "lockstep/rl/task.h"
#include "lockstep/rl/trainer.h"

namespace lockstep::rl {

namespace run_files {
inline constexpr const char* kRunMeta = "run_meta.json";
inline constexpr const char* kReference = "reference";
inline constexpr const char* kCheckpoint = "checkpoint";
inline constexpr const char* kTrainerState = "trainer.json";
// --async-rollout 1: the checkpoint's batch for the next step (async_rollout.h).
inline constexpr const char* kPendingRollout = "rollout.safetensors";
inline constexpr const char* kReport = "report.html";
}  // namespace run_files

struct Trainer::Impl {
  std::filesystem::path dir;
  std::unique_ptr<detail::FolderLock> lock;  // held from create / resume to the end
  TrainOptions opt;
  Recipe recipe;
  Guard guard = Guard::kNone;
  const Task* task = nullptr;
  // The learner's replicas (rank 0's exports and checkpoints), each with the initial policy for
  // the KL term: one rank, or N data-parallel ranks (TrainOptions::learner_ranks).
  std::unique_ptr<detail::LearnerRanks> ranks;
  model::Sampler sampler;       // the policy the rollouts and evals use
  model::Sampler bf16_sampler;  // receives the bf16 export timed beside it
  // --async-rollout 1: the sampler of the background rollouts, one version behind `sampler`
  // while the learner trains (its own KV cache and stream; decode steps run call by call, see
  // run()). `policy` is the version `sampler` holds, kept to load it here at the next step.
  model::Sampler rollout_sampler;
  std::optional<model::PolicyVersion> policy;
  // --async-rollout 1: the thread the background rollouts run on, and the batch of step
  // `step + 1` (in flight there, or read from the checkpoint). Declared after the samplers and the
  // task a rollout reads, so the rollout is waited for and the thread joined before they go.
  detail::RolloutThread rollout_thread;
  std::unique_ptr<detail::PendingRollout> pending;
  std::optional<diag::MetricsWriter> metrics;
  int64_t step = 0;               // completed RL steps = the policy version the sampler holds
  double elapsed_before_s = 0.0;  // wall time of the run before this process (from checkpoint)
  std::chrono::steady_clock::time_point started;

  model::Learner& learner() { return ranks->lead(); }
  model::ExecMode mode() const {
    return opt.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
  }
  double elapsed_s() const {
    return elapsed_before_s +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  // The recipe the sampler runs (options' sampler_recipe, else the learner's).
  const Recipe& sampler_recipe() const;
  // Exports the learner's weights as policy version `step` with the sampler's recipe and loads it
  // into the sampler; returns the time in seconds.
  double sync_policy();
  // The same version exported in bf16 into bf16_sampler (the evaluations that read the policy
  // through bf16); returns the time in seconds.
  double sync_bf16();
  // RUN_DIR/checkpoint for the current step (temporary folder, fsync, atomic exchange); with a
  // pending rollout, waits for it and stores its batch too.
  void save_checkpoint();
  // The rows, report and run_meta results at the end of run().
  void write_results(const TrainResult& r);
};

// The learner settings of a run (the checkpoint's learner.json must match them on resume).
model::LearnerConfig learner_config(const TrainOptions& o);

// The devices of the learner ranks: o.learner_ranks times the CPU, or consecutive GPUs from
// o.device.
std::vector<Device> learner_devices(const TrainOptions& o);
// The rank group of those devices: one rank on the calling thread, fake-transport threads on the
// CPU, or NCCL ranks on the GPUs.
std::unique_ptr<dist::RankGroup> learner_group(const TrainOptions& o);

}  // namespace lockstep::rl
