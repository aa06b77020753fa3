// Rollout, greedy evaluation and sequence packing (include/lockstep/rl/rollout.h).
#include "lockstep/rl/rollout.h"

#include <fmt/format.h>

#include <stdexcept>

#include "lockstep/numerics/philox.h"

namespace lockstep::rl {

PackedSequences pack_sequences(std::span<const SequenceView> sequences) {
  PackedSequences p;
  p.cu_seqlens.push_back(0);
  p.offsets.push_back(0);
  for (size_t i = 0; i < sequences.size(); ++i) {
    const SequenceView& s = sequences[i];
    if (s.prompt.empty())
      throw std::invalid_argument(
          fmt::format("pack_sequences: sequence {} has an empty prompt", i));
    const int64_t start = int64_t(p.tokens.size());
    p.tokens.insert(p.tokens.end(), s.prompt.begin(), s.prompt.end());
    p.tokens.insert(p.tokens.end(), s.continuation.begin(), s.continuation.end());
    const int64_t end = int64_t(p.tokens.size());
    for (int64_t r = start; r < end; ++r)
      p.targets.push_back(r + 1 < end ? p.tokens[size_t(r + 1)] : kPad);
    // Continuation token j sits at row start + |prompt| + j and is predicted by the row before.
    for (size_t j = 0; j < s.continuation.size(); ++j)
      p.rows.push_back(start + int64_t(s.prompt.size()) - 1 + int64_t(j));
    p.cu_seqlens.push_back(end);
    p.offsets.push_back(int64_t(p.rows.size()));
  }
  return p;
}

std::vector<Example> rollout_examples(const Task& task, uint64_t task_seed, int difficulty,
                                      uint64_t first_index, int64_t prompts) {
  std::vector<Example> ex;
  for (int64_t p = 0; p < prompts; ++p)
    ex.push_back(task.make(task_seed, first_index + uint64_t(p), difficulty, Split::kTrain));
  return ex;
}

RolloutBatch score_rollout(const Task& task, std::vector<Example> examples,
                           std::vector<model::SampleResult> samples, const RolloutOptions& o) {
  if (o.group < 1 || samples.size() != examples.size() * size_t(o.group))
    throw std::invalid_argument(
        fmt::format("score_rollout: {} samples for {} prompts of group {} (expected {})",
                    samples.size(), examples.size(), o.group, examples.size() * size_t(o.group)));
  RolloutBatch b;
  b.examples = std::move(examples);
  b.samples = std::move(samples);
  for (size_t i = 0; i < b.samples.size(); ++i) {
    const Example& ex = b.examples[i / size_t(o.group)];
    const std::vector<int32_t>& toks = b.samples[i].tokens;
    b.rewards.push_back(task_reward(task, ex, toks, o.reward, o.format_bonus));
    if (task.reward(ex, toks) == 1.0f) ++b.correct;
    if (!b.samples[i].eos) ++b.truncated;
  }
  return b;
}

RolloutBatch rollout(model::Sampler& sampler, const Task& task, uint64_t task_seed, int difficulty,
                     uint64_t first_index, const RolloutOptions& o) {
  if (o.prompts < 1 || o.group < 1 || o.max_new < 1)
    throw std::invalid_argument(
        fmt::format("rollout: prompts {}, group {} and max_new {} must be >= 1", o.prompts, o.group,
                    o.max_new));
  std::vector<Example> examples =
      rollout_examples(task, task_seed, difficulty, first_index, o.prompts);
  std::vector<model::SampleRequest> reqs;
  for (int64_t p = 0; p < o.prompts; ++p)
    for (int64_t g = 0; g < o.group; ++g)
      reqs.push_back({examples[size_t(p)].prompt, uint32_t(p * o.group + g)});
  model::SamplerConfig sc = sampler.config();
  sc.temperature = o.temperature;
  sc.top_k = 0;
  sc.top_p = 1.0;
  sc.max_new = o.max_new;
  sc.seed = o.sample_seed;
  sc.eos = kEos;
  sc.max_batch = o.max_batch;
  sc.record_routing = o.record_routing;
  sampler.set_config(sc);
  return score_rollout(task, std::move(examples), sampler.generate(reqs), o);
}

EvalResult evaluate_greedy(model::Sampler& sampler, const Task& task, uint64_t task_seed,
                           int difficulty, int64_t n, int64_t max_new, int64_t max_batch,
                           Split split) {
  EvalResult r;
  if (n <= 0) return r;
  std::vector<Example> ex;
  std::vector<model::SampleRequest> reqs;
  for (int64_t i = 0; i < n; ++i) {
    ex.push_back(task.make(task_seed, uint64_t(i), difficulty, split));
    reqs.push_back({ex.back().prompt, uint32_t(i)});
  }
  model::SamplerConfig sc = sampler.config();
  sc.temperature = 1.0;
  sc.top_k = 1;  // the most likely token; sample_from_logprobs breaks ties to the lower id
  sc.top_p = 1.0;
  sc.max_new = max_new;
  sc.eos = kEos;
  sc.max_batch = max_batch;
  sc.record_routing = false;  // nothing to replay: no learner scores these
  sampler.set_config(sc);
  const std::vector<model::SampleResult> out = sampler.generate(reqs);
  int64_t len = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (task.reward(ex[size_t(i)], out[size_t(i)].tokens) == 1.0f) ++r.correct;
    if (!out[size_t(i)].eos) ++r.truncated;
    len += int64_t(out[size_t(i)].tokens.size());
  }
  r.prompts = n;
  r.accuracy = double(r.correct) / double(n);
  r.response_len_mean = double(len) / double(n);
  return r;
}

uint64_t rollout_sample_seed(uint64_t seed, int64_t step) {
  constexpr uint32_t kRolloutStream = 0x524C0003u;  // "RL" 3, beside the task streams
  const num::Philox4x32 w = num::philox_quad_words(seed, kRolloutStream, uint64_t(step));
  return uint64_t(w.v[0]) | (uint64_t(w.v[1]) << 32);
}

}  // namespace lockstep::rl
