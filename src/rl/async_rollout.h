// The overlapped rollout of `--async-rollout 1` (docs/rl.md, "Overlapped rollouts"): the next
// step's batch sampled on a background thread while the learner trains, and that batch's form in a
// checkpoint (the checkpoint at step k holds step k + 1's batch, sampled by version k - 1, which
// the checkpoint's weights cannot sample again).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "lockstep/model/sampler.h"
#include "lockstep/rl/rollout.h"
#include "lockstep/tensor/device.h"

namespace lockstep::rl::detail {

// One long-lived thread that runs jobs in order, started by the first. The background rollouts of
// a run all run on it, so what a thread keeps for its life (its CUDA device, a cuBLAS handle) is
// made once per run, not once per step.
class RolloutThread {
 public:
  RolloutThread() = default;
  // Runs the jobs still queued, then joins the thread.
  ~RolloutThread();
  RolloutThread(const RolloutThread&) = delete;
  RolloutThread& operator=(const RolloutThread&) = delete;
  // Queues `job`; the future is ready once it has run (an exception it throws is in the future).
  std::future<void> run(std::function<void()> job);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

// The batch of RL step `step`, sampled by policy version `policy_version`: in flight on a
// RolloutThread, or already there (read from a checkpoint). Neither copyable nor movable (the
// job writes into it).
class PendingRollout {
 public:
  // Runs `sample` on `thread`, with the thread's current device made `device` (the sampler's).
  PendingRollout(int64_t step, int64_t policy_version, RolloutThread& thread, Device device,
                 std::function<RolloutBatch()> sample);
  // A batch that is already there; generation_s: the time its sampling took.
  PendingRollout(int64_t step, int64_t policy_version, RolloutBatch batch, double generation_s);
  // Waits for the job: a batch nobody waited for is dropped, and so is its error.
  ~PendingRollout();
  PendingRollout(const PendingRollout&) = delete;
  PendingRollout& operator=(const PendingRollout&) = delete;

  int64_t step() const { return step_; }
  int64_t policy_version() const { return version_; }
  // Waits for the batch (the time adds to waited_s) and returns it; rethrows, with its type and
  // message, what the sampling thread threw (again on every call).
  const RolloutBatch& wait();
  // wait(), then the batch moved out (for the step that trains on it).
  RolloutBatch take();
  double waited_s() const { return waited_s_; }
  // The sampling time, measured on the sampling thread (known once wait() has returned).
  double generation_s() const { return generation_s_; }

 private:
  int64_t step_ = 0, version_ = 0;
  RolloutBatch batch_;
  double generation_s_ = 0.0, waited_s_ = 0.0;
  std::exception_ptr error_;
  std::future<void> done_;  // valid while the job may still run
};

// A batch's samples as a safetensors file (written atomically): tokens I32 [N] and the sampler's
// log-probs F32 [N] of all samples back to back with token_offsets I64 [R + 1], eos U8 [R], and
// with routing replay routing I32 [M] with routing_offsets I64 [R + 1]. The examples and rewards
// are not stored: score_rollout rebuilds them from the task.
void save_rollout_samples(const std::filesystem::path& file,
                          std::span<const model::SampleResult> samples);
// Reads what save_rollout_samples wrote; std::invalid_argument naming the file and the rule broken
// (a missing array, a wrong dtype or shape, offsets that do not fit).
std::vector<model::SampleResult> load_rollout_samples(const std::filesystem::path& file);

}  // namespace lockstep::rl::detail
