// Routing replay (docs/rl.md "Routing replay"): the replay router op against router_topk and a
// plain loop; the sampler's recording against the learner's own routing (deterministic: equal);
// the learner with replay uses exactly the sampler's experts, for every row and MoE layer, also
// behind a sampler of another recipe; the deterministic gap stays exactly 0 with replay; a dense
// model is refused everywhere. The gradient check of the MoE block under replay is in
// test_nn_gradcheck.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "lockstep/model/align.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/ops/tensor_ops.h"
#include "lockstep/recipe/registry.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep::model;

namespace {

Recipe recipe(const char* name) { return builtin_recipe_or_throw(name, "test").recipe; }

template <class T>
Tensor random_logits(int64_t tokens, int64_t experts, uint32_t stream) {
  Tensor t(std::is_same_v<T, double> ? DType::kF64 : DType::kF32, {tokens, experts});
  for (int64_t i = 0; i < t.numel(); ++i)
    t.ptr<T>()[i] =
        T(4.0 *
          (double(num::philox_element_word(test::test_seed(), stream, uint64_t(i))) / 4294967296.0 -
           0.5));
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct Rollout {
  std::vector<SampleRequest> reqs;
  std::vector<SampleResult> res;
  std::vector<int32_t> ids, targets;  // prompt + tokens[:-1], and the next tokens
  std::vector<int64_t> cu{0};
};

// Samples `batch` prompts of mixed lengths with routing recorded, packed as align packs them.
Rollout sample_recorded(const ModelWeights& w, const Recipe& sampler_recipe, ExecMode mode,
                        int64_t batch) {
  Rollout r;
  for (int64_t i = 0; i < batch; ++i) {
    SampleRequest q;
    q.stream = uint32_t(i);
    for (int64_t j = 0; j < 2 + i % 4; ++j)
      q.prompt.push_back(
          int32_t(num::philox_element_word(test::test_seed(), 77, uint64_t(i * 8 + j)) %
                  uint32_t(w.config.vocab_size)));
    r.reqs.push_back(q);
  }
  SamplerConfig sc;
  sc.max_new = 6;
  sc.seed = test::test_seed();
  sc.mode = mode;
  sc.record_routing = true;
  sc.max_batch = 3;  // prefill and decode rows in one call, sequences joining as others leave
  Sampler s(sc);
  s.load_policy(export_policy(w, sampler_recipe, 0), 0, sampler_recipe.name);
  r.res = s.generate(r.reqs);
  for (size_t i = 0; i < r.reqs.size(); ++i) {
    std::vector<int32_t> seq = r.reqs[i].prompt;
    seq.insert(seq.end(), r.res[i].tokens.begin(), r.res[i].tokens.end());
    r.ids.insert(r.ids.end(), seq.begin(), seq.end() - 1);
    r.targets.insert(r.targets.end(), seq.begin() + 1, seq.end());
    r.cu.push_back(int64_t(r.ids.size()));
  }
  return r;
}

Tensor i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, DType::kI32);
}

}  // namespace

TEST(RouterReplay, TheRoutersOwnChoiceGivesItsBitsAndOtherIdsTheirProbabilities) {
  const int64_t T = 37, E = 8, k = 3;
  for (bool renorm : {true, false}) {
    for (bool f64 : {false, true}) {
      const Tensor logits = f64 ? random_logits<double>(T, E, 1) : random_logits<float>(T, E, 1);
      const ops::RouterOut top = ops::router_topk(logits, k, renorm);
      const ops::RouterOut rep = ops::router_replay(logits, top.expert_ids, renorm);
      EXPECT_TRUE(same_bits(top.probs, rep.probs));
      EXPECT_TRUE(same_bits(top.weights, rep.weights)) << "renorm " << renorm << " f64 " << f64;
      EXPECT_TRUE(same_bits(top.expert_ids, rep.expert_ids));
    }
    // Any ids (here the k least likely experts, in ascending id order): p[e_s], renormalised
    // over the slots in slot order.
    const Tensor logits = random_logits<double>(T, E, 2);
    const ops::RouterOut top = ops::router_topk(logits, E, renorm);  // every expert, by p
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> low(top.expert_ids.ptr<int32_t>() + t * E + (E - k),
                               top.expert_ids.ptr<int32_t>() + (t + 1) * E);
      std::sort(low.begin(), low.end());
      ids.insert(ids.end(), low.begin(), low.end());
    }
    const ops::RouterOut rep =
        ops::router_replay(logits, Tensor::from_vector<int32_t>(ids, {T, k}, DType::kI32), renorm);
    for (int64_t t = 0; t < T; ++t) {
      const double* p = top.probs.ptr<double>() + t * E;
      double sum = 0;
      for (int64_t s = 0; s < k; ++s) sum = sum + p[ids[size_t(t * k + s)]];
      for (int64_t s = 0; s < k; ++s) {
        const double want = renorm ? p[ids[size_t(t * k + s)]] / sum : p[ids[size_t(t * k + s)]];
        ASSERT_EQ(rep.weights.ptr<double>()[t * k + s], want) << "token " << t << " slot " << s;
      }
    }
  }
  const Tensor logits = random_logits<float>(2, 4, 3);
  EXPECT_THROW(ops::router_replay(logits,
                                  Tensor::from_vector<int32_t>(std::vector<int32_t>{0, 1, 2, 4},
                                                               {2, 2}, DType::kI32),
                                  true),
               std::out_of_range);
  EXPECT_THROW(
      ops::router_replay(
          logits, Tensor::from_vector<int32_t>(std::vector<int32_t>{0, 1, 2}, {1, 3}, DType::kI32),
          true),
      std::invalid_argument);
}

TEST(RoutingReplay, TheSamplersRecordingIsTheLearnersRoutingUnderOneContract) {
  // Deterministic, one recipe: learner == sampler bit for bit, so the learner's own experts are
  // the ones the sampler recorded, row for row (prefill rows, decode rows, every MoE layer).
  const ModelWeights w = init_weights(preset("tiny-moe"), test::test_seed());
  const Recipe r = recipe("nvfp4_per_token");
  const Rollout ro = sample_recorded(w, r, ExecMode::kDeterministic, 7);
  int64_t moe = 0;
  for (int64_t l = 0; l < w.config.num_hidden_layers; ++l) moe += w.config.layer_is_moe(l);
  const int64_t k = w.config.num_experts_per_tok;
  ASSERT_GT(moe, 0);
  for (size_t i = 0; i < ro.res.size(); ++i)
    ASSERT_EQ(int64_t(ro.res[i].routing.size()),
              int64_t(ro.reqs[i].prompt.size() + ro.res[i].tokens.size() - 1) * moe * k);
  LearnerConfig lc;
  lc.mode = ExecMode::kDeterministic;
  Learner learner(w, r, lc);
  Routing own;
  learner.forward(i32(ro.ids), ro.cu, i32(ro.targets), nullptr, &own);
  const Routing rec = replay_routing(w.config, ro.res, ro.cu);
  for (size_t l = 0; l < own.layers.size(); ++l) {
    ASSERT_EQ(own.layers[l].defined(), rec.layers[l].defined());
    if (own.layers[l].defined()) {
      EXPECT_TRUE(same_bits(own.layers[l], rec.layers[l])) << "layer " << l;
    }
  }
}

TEST(RoutingReplay, TheLearnerUsesExactlyTheSamplersExperts) {
  // A bf16 learner behind an NVFP4 sampler: their routers disagree on some rows; with replay the
  // learner's experts are the sampler's on every row and layer, in fast and deterministic mode.
  const ModelWeights w = init_weights(preset("tiny-moe"), test::test_seed());
  for (ExecMode mode : {ExecMode::kFast, ExecMode::kDeterministic}) {
    const Rollout ro = sample_recorded(w, recipe("nvfp4_per_token"), mode, 8);
    LearnerConfig lc;
    lc.mode = mode;
    Learner learner(w, recipe("bf16"), lc);
    const Routing replay = replay_routing(w.config, ro.res, ro.cu);
    Routing used, own;
    learner.forward(i32(ro.ids), ro.cu, i32(ro.targets), &replay, &used);
    learner.forward(i32(ro.ids), ro.cu, i32(ro.targets), nullptr, &own);
    int64_t differ = 0, rows = 0;
    for (size_t l = 0; l < replay.layers.size(); ++l) {
      if (!replay.layers[l].defined()) continue;
      EXPECT_TRUE(same_bits(used.layers[l], replay.layers[l])) << "layer " << l;
      const int64_t k = own.layers[l].size(1);
      for (int64_t t = 0; t < own.layers[l].size(0); ++t, ++rows)
        differ += !std::equal(own.layers[l].ptr<int32_t>() + t * k,
                              own.layers[l].ptr<int32_t>() + (t + 1) * k,
                              replay.layers[l].ptr<int32_t>() + t * k);
    }
    std::printf(
        "[ measured ] %s: the bf16 learner's own experts differ from the nvfp4 sampler's "
        "on %lld of %lld (row, layer) pairs; with replay on 0\n",
        std::string(exec_mode_name(mode)).c_str(), (long long)differ, (long long)rows);
  }
}

TEST(RoutingReplay, AlignReportsBothGapsAndTheDeterministicGapStaysZero) {
  const ModelWeights w = init_weights(preset("tiny-moe"), test::test_seed());
  AlignOptions o;
  o.batch = 6;
  o.max_new = 8;
  o.max_prompt = 9;
  o.seed = test::test_seed();
  o.routing_replay = true;
  for (bool alone : {false, true}) {
    o.mode = ExecMode::kDeterministic;
    o.alone = alone;
    const AlignResult same = align(w, recipe("nvfp4_per_token"), o);
    ASSERT_GT(same.stats.tokens, 0);
    EXPECT_EQ(same.stats.max_abs, 0.0) << "seed " << test::test_seed();
    EXPECT_EQ(same.stats_no_replay.max_abs, 0.0);
    EXPECT_EQ(same.routing_mismatch, 0.0);
  }
  // Another sampler recipe: both gaps over the same tokens (measured, printed; which is smaller
  // is what replay is for, not a property of every batch).
  o.alone = false;
  o.learner_recipe = recipe("bf16");
  for (ExecMode mode : {ExecMode::kFast, ExecMode::kDeterministic}) {
    o.mode = mode;
    const AlignResult r = align(w, recipe("nvfp4_per_token"), o);
    ASSERT_EQ(r.delta.size(), r.delta_no_replay.size());
    for (size_t i = 0; i < r.delta.size(); ++i)
      ASSERT_TRUE(std::isfinite(r.delta[i]) && std::isfinite(r.delta_no_replay[i]));
    std::printf(
        "[ measured ] bf16 learner, nvfp4_per_token sampler, %s: mean |gap| %.3e with "
        "replay, %.3e without; max |gap| %.3e / %.3e; routing mismatch %.2f%%\n",
        std::string(exec_mode_name(mode)).c_str(), r.stats.mean_abs, r.stats_no_replay.mean_abs,
        r.stats.max_abs, r.stats_no_replay.max_abs, 100.0 * r.routing_mismatch);
  }
}

TEST(RoutingReplay, ADenseModelIsRefusedNamingTheProblem) {
  const ModelWeights w = init_weights(preset("tiny-dense"), test::test_seed());
  const auto expect_refusal = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("has no MoE layer"), std::string::npos)
          << what << ": " << e.what();
    }
  };
  SamplerConfig sc;
  sc.record_routing = true;
  Sampler s(sc);
  s.load_policy(export_policy(w, recipe("bf16"), 0), 0, "bf16");
  const std::vector<SampleRequest> reqs{{{1, 2, 3}, 0}};
  expect_refusal([&] { s.generate(reqs); }, "sampler");
  Learner learner(w, recipe("bf16"));
  Routing replay;
  replay.layers.assign(size_t(w.config.num_hidden_layers), Tensor());
  const std::vector<int64_t> cu{0, 3};
  expect_refusal([&] { learner.forward(i32({1, 2, 3}), cu, i32({2, 3, 4}), &replay); }, "learner");
  AlignOptions o;
  o.routing_replay = true;
  expect_refusal([&] { align(w, recipe("bf16"), o); }, "align");
  expect_refusal([&] { replay_routing(w.config, {}, std::vector<int64_t>{0}); }, "replay_routing");
}
