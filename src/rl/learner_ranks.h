// The learner side of an RL step over N data-parallel ranks (N = 1: the single-device learner).
// Each rank holds a full replica (masters, AdamW moments, the KL reference); a step's sequences
// are cut into M fixed gradient slots, rank r computes slots r*M/N .. (r+1)*M/N - 1, and
// dist::reduce_gradients adds the M slot gradients in one fixed tree, so every replica applies the
// same AdamW step and the bits do not depend on N (docs/multi-gpu.md, "The data-parallel learner").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "lockstep/dist/rank_group.h"
#include "lockstep/model/decoder.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/sampler.h"
#include "lockstep/rl/rollout.h"

namespace lockstep::rl::detail {

struct LearnerReplica {
  std::unique_ptr<model::Learner> learner;
  std::unique_ptr<model::Decoder> reference;  // the initial policy, for the KL term
};

// One step's batch as every rank reads it: host memory shared by the rank threads, read-only while
// they run. R responses; `all` is the whole batch packed (its offsets place every response's
// tokens in the [T] per-token arrays).
struct StepBatch {
  std::span<const SequenceView> seqs;            // [R] prompt + response
  std::span<const model::SampleResult> samples;  // [R] (their routing, for routing replay)
  const PackedSequences* all = nullptr;
  bool routing_replay = false;
  double temperature = 1.0;
  model::ExecMode mode = model::ExecMode::kDeterministic;
};

// Per response token of the whole batch, [T] in response order.
struct StepLogprobs {
  std::vector<float> logp_old;        // the learner at the rollout's version (detached)
  std::vector<float> entropy;         // of the learner's temperature-scaled distribution
  std::vector<float> logp_ref;        // the reference policy (KL term)
  std::vector<float> logp_no_replay;  // the learner's own routing; empty without routing replay
};

// The objective of minibatch c at logp_new ([tokens of the minibatch's responses]): returns
// d loss / d logp_new (same size). Called on every rank with the same inputs (it must be a pure
// function of them); `rank` lets rank 0 keep the statistics.
using ObjectiveFn =
    std::function<std::vector<float>(int rank, int64_t c, std::span<const float> logp_new)>;

class LearnerRanks {
 public:
  // replicas[r] runs on group->device(r); every replica starts from the same state. grad_slots:
  // M, a power of two and a multiple of the rank count (checked by TrainOptions::validate).
  LearnerRanks(std::vector<LearnerReplica> replicas, std::unique_ptr<dist::RankGroup> group,
               int64_t grad_slots);
  ~LearnerRanks();

  int size() const { return int(replicas_.size()); }
  const dist::RankGroup& group() const { return *group_; }
  model::Learner& lead() { return *replicas_[0].learner; }  // rank 0: exports, checkpoints
  const model::Learner& lead() const { return *replicas_[0].learner; }

  // The log-probs of the batch at the current parameters: the batch's R responses cut into M
  // slots, each slot's sequences packed and run alone (its own forward), the slots' values
  // gathered from the ranks that own them.
  StepLogprobs logprobs(const StepBatch& b);
  // K minibatches of whole responses (R / K each, in order), each one AdamW step on every replica:
  // logp_new (K = 1: `logp_old`, the forward of logprobs() serves the backward; else a forward of
  // the minibatch's slots), the objective, one backward per slot from zero gradients,
  // reduce_gradients over the M slots, clipping and AdamW. Returns rank 0's StepStats per
  // minibatch.
  std::vector<model::StepStats> update(const StepBatch& b, int64_t minibatches,
                                       std::span<const float> logp_old,
                                       const ObjectiveFn& objective);
  // Every replica's masters hashed (FNV-1a 64 over name, shape and bytes) and compared across
  // ranks; std::runtime_error naming the first rank that differs from rank 0. No-op for 1 rank.
  void check_replicas();

 private:
  std::vector<LearnerReplica> replicas_;
  std::unique_ptr<dist::RankGroup> group_;
  int64_t slots_;
  // Per rank: the response range and learner version of the forward the learner has saved for
  // its backward ({-1, -1, -1}: none).
  struct SavedForward {
    int64_t r0 = -1, r1 = -1, version = -1;
  };
  std::vector<SavedForward> saved_;
};

}  // namespace lockstep::rl::detail
