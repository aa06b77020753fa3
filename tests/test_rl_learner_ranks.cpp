// The data-parallel learner step (src/rl/learner_ranks.h) on a tiny model: the same gradient slots
// give the same bits on 1, 2 and 4 ranks (fake transport), one slot on one rank is the plain
// forward / backward / AdamW step, the flat-gradient API round-trips, and replicas that differ are
// caught naming the rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lockstep/model/learner.h"
#include "lockstep/rl/trainer.h"
#include "rl/learner_ranks.h"
#include "tiny_model_util.h"

namespace lockstep {
namespace {

using rl::detail::LearnerRanks;
using rl::detail::LearnerReplica;

const Recipe& bf16() { return builtin_recipe_or_throw("bf16", "test").recipe; }

model::ModelWeights weights(uint64_t seed = 7) {
  return test::tiny_weights(test::tiny_config({.moe = true}), seed);
}

// R prompt + response pairs of different lengths (token ids < 16).
struct Batch {
  std::vector<std::vector<int32_t>> prompts, responses;
  std::vector<rl::SequenceView> seqs;
  rl::PackedSequences all;
  explicit Batch(int64_t R) {
    for (int64_t i = 0; i < R; ++i) {
      prompts.push_back({1, int32_t(3 + i % 5), 4, int32_t(5 + i % 3)});
      std::vector<int32_t> r;
      for (int64_t t = 0; t < 1 + (i * 7) % 5; ++t) r.push_back(int32_t(4 + (i + 3 * t) % 11));
      r.push_back(2);
      responses.push_back(r);
    }
    for (int64_t i = 0; i < R; ++i) seqs.push_back({prompts[size_t(i)], responses[size_t(i)]});
    all = rl::pack_sequences(seqs);
  }
  rl::detail::StepBatch step() const {
    rl::detail::StepBatch b;
    b.seqs = seqs;
    b.all = &all;
    b.temperature = 1.0;
    b.mode = model::ExecMode::kDeterministic;
    return b;
  }
};

std::unique_ptr<LearnerRanks> make_ranks(int n, int64_t slots, const model::ModelWeights& w) {
  std::vector<LearnerReplica> reps;
  for (int r = 0; r < n; ++r) {
    model::DecoderWeights dw;
    dw.config = w.config;
    dw.plan = model::plan_for(w.config, bf16());
    for (const auto& [name, t] : w.tensors) dw.tensors[name] = t.clone();
    reps.push_back({std::make_unique<model::Learner>(w, bf16()),
                    std::make_unique<model::Decoder>(std::move(dw))});
  }
  return std::make_unique<LearnerRanks>(
      std::move(reps),
      n == 1 ? dist::make_solo_rank_group(Device::cpu()) : dist::make_fake_rank_group(n), slots);
}

// A loss whose gradient depends on logp_new: d/dlogp = -exp(logp) * (1 + t % 3) / T.
std::vector<float> toy_grad(std::span<const float> logp) {
  std::vector<float> g(logp.size());
  for (size_t t = 0; t < g.size(); ++t)
    g[t] = -std::exp(logp[t]) * float(1 + t % 3) / float(g.size());
  return g;
}

std::vector<std::byte> masters_bytes(const model::Learner& l) {
  std::vector<std::byte> out;
  for (const auto& [name, t] : l.weights().tensors) {
    const auto b = t.bytes();
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

// Three RL steps (K = 1, 2, 1 minibatches); returns the per-token values of every step and the
// final masters.
struct Trace {
  std::vector<std::vector<float>> values;
  std::vector<std::byte> masters;
  std::vector<double> grad_norms;
};

Trace train(int ranks, int64_t slots) {
  auto lr = make_ranks(ranks, slots, weights());
  const Batch batch(8);
  Trace tr;
  for (int64_t K : {1, 2, 1}) {
    const rl::detail::StepLogprobs lp = lr->logprobs(batch.step());
    tr.values.push_back(lp.logp_old);
    tr.values.push_back(lp.entropy);
    tr.values.push_back(lp.logp_ref);
    std::vector<std::vector<float>> seen(static_cast<size_t>(K));
    const auto stats = lr->update(batch.step(), K, lp.logp_old,
                                  [&](int rank, int64_t c, std::span<const float> logp_new) {
                                    if (rank == 0)
                                      seen[size_t(c)].assign(logp_new.begin(), logp_new.end());
                                    return toy_grad(logp_new);
                                  });
    for (const auto& s : seen) tr.values.push_back(s);
    for (const auto& s : stats) tr.grad_norms.push_back(s.grad_norm);
    lr->check_replicas();
  }
  tr.masters = masters_bytes(lr->lead());
  return tr;
}

TEST(RlLearnerRanks, OneTwoAndFourRanksGiveTheSameBits) {
  const Trace one = train(1, 4);
  ASSERT_EQ(one.grad_norms.size(), 4u);
  for (double g : one.grad_norms) EXPECT_GT(g, 0.0);
  for (int n : {2, 4}) {
    const Trace other = train(n, 4);
    EXPECT_EQ(other.values, one.values) << n << " ranks";
    EXPECT_EQ(other.grad_norms, one.grad_norms) << n << " ranks";
    EXPECT_TRUE(other.masters == one.masters) << n << " ranks";
  }
  // Another slot count reassociates the gradient sums: other bits (so the slots are real).
  EXPECT_FALSE(train(1, 1).masters == one.masters);
}

TEST(RlLearnerRanks, OneSlotIsThePlainForwardBackwardStep) {
  const Batch batch(8);
  const Trace ranks = train(1, 1);
  model::Learner plain(weights(), bf16());
  const auto tok = [](const std::vector<int32_t>& v) {
    return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, DType::kI32);
  };
  for (int64_t K : {1, 2, 1}) {
    const int64_t per = 8 / K;
    for (int64_t c = 0; c < K; ++c) {
      const rl::PackedSequences p =
          rl::pack_sequences(std::span(batch.seqs).subspan(size_t(c * per), size_t(per)));
      const model::LearnerOutput o = plain.forward(tok(p.tokens), p.cu_seqlens, tok(p.targets));
      std::vector<float> logp;
      for (int64_t row : p.rows) logp.push_back(o.logp.data<float>()[size_t(row)]);
      const std::vector<float> g = toy_grad(logp);
      std::vector<float> d(p.tokens.size(), 0.0f);
      for (size_t t = 0; t < p.rows.size(); ++t) d[size_t(p.rows[t])] = g[t];
      plain.backward(Tensor::from_vector<float>(d, {int64_t(d.size())}, DType::kF32), Tensor());
      plain.step();
    }
  }
  EXPECT_TRUE(masters_bytes(plain) == ranks.masters);
}

TEST(RlLearnerRanks, FlatGradientsRoundTripInNameOrder) {
  model::Learner l(weights(), bf16());
  const Batch batch(3);
  const auto tok = [](const std::vector<int32_t>& v) {
    return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, DType::kI32);
  };
  const model::LearnerOutput o =
      l.forward(tok(batch.all.tokens), batch.all.cu_seqlens, tok(batch.all.targets));
  l.backward(Tensor::from_vector<float>(std::vector<float>(batch.all.tokens.size(), -0.5f),
                                        {int64_t(batch.all.tokens.size())}, DType::kF32),
             Tensor());
  const Tensor flat = l.gradient_flat();
  ASSERT_EQ(flat.numel(), l.gradient_numel());
  int64_t off = 0;
  std::map<std::string, Tensor> before;
  for (const auto& [name, g] : l.grads()) {
    before[name] = g.clone();
    EXPECT_EQ(std::memcmp(flat.ptr<float>() + off, g.ptr<float>(), g.nbytes()), 0) << name;
    off += g.numel();
  }
  l.zero_grad();
  l.set_gradient_flat(flat);
  for (const auto& [name, g] : l.grads())
    EXPECT_EQ(std::memcmp(before[name].ptr<float>(), g.ptr<float>(), g.nbytes()), 0) << name;
  EXPECT_THROW(l.set_gradient_flat(Tensor(DType::kF32, {3})), std::invalid_argument);
}

TEST(RlLearnerRanks, ReplicasThatDifferAreCaughtNamingTheRank) {
  std::vector<LearnerReplica> reps;
  for (uint64_t seed : {7, 7, 8})
    reps.push_back({std::make_unique<model::Learner>(weights(seed), bf16()), nullptr});
  reps.push_back({std::make_unique<model::Learner>(weights(7), bf16()), nullptr});
  LearnerRanks lr(std::move(reps), dist::make_fake_rank_group(4), 4);
  try {
    lr.check_replicas();
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(train(2, 2));  // equal replicas pass (train checks every step)
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

TEST(RlLearnerRanks, TrainOptionsRefuseSlotsAndRanksThatDoNotFit) {
  rl::TrainOptions o;
  o.prompts = 4;
  o.group = 4;
  o.max_new = 4;
  o.difficulty = 1;
  const auto refused = [&](const char* needle) {
    try {
      o.validate();
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  o.grad_slots = 16;
  o.learner_ranks = 4;
  EXPECT_NO_THROW(o.validate());
  o.grad_slots = 3;
  refused("--grad-slots 3 must be a power of two");
  o.grad_slots = 32;
  refused("--grad-slots 32 is more than the 16 sequences of a minibatch");
  o.grad_slots = 2;
  refused("--grad-slots 2 is not a multiple of the 4 learner ranks");
  o.grad_slots = 4;
  o.learner_ranks = 3;
  refused("3 learner ranks: the rank count must be a power of two");
  // grad_slots is part of the run's identity (run_meta "options"), the rank count is not.
  o.learner_ranks = 2;
  const Json j = rl::options_to_json(o);
  EXPECT_EQ(j.at("grad_slots"), 4);
  EXPECT_FALSE(j.contains("learner_ranks"));
  EXPECT_EQ(rl::options_from_json(j, "test").grad_slots, 4);
}

}  // namespace
}  // namespace lockstep
