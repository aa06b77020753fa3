// Learner-sampler agreement (model/align.h).
#include "lockstep/model/align.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/numerics/philox.h"

namespace lockstep::model {

GapStats gap_stats(const std::vector<double>& delta) {
  GapStats g;
  g.tokens = int64_t(delta.size());
  if (delta.empty()) return g;
  std::vector<double> s = delta;
  std::sort(s.begin(), s.end());
  double sum = 0;
  for (double d : delta) {
    sum += std::fabs(d);
    g.max_abs = std::max(g.max_abs, std::fabs(d));
  }
  g.mean_abs = sum / double(delta.size());
  g.q05 = s[size_t(0.05 * double(s.size() - 1))];
  return g;
}

AlignResult align(const ModelWeights& w, const Recipe& recipe, const AlignOptions& o) {
  if (o.batch < 1 || o.max_new < 1 || o.min_prompt < 1 || o.max_prompt < o.min_prompt)
    throw std::invalid_argument(
        "align: batch and max_new must be >= 1 and 1 <= min_prompt <= max_prompt");
  const ModelConfig& c = w.config;
  // Prompts: lengths and tokens from Philox (stream 1000 + i), so a seed names the same batch.
  std::vector<SampleRequest> reqs;
  for (int64_t i = 0; i < o.batch; ++i) {
    const uint32_t st = 1000u + uint32_t(i);
    const int64_t span = o.max_prompt - o.min_prompt + 1;
    const int64_t len =
        o.min_prompt + int64_t(num::philox_element_word(o.seed, st, 0) % uint32_t(span));
    SampleRequest r;
    r.stream = uint32_t(i);
    for (int64_t j = 0; j < len; ++j)
      r.prompt.push_back(
          int32_t(num::philox_element_word(o.seed, st, uint64_t(j + 1)) % uint32_t(c.vocab_size)));
    reqs.push_back(std::move(r));
  }
  LearnerConfig lc;
  lc.mode = o.mode;
  lc.temperature = o.temperature;
  lc.device = o.device;
  lc.kv = o.learner_kv_match ? o.kv : KvDtype::kBf16;
  Learner learner(w, o.learner_recipe ? *o.learner_recipe : recipe, lc);
  SamplerConfig sc;
  sc.temperature = o.temperature;
  sc.max_new = o.max_new;
  sc.seed = o.seed;
  sc.kv = o.kv;
  sc.max_batch = o.alone ? 1 : o.batch;
  sc.eos = c.eos_token_id;
  sc.device = o.device;
  sc.mode = o.mode;
  sc.record_routing = o.routing_replay;
  if (o.routing_replay) require_moe_for_replay(c, "align --routing-replay");
  Sampler sampler(sc);
  sampler.load_policy(export_policy(w, recipe, learner.version()), learner.version(), recipe.name);
  const std::vector<SampleResult> res = sampler.generate(reqs);
  // Rescoring: sequence i is prompt + generated; targets are the next tokens.
  AlignResult out;
  std::vector<int32_t> ids, tg;
  std::vector<int64_t> cu{0};
  std::vector<std::pair<size_t, int64_t>> where;  // (result, first target index of its tokens)
  int64_t routed = 0, mismatched = 0;             // (row, MoE layer) pairs, routing_replay only
  // Learner log-prob - sampler log-prob of every generated token of the batch, into delta.
  const auto gaps = [&](const LearnerOutput& lo, std::vector<double>& delta) {
    const std::vector<float> lp = to_f32(lo.logp);
    for (const auto& [ri, t0] : where)
      for (size_t k = 0; k < res[ri].tokens.size(); ++k)
        delta.push_back(double(lp[size_t(t0) + k]) - double(res[ri].logprobs[k]));
  };
  auto flush = [&] {
    if (ids.empty()) return;
    const Tensor idt = Tensor::from_vector<int32_t>(ids, {int64_t(ids.size())}, DType::kI32);
    const Tensor tgt = Tensor::from_vector<int32_t>(tg, {int64_t(tg.size())}, DType::kI32);
    if (o.routing_replay) {
      // The batch's results are where's, in order: res[where.front().first ..].
      const Routing replay =
          replay_routing(c, std::span(res).subspan(where.front().first, where.size()), cu);
      gaps(learner.forward(idt, cu, tgt, &replay), out.delta);
      Routing own;
      gaps(learner.forward(idt, cu, tgt, nullptr, &own), out.delta_no_replay);
      for (size_t l = 0; l < own.layers.size(); ++l) {
        if (!own.layers[l].defined()) continue;
        const Tensor a = own.layers[l].to(Device::cpu()).contiguous();
        const int64_t k = a.size(1);
        for (int64_t r = 0; r < a.size(0); ++r) {
          const int32_t* x = a.ptr<int32_t>() + r * k;
          const int32_t* y = replay.layers[l].ptr<int32_t>() + r * k;
          ++routed;
          mismatched += !std::equal(x, x + k, y);
        }
      }
    } else {
      gaps(learner.forward(idt, cu, tgt), out.delta);
    }
    ids.clear();
    tg.clear();
    cu.assign(1, 0);
    where.clear();
  };
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<int32_t> seq = reqs[i].prompt;
    seq.insert(seq.end(), res[i].tokens.begin(), res[i].tokens.end());
    where.push_back({i, int64_t(ids.size() + reqs[i].prompt.size() - 1)});
    ids.insert(ids.end(), seq.begin(), seq.end() - 1);
    tg.insert(tg.end(), seq.begin() + 1, seq.end());
    cu.push_back(int64_t(ids.size()));
    if (o.alone) flush();
  }
  flush();
  out.stats = gap_stats(out.delta);
  if (o.routing_replay) {
    out.stats_no_replay = gap_stats(out.delta_no_replay);
    out.routing_mismatch = routed > 0 ? double(mismatched) / double(routed) : 0.0;
  }
  return out;
}

}  // namespace lockstep::model
