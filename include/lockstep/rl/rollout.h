// Rollout and evaluation with the sampler: a batch of task prompts sampled G times each and
// rewarded by the task; greedy held-out accuracy; and the learner's packed view of prompt +
// continuation sequences with the response-token layout the objectives (objectives.h) use.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/model/sampler.h"
#include "lockstep/rl/task.h"

namespace lockstep::rl {

// One sequence for the learner: the prompt and what follows it (a sampled response, or the
// reference answer and <eos> in supervised warm start).
struct SequenceView {
  std::span<const int32_t> prompt;
  std::span<const int32_t> continuation;
};

// Sequences packed back to back (no padding). Sequence i occupies rows [cu_seqlens[i],
// cu_seqlens[i + 1]) of tokens / targets; targets[r] is the next token of the same sequence (the
// one row r predicts) and <pad> on a sequence's last row (no prediction is used there).
// Continuation token t (t in [offsets[i], offsets[i + 1]) for sequence i) is predicted by row
// rows[t], so the learner's log-prob of it is logp[rows[t]].
struct PackedSequences {
  std::vector<int32_t> tokens;      // [n]
  std::vector<int32_t> targets;     // [n]
  std::vector<int64_t> cu_seqlens;  // [R + 1]
  std::vector<int64_t> offsets;     // [R + 1] continuation tokens, the objectives' layout
  std::vector<int64_t> rows;        // [T] the row predicting each continuation token
};
// Throws std::invalid_argument naming the sequence when a prompt is empty.
PackedSequences pack_sequences(std::span<const SequenceView> sequences);

struct RolloutOptions {
  int64_t prompts = 16;  // P prompts per batch
  int64_t group = 8;     // G samples per prompt
  int64_t max_new = 8;   // generated tokens per sample at most (the sampler stops at <eos>)
  double temperature = 1.0;
  uint64_t sample_seed = 0;   // the sampler's Philox seed for this batch
  float format_bonus = 0.0f;  // reward_with_format's bonus (0: exact-match reward only)
  RewardKind reward = RewardKind::kExact;  // task_reward's kind
  int64_t max_batch = 128;                 // sequences the sampler decodes together
  bool record_routing = false;  // keep each sample's experts (SampleResult::routing) for replay
};

// The samples of one batch: prompt p's G samples are samples[p * G .. p * G + G - 1] (request
// stream p * G + g, so a sample's tokens never depend on the rest of the batch).
struct RolloutBatch {
  std::vector<Example> examples;             // [P] train-split examples first_index .. + P - 1
  std::vector<model::SampleResult> samples;  // [P * G]
  std::vector<float> rewards;                // [P * G] task_reward(task, ex, tokens, ...)
  int64_t correct = 0;                       // samples whose exact-match reward is 1
  int64_t truncated = 0;  // samples that reached max_new without <eos> (scored as wrong)
};

// Samples P train-split prompts (indices first_index .. first_index + P - 1 of (task_seed,
// difficulty)) G times each with the sampler's loaded policy, stopping at <eos> or max_new.
RolloutBatch rollout(model::Sampler& sampler, const Task& task, uint64_t task_seed, int difficulty,
                     uint64_t first_index, const RolloutOptions& options);

// The P examples a batch samples: train-split indices first_index .. first_index + P - 1.
std::vector<Example> rollout_examples(const Task& task, uint64_t task_seed, int difficulty,
                                      uint64_t first_index, int64_t prompts);
// The batch of `samples` ([P * G], prompt p's at p * G ..) for `examples` ([P]): rewards and counts
// exactly as rollout() scores them (a batch stored without its rewards is rebuilt with this).
// Throws std::invalid_argument when the sample count is not P * G.
RolloutBatch score_rollout(const Task& task, std::vector<Example> examples,
                           std::vector<model::SampleResult> samples, const RolloutOptions& options);

struct EvalResult {
  int64_t prompts = 0;
  int64_t correct = 0;
  int64_t truncated = 0;           // responses that reached max_new without <eos> (wrong)
  double accuracy = 0.0;           // correct / prompts
  double response_len_mean = 0.0;  // generated tokens per prompt (<eos> included)
};
// Greedy decoding (top_k = 1: the most likely token, ties to the lower id) of prompts 0 .. n - 1
// of `split` (the held-out part by default, the validation part for choosing defaults), at most
// max_new tokens each; accuracy by exact match.
EvalResult evaluate_greedy(model::Sampler& sampler, const Task& task, uint64_t task_seed,
                           int difficulty, int64_t n, int64_t max_new, int64_t max_batch = 128,
                           Split split = Split::kEval);

// The sampler's Philox seed of training batch `step` of a run seeded `seed` (Philox4x32-10 keyed
// by the seed, counter (step, stream 0x524C0003)): different for every step, the same on every
// machine and after a resume.
uint64_t rollout_sample_seed(uint64_t seed, int64_t step);

}  // namespace lockstep::rl
