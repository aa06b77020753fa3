// Tests of GRPO advantages, the clipped surrogate (every ratio-clipping boundary), TIS clipping at
// 0 and at the cap, the k3 KL, both normalisations on hand-computed batches, and a float64
// central finite-difference check of the whole objective's gradient under every guard.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "lockstep/rl/objectives.h"
#include "rl_test_util.h"

using namespace lockstep::rl;
using lockstep::rl::testing::offsets_of;
using lockstep::rl::testing::test_seed;

TEST(RlGrpo, GroupNormalisedAdvantages) {
  const std::vector<float> r = {1, 0, 0, 0, 1, 1, 1, 1, 0.5f, 0.5f, 0, 1};
  const std::vector<float> a = grpo_advantages(r, 4);
  const double sd = std::sqrt(0.1875);  // population std of {1, 0, 0, 0}
  EXPECT_EQ(a[0], float(0.75 / (sd + 1e-6)));
  for (int i = 1; i < 4; ++i) EXPECT_EQ(a[size_t(i)], float(-0.25 / (sd + 1e-6)));
  for (int i = 4; i < 8; ++i) EXPECT_EQ(a[size_t(i)], 0.0f) << "all-equal group";
  const double sd3 = std::sqrt(0.125);  // {0.5, 0.5, 0, 1}: mean 0.5
  EXPECT_EQ(a[8], 0.0f);
  EXPECT_EQ(a[10], float(-0.5 / (sd3 + 1e-6)));
  EXPECT_EQ(a[11], float(0.5 / (sd3 + 1e-6)));
  GrpoOptions sample;
  sample.std_kind = StdKind::kSample;
  EXPECT_EQ(grpo_advantages(r, 4, sample)[0], float(0.75 / (0.5 + 1e-6)));
  GrpoOptions no_eps;
  no_eps.eps = 0;
  EXPECT_EQ(grpo_advantages(std::vector<float>{2, 2}, 2, no_eps)[0], 0.0f);  // 0/0 avoided
}

TEST(RlGrpo, BadInputThrows) {
  EXPECT_THROW(grpo_advantages(std::vector<float>(7, 0.f), 4), std::invalid_argument);
  EXPECT_THROW(grpo_advantages(std::vector<float>(4, 0.f), 0), std::invalid_argument);
  GrpoOptions sample;
  sample.std_kind = StdKind::kSample;
  EXPECT_THROW(grpo_advantages(std::vector<float>(4, 0.f), 1, sample), std::invalid_argument);
  EXPECT_THROW(grpo_advantages(std::vector<float>{0, NAN}, 2), std::invalid_argument);
}

TEST(RlClip, RatioBoundariesPositiveAdvantage) {
  const ClipOptions clip;  // [0.8, 1.28]
  const float hi = 1.0f + 0.28f;
  ASSERT_EQ(hi, 1.28f);
  auto at = clipped_surrogate<float>(hi, 1.0f, clip);  // on the bound: the gradient flows
  EXPECT_EQ(at.loss, -1.28f);
  EXPECT_EQ(at.dloss_dratio, -1.0f);
  EXPECT_FALSE(at.clipped_high);
  auto above = clipped_surrogate<float>(std::nextafter(hi, 2.0f), 1.0f, clip);
  EXPECT_EQ(above.loss, -1.28f);
  EXPECT_EQ(above.dloss_dratio, 0.0f);
  EXPECT_TRUE(above.clipped_high);
  EXPECT_FALSE(above.clipped_low);
  auto low = clipped_surrogate<float>(0.5f, 2.0f, clip);  // A > 0 is never clipped below
  EXPECT_EQ(low.loss, -1.0f);
  EXPECT_EQ(low.dloss_dratio, -2.0f);
  EXPECT_FALSE(low.clipped_low);
}

TEST(RlClip, RatioBoundariesNegativeAdvantage) {
  const ClipOptions clip;
  const float lo = 1.0f - 0.2f;
  ASSERT_EQ(lo, 0.8f);
  auto at = clipped_surrogate<float>(lo, -1.0f, clip);
  EXPECT_EQ(at.loss, 0.8f);
  EXPECT_EQ(at.dloss_dratio, 1.0f);
  EXPECT_FALSE(at.clipped_low);
  auto below = clipped_surrogate<float>(std::nextafter(lo, 0.0f), -1.0f, clip);
  EXPECT_EQ(below.loss, 0.8f);
  EXPECT_EQ(below.dloss_dratio, 0.0f);
  EXPECT_TRUE(below.clipped_low);
  auto high = clipped_surrogate<float>(3.0f, -0.5f, clip);  // A < 0 is never clipped above
  EXPECT_EQ(high.loss, 1.5f);
  EXPECT_EQ(high.dloss_dratio, 0.5f);
  EXPECT_FALSE(high.clipped_high);
  auto zero = clipped_surrogate<float>(5.0f, 0.0f, clip);
  EXPECT_EQ(zero.loss, 0.0f);
  EXPECT_EQ(zero.dloss_dratio, 0.0f);
  EXPECT_FALSE(zero.clipped_low || zero.clipped_high);
}

TEST(RlTis, ClipsAtZeroAndCap) {
  // deltas old - sampler: 0 (w 1), ln 3 (raw 3 -> 2), -200 (exp underflows to 0), masked.
  const std::vector<float> old = {-1.0f, -1.0f + std::log(3.0f), -200.0f, 5.0f};
  const std::vector<float> smp = {-1.0f, -1.0f, 0.0f, -5.0f};
  const std::vector<uint8_t> mask = {1, 1, 1, 0};
  TisStats st;
  const std::vector<float> w = tis_weights<float>(old, smp, mask, 2.0, &st);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], 2.0f);
  EXPECT_EQ(w[2], 0.0f);
  EXPECT_EQ(w[3], 0.0f);  // masked
  EXPECT_NEAR(st.weight_max, 3.0, 1e-5);
  EXPECT_DOUBLE_EQ(st.weight_mean, 1.0);  // (1 + 2 + 0) / 3
  EXPECT_DOUBLE_EQ(st.clip_frac, 1.0 / 3.0);
  // raw exactly at the cap is not counted as clipped
  TisStats at;
  const std::vector<float> one = tis_weights<float>(
      std::vector<float>{-2.0f}, std::vector<float>{-2.0f}, std::vector<uint8_t>{1}, 1.0, &at);
  EXPECT_EQ(one[0], 1.0f);
  EXPECT_EQ(at.clip_frac, 0.0);
  EXPECT_THROW(tis_weights<float>(old, smp, mask, 0.0), std::invalid_argument);
}

namespace {

// Two responses of two tokens; response 0 has A = 1, response 1 has A = -1.
struct Small {
  std::vector<int64_t> offsets = {0, 2, 4};
  std::vector<double> lp_new = {-1.0, -2.0, -0.5, -1.5};
  std::vector<double> lp_old = {-1.0, -2.0, -0.5, -1.5};
  std::vector<double> lp_smp = {-1.0, -2.0, -0.5, -1.5};
  std::vector<double> lp_ref = {-1.0, -2.0, -0.5, -1.5};
  std::vector<uint8_t> mask = {1, 1, 1, 1};
  std::vector<double> adv = {1.0, -1.0};
  ObjectiveInputsT<double> in() const {
    return {offsets, lp_new, lp_old, lp_smp, lp_ref, mask, adv};
  }
};

}  // namespace

TEST(RlObjective, ResponseNormalisationByHand) {
  Small s;
  s.mask[1] = 0;                       // response 0 keeps one valid token
  s.lp_new[0] = -1.0 + std::log(1.1);  // ratio 1.1 on token 0
  ObjectiveConfig cfg;
  const auto r = compute_objective<double>(s.in(), cfg);
  // response 0: l = -1.1 (one token); response 1: tokens at ratio 1, A = -1: l = 1 each, mean 1.
  EXPECT_NEAR(r.loss, (-1.1 + 1.0) / 2, 1e-15);
  EXPECT_NEAR(r.grad_logp_new[0], -1.1 / 2, 1e-15);  // -A r / (1 token * 2 responses)
  EXPECT_EQ(r.grad_logp_new[1], 0.0);                // masked
  EXPECT_NEAR(r.grad_logp_new[2], 1.0 / 4, 1e-15);   // -A r / (2 tokens * 2 responses)
  EXPECT_NEAR(r.grad_logp_new[3], 1.0 / 4, 1e-15);
  EXPECT_EQ(r.stats.tokens, 3);
  EXPECT_EQ(r.stats.responses, 2);
  EXPECT_NEAR(r.stats.ratio_max, 1.1, 1e-15);
  // KL: only token 0 has ref != new (ref - new = -ln 1.1); response 1 contributes 0.
  EXPECT_NEAR(r.stats.kl, (1 / 1.1 + std::log(1.1) - 1) / 2, 1e-15);
}

TEST(RlObjective, TokenNormalisationByHand) {
  Small s;
  s.mask[1] = 0;
  ObjectiveConfig cfg;
  cfg.normalization = LossNormalization::kToken;
  const auto r = compute_objective<double>(s.in(), cfg);
  EXPECT_NEAR(r.loss, (-1.0 + 1.0 + 1.0) / 3, 1e-15);
  EXPECT_NEAR(r.grad_logp_new[0], -1.0 / 3, 1e-15);
  EXPECT_EQ(r.grad_logp_new[1], 0.0);
  EXPECT_NEAR(r.grad_logp_new[2], 1.0 / 3, 1e-15);
}

TEST(RlObjective, ClipFractionsAndZeroGradientWhenClipped) {
  Small s;
  s.lp_new[0] = s.lp_old[0] + std::log(1.5);  // A = 1, ratio 1.5 > 1.28: clipped high
  s.lp_new[2] = s.lp_old[2] + std::log(0.5);  // A = -1, ratio 0.5 < 0.8: clipped low
  const auto r = compute_objective<double>(s.in(), ObjectiveConfig{});
  EXPECT_EQ(r.grad_logp_new[0], 0.0);
  EXPECT_EQ(r.grad_logp_new[2], 0.0);
  EXPECT_NE(r.grad_logp_new[1], 0.0);
  EXPECT_DOUBLE_EQ(r.stats.clip_frac_high, 0.25);
  EXPECT_DOUBLE_EQ(r.stats.clip_frac_low, 0.25);
  // response 0: (-1.28 - 1) / 2; response 1: (0.8 + 1) / 2
  EXPECT_NEAR(r.loss, ((-1.28 - 1.0) / 2 + (0.8 + 1.0) / 2) / 2, 1e-15);
}

TEST(RlObjective, KlK3ValueAndGradient) {
  Small s;
  s.adv = {0.0, 0.0};                               // policy term 0
  s.lp_ref = {-1.0 + 1.0, -2.0, -0.5, -1.5 - 0.5};  // ref - new = 1, 0, 0, -0.5
  ObjectiveConfig cfg;
  cfg.kl_coef = 0.5;
  const auto r = compute_objective<double>(s.in(), cfg);
  const double k_a = std::exp(1.0) - 2.0, k_b = std::exp(-0.5) + 0.5 - 1.0;
  const double kl = (k_a / 2 + k_b / 2) / 2;  // per-response means, averaged
  EXPECT_NEAR(r.stats.kl, kl, 1e-15);
  EXPECT_NEAR(r.loss, 0.5 * kl, 1e-15);
  EXPECT_NEAR(r.grad_logp_new[0], 0.5 * (1 - std::exp(1.0)) / 4, 1e-15);
  EXPECT_EQ(r.grad_logp_new[1], 0.0);
  EXPECT_NEAR(r.grad_logp_new[3], 0.5 * (1 - std::exp(-0.5)) / 4, 1e-15);
  // coefficient 0: the value is still reported, the loss and gradient do not include it
  cfg.kl_coef = 0;
  const auto r0 = compute_objective<double>(s.in(), cfg);
  EXPECT_NEAR(r0.stats.kl, kl, 1e-15);
  EXPECT_EQ(r0.loss, 0.0);
  EXPECT_EQ(r0.grad_logp_new[0], 0.0);
  // no reference: NaN, and a non-zero coefficient is refused
  s.lp_ref.clear();
  EXPECT_TRUE(std::isnan(compute_objective<double>(s.in(), ObjectiveConfig{}).stats.kl));
  cfg.kl_coef = 0.1;
  EXPECT_THROW(compute_objective<double>(s.in(), cfg), std::invalid_argument);
}

TEST(RlObjective, TisMultipliesTheTokenLossWithoutRenormalising) {
  Small s;
  s.lp_smp[0] = s.lp_old[0] - std::log(1.5);  // w = 1.5
  s.lp_smp[1] = s.lp_old[1] - 3.0;            // raw e^3 -> 2
  ObjectiveConfig cfg;
  cfg.guard = Guard::kTis;
  const auto r = compute_objective<double>(s.in(), cfg);
  // response 0: (1.5 * -1 + 2 * -1) / 2; response 1: (1 + 1) / 2
  EXPECT_NEAR(r.loss, ((-1.5 - 2.0) / 2 + 1.0) / 2, 1e-12);
  EXPECT_NEAR(r.grad_logp_new[0], -1.5 / 4, 1e-12);
  EXPECT_NEAR(r.grad_logp_new[1], -2.0 / 4, 1e-12);
  EXPECT_DOUBLE_EQ(r.stats.tis.clip_frac, 0.25);
}

TEST(RlObjective, InputErrorsNameTheField) {
  Small s;
  auto expect_msg = [&](const ObjectiveConfig& cfg, const char* needle) {
    try {
      compute_objective<double>(s.in(), cfg);
      ADD_FAILURE() << "no throw for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  s.lp_new[2] = NAN;
  expect_msg(ObjectiveConfig{}, "logp_new[2]");
  s.lp_new[2] = -0.5;
  s.mask[0] = 2;
  expect_msg(ObjectiveConfig{}, "mask[0] = 2");
  s.mask[0] = 0;
  s.lp_new[0] = NAN;  // masked: never read
  EXPECT_NO_THROW(compute_objective<double>(s.in(), ObjectiveConfig{}));
  s.offsets = {0, 3, 2};
  expect_msg(ObjectiveConfig{}, "offsets");
  s.offsets = {0, 2, 4};
  s.lp_smp.clear();
  ObjectiveConfig tis;
  tis.guard = Guard::kTis;
  expect_msg(tis, "guard 'tis' needs logp_sampler");
  EXPECT_EQ(parse_guard("triage-gate"), Guard::kTriageGate);
  EXPECT_EQ(guard_name(Guard::kTriageGate), "triage-gate");
  EXPECT_THROW(parse_guard("triage+tis"), std::invalid_argument);
  try {
    parse_guard("tis+triage");  // TRIAGE includes TIS: the name says so instead of aliasing
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("TIS + gate + repair"), std::string::npos) << e.what();
  }
}

namespace {

struct RandomBatch {
  std::vector<int64_t> offsets;
  std::vector<double> lp_new, lp_old, lp_smp, lp_ref, adv;
  std::vector<uint8_t> mask;
  ObjectiveInputsT<double> in() const {
    return {offsets, lp_new, lp_old, lp_smp, lp_ref, mask, adv};
  }
};

// Lengths cross the 64- and 128-token segment boundaries; sampler gaps include heavy negative
// tails so TRIAGE gates and repairs; ratios stay 1e-3 away from the clip bounds (kinks).
RandomBatch random_batch(uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> n(0, 1);
  RandomBatch b;
  std::vector<int64_t> lens;
  for (int i = 0; i < 6; ++i) lens.push_back(1 + int64_t(u(g) * 200));
  b.offsets = offsets_of(lens);
  for (int i = 0; i < 6; ++i) b.adv.push_back(i == 5 ? 0.0 : n(g));
  const size_t T = size_t(b.offsets.back());
  for (size_t t = 0; t < T; ++t) {
    const double old = -3 * u(g);
    double lr;
    do lr = 0.3 * n(g);
    while (std::fabs(std::exp(lr) - 0.8) < 1e-3 || std::fabs(std::exp(lr) - 1.28) < 1e-3);
    const double gap = u(g) < 0.05 ? -8 * u(g) - 4 : (u(g) < 0.5 ? -2.5 : 0.5) * u(g);
    b.lp_old.push_back(old);
    b.lp_new.push_back(old + lr);
    b.lp_smp.push_back(old - gap);
    b.lp_ref.push_back(old + 0.2 * n(g));
    b.mask.push_back(u(g) < 0.9);
  }
  // Response 0: a positive advantage and a sampler 1.5 nats above the learner on every token, so
  // the repair has an active segment whatever the seed; response 1: the same gap with a negative
  // advantage, so the gate weighs a segment down whatever the seed.
  b.adv[0] = 1.0 + std::fabs(b.adv[0]);
  b.adv[1] = -1.0 - std::fabs(b.adv[1]);
  for (int r = 0; r < 2; ++r)
    for (int64_t t = b.offsets[size_t(r)]; t < b.offsets[size_t(r) + 1]; ++t) {
      b.lp_smp[size_t(t)] += 1.5;
      b.mask[size_t(t)] = 1;  // every token of the two responses counts
    }
  return b;
}

}  // namespace

TEST(RlObjective, GradientMatchesFloat64FiniteDifferences) {
  const uint64_t seed = test_seed();
  const RandomBatch base = random_batch(seed);
  for (Guard guard : {Guard::kNone, Guard::kTis, Guard::kTriage, Guard::kTriageGate})
    for (LossNormalization norm : {LossNormalization::kResponse, LossNormalization::kToken}) {
      ObjectiveConfig cfg;
      cfg.guard = guard;
      cfg.normalization = norm;
      cfg.kl_coef = 0.1;
      const auto r = compute_objective<double>(base.in(), cfg);
      if (guard_has_gate(guard)) {
        ASSERT_GT(r.stats.gate.gated_tokens, 0)
            << "the batch must exercise the gate; seed " << seed;
      }
      if (guard_has_repair(guard)) {
        ASSERT_GT(r.stats.repair.active_segments, 0)
            << "the batch must exercise the repair; seed " << seed;
      }
      RandomBatch b = base;
      const double h = 1e-5;
      double worst = 0;
      for (size_t t = 0; t < b.lp_new.size(); ++t) {
        const double x = b.lp_new[t];
        b.lp_new[t] = x + h;
        const double lp = compute_objective<double>(b.in(), cfg).loss;
        b.lp_new[t] = x - h;
        const double lm = compute_objective<double>(b.in(), cfg).loss;
        b.lp_new[t] = x;
        const double fd = (lp - lm) / (2 * h);
        const double g = r.grad_logp_new[t];
        if (!b.mask[t]) {
          ASSERT_EQ(g, 0.0) << "masked token " << t << "; seed " << seed;
          ASSERT_EQ(lp, lm) << "masked token " << t << " changes the loss; seed " << seed;
        }
        // Truncation error ~h^2 |f'''|, rounding ~1e-16 |loss| / h: both far below the bound.
        ASSERT_NEAR(fd, g, 1e-9 + 1e-6 * std::fabs(g))
            << "token " << t << " guard " << guard_name(guard) << " norm " << int(norm)
            << "; replay with LOCKSTEP_TEST_SEED=" << seed;
        worst = std::max(worst, std::fabs(fd - g));
      }
      EXPECT_LT(worst, 1e-9 + 1e-6);
    }
}

TEST(RlObjective, FloatPathAgreesWithFloat64AndIsDeterministic) {
  const uint64_t seed = test_seed();
  const RandomBatch b = random_batch(seed);
  const auto cast = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  const std::vector<float> n = cast(b.lp_new), o = cast(b.lp_old), s = cast(b.lp_smp),
                           rf = cast(b.lp_ref), a = cast(b.adv);
  ObjectiveConfig cfg;
  cfg.guard = Guard::kTriage;
  cfg.kl_coef = 0.1;
  const ObjectiveInputs in{b.offsets, n, o, s, rf, b.mask, a};
  const ObjectiveResult r1 = compute_objective<float>(in, cfg);
  const ObjectiveResult r2 = compute_objective<float>(in, cfg);
  EXPECT_EQ(std::memcmp(r1.grad_logp_new.data(), r2.grad_logp_new.data(),
                        r1.grad_logp_new.size() * sizeof(float)),
            0);
  // The float inputs are the double ones rounded once; exp_f32 is within 2 ulp. A loose relative
  // agreement checks the float path computes the same function, not its last bits.
  std::vector<double> nd(n.begin(), n.end()), od(o.begin(), o.end()), sd(s.begin(), s.end()),
      rd(rf.begin(), rf.end()), ad(a.begin(), a.end());
  const auto d = compute_objective<double>({b.offsets, nd, od, sd, rd, b.mask, ad}, cfg);
  EXPECT_NEAR(r1.loss, d.loss, 1e-5 * (1 + std::fabs(d.loss))) << "seed " << seed;
  for (size_t t = 0; t < nd.size(); ++t)
    ASSERT_NEAR(r1.grad_logp_new[t], d.grad_logp_new[t],
                1e-5 * (1e-3 + std::fabs(d.grad_logp_new[t])))
        << "token " << t << " seed " << seed;
}
