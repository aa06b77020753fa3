// Tests of TRIAGE: every gate threshold at and just past its boundary (-1.5, -0.5, -6), tail
// counts k = 0..3, the min of the two weights, only negative-delta tokens gated, 64-token
// segment boundaries relative to each response's start, masked tokens, the repair term's
// activation, value and gradient on 128-token segments; the options (other thresholds, weights
// and segment lengths, refused values); guard `triage` as TIS + gate + repair and `triage-gate`
// as the gate alone; and the statistics of minibatches merged into those of the whole batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "lockstep/rl/objectives.h"
#include "rl_test_util.h"

using namespace lockstep::rl;
using lockstep::rl::testing::offsets_of;

namespace {

// Gate weights of one response with advantage adv.
std::vector<double> gate(const std::vector<double>& delta, double adv = -1.0,
                         std::vector<uint8_t> mask = {}, TriageGateStats* st = nullptr) {
  if (mask.empty()) mask.assign(delta.size(), 1);
  const std::vector<int64_t> off = {0, int64_t(delta.size())};
  const std::vector<double> a = {adv};
  return triage_gate_weights<double>(off, delta, mask, a, st);
}

double below(double x) { return std::nextafter(x, -INFINITY); }
double above(double x) { return std::nextafter(x, INFINITY); }

}  // namespace

TEST(RlTriageGate, MeanGapThresholds) {
  // All 64 tokens equal, so the mean is exactly that value.
  EXPECT_EQ(gate(std::vector<double>(64, -1.5))[0], 0.3);         // -1.5 is in [-1.5, -0.5)
  EXPECT_EQ(gate(std::vector<double>(64, below(-1.5)))[0], 0.1);  // just below -1.5
  EXPECT_EQ(gate(std::vector<double>(64, -0.5))[0], 1.0);         // -0.5 is not < -0.5
  EXPECT_EQ(gate(std::vector<double>(64, below(-0.5)))[0], 0.3);
  EXPECT_EQ(gate(std::vector<double>(64, above(-1.5)))[0], 0.3);
  EXPECT_EQ(gate(std::vector<double>(64, -5.0))[0], 0.1);
}

TEST(RlTriageGate, TailCountAtMinusSixExactly) {
  // One token at exactly -6 is not in the tail (strict <); the mean stays > -0.5.
  std::vector<double> d(64, 0.0);
  d[10] = -6.0;
  TriageGateStats st;
  std::vector<double> w = gate(d, -1.0, {}, &st);
  EXPECT_EQ(w[10], 1.0);
  EXPECT_EQ(st.tail_segments, 0);
  // k = 1: tail weight 1 - 0.9 * 0.5 = 0.55, on the negative-delta tokens only.
  d[10] = below(-6.0);
  w = gate(d, -1.0, {}, &st);
  EXPECT_EQ(w[10], 0.55);
  EXPECT_EQ(w[11], 1.0);  // delta 0: not negative, keeps 1
  EXPECT_EQ(st.tail_segments, 1);
  EXPECT_EQ(st.gated_tokens, 1);
}

TEST(RlTriageGate, TailWeightForKZeroToThree) {
  // Mean kept above -0.5 by positive tokens so only the tail term acts.
  for (int k = 0; k <= 3; ++k) {
    std::vector<double> d(64, 0.5);
    for (int j = 0; j < k; ++j) d[size_t(j)] = -7.0;
    d[40] = -0.25;  // a mildly negative token, gated with the same segment weight
    const std::vector<double> w = gate(d);
    const double want = std::vector<double>{1.0, 0.55, 0.1, 0.1}[size_t(k)];  // 1 - 0.9 min(k/2, 1)
    for (int j = 0; j < k; ++j) EXPECT_EQ(w[size_t(j)], want) << "k " << k;
    EXPECT_EQ(w[40], want) << "k " << k;
    EXPECT_EQ(w[50], 1.0) << "positive delta keeps 1";
  }
}

TEST(RlTriageGate, TheSmallerWeightApplies) {
  // mean in [-1.5, -0.5) (0.3) with k = 1 (0.55): 0.3.
  std::vector<double> d(64, -1.0);
  d[0] = -7.0;
  d[1] = 6.0;  // mean = (-62 - 7 + 6) / 64 = -0.984...
  std::vector<double> w = gate(d);
  EXPECT_EQ(w[0], 0.3);
  EXPECT_EQ(w[2], 0.3);
  EXPECT_EQ(w[1], 1.0);
  // mean in [-1.5, -0.5) (0.3) with k = 2 (0.1): 0.1.
  d[1] = -7.0;
  for (size_t j = 2; j < 64; ++j) d[j] = -0.6;
  w = gate(d);
  EXPECT_EQ(w[5], 0.1);
}

TEST(RlTriageGate, OnlyNegativeAdvantageResponses) {
  const std::vector<double> d(64, -3.0);
  EXPECT_EQ(gate(d, 0.0)[0], 1.0);
  EXPECT_EQ(gate(d, 0.5)[0], 1.0);
  EXPECT_EQ(gate(d, -1e-9)[0], 0.1);
}

TEST(RlTriageGate, SegmentBoundaryAt64Tokens) {
  // 65 tokens: the 65th is a segment of its own.
  std::vector<double> d(65, 0.0);
  d[64] = -2.0;
  std::vector<double> w = gate(d);
  EXPECT_EQ(w[63], 1.0);
  EXPECT_EQ(w[64], 0.1);
  // Token 63 bad, 64 fine: token 63's segment mean is -2/64, not gated; 64's segment unaffected.
  std::vector<double> e(128, 0.0);
  for (size_t j = 0; j < 64; ++j) e[j] = -1.0;  // first segment mean -1 -> 0.3
  w = gate(e);
  EXPECT_EQ(w[63], 0.3);
  EXPECT_EQ(w[64], 1.0);
}

TEST(RlTriageGate, SegmentsStartAtEachResponse) {
  // Response 0 has 10 tokens, response 1 has 70: response 1's first segment is its tokens
  // 0..63 (global 10..73), the second its tokens 64..69 (global 74..79).
  const std::vector<int64_t> off = offsets_of({10, 70});
  std::vector<double> d(80, 0.0);
  for (size_t t = 74; t < 80; ++t) d[t] = -1.0;
  const std::vector<uint8_t> mask(80, 1);
  const std::vector<double> adv = {-1.0, -1.0};
  const std::vector<double> w = triage_gate_weights<double>(off, d, mask, adv);
  EXPECT_EQ(w[73], 1.0);
  for (size_t t = 74; t < 80; ++t) EXPECT_EQ(w[t], 0.3) << t;
}

TEST(RlTriageGate, MaskedTokensCountNowhere) {
  std::vector<double> d(64, 0.0);
  std::vector<uint8_t> m(64, 1);
  d[3] = -100.0;  // masked: not in the mean, not in k
  m[3] = 0;
  d[4] = -0.5;
  TriageGateStats st;
  std::vector<double> w = gate(d, -1.0, m, &st);
  EXPECT_EQ(w[3], 0.0);
  EXPECT_EQ(w[4], 1.0);
  EXPECT_EQ(st.tail_segments, 0);
  // Only masked tokens in a segment: it is skipped.
  std::vector<double> e(70, -9.0);
  std::vector<uint8_t> em(70, 1);
  for (size_t j = 64; j < 70; ++j) em[j] = 0;
  w = gate(e, -1.0, em, &st);
  EXPECT_EQ(st.segments, 1);
  EXPECT_EQ(w[0], 0.1);
  EXPECT_EQ(w[65], 0.0);
  // Mean over the valid tokens only: 32 valid at -1.5 and 32 masked at +100 -> mean -1.5.
  std::vector<double> f(64, -1.5);
  std::vector<uint8_t> fm(64, 1);
  for (size_t j = 32; j < 64; ++j) {
    f[j] = 100.0;
    fm[j] = 0;
  }
  EXPECT_EQ(gate(f, -1.0, fm)[0], 0.3);
}

TEST(RlTriageGate, NormalisesTheResponseLossOverGatedWeights_GateAlone) {
  // One negative response of 64 tokens: 32 with delta 0 (w 1), 32 with delta -2 (mean -1: 0.3).
  // ratio 1, A = -1 so l = 1 on every token; loss = sum w l / sum w = 1 whatever the weights,
  // and the gradient of token t is w_t / sum w.
  const size_t T = 64;
  std::vector<double> lp(T, -1.0), smp(T, -1.0);
  for (size_t t = 32; t < T; ++t) smp[t] = 1.0;  // delta = old - sampler = -2
  const std::vector<int64_t> off = {0, int64_t(T)};
  const std::vector<uint8_t> mask(T, 1);
  const std::vector<double> adv = {-1.0};
  ObjectiveConfig cfg;
  cfg.guard = Guard::kTriageGate;
  const auto r = compute_objective<double>({off, lp, lp, smp, {}, mask, adv}, cfg);
  const double sum_w = 32 * 1.0 + 32 * 0.3;
  EXPECT_NEAR(r.loss, 1.0, 1e-15);
  EXPECT_NEAR(r.grad_logp_new[0], 1.0 / sum_w, 1e-15);
  EXPECT_NEAR(r.grad_logp_new[40], 0.3 / sum_w, 1e-15);
  EXPECT_EQ(r.stats.gate.gated_tokens, 32);
  EXPECT_EQ(r.stats.gate.gated_segments, 1);
  EXPECT_EQ(r.stats.tis.tokens, 0);  // the gate alone: no TIS, no repair
  EXPECT_EQ(r.stats.repair.segments, 0);
}

// Guard `triage` is the report's method: the same gate on an objective that carries TIS, plus
// the repair term. Same batch as above: the TIS weight of the gated tokens is e^-2 (delta -2),
// of the others 1; the loss is sum g w l / sum g.
TEST(RlTriageGate, TriageIsTisTimesTheGatePlusRepair) {
  const size_t T = 64;
  std::vector<double> lp(T, -1.0), smp(T, -1.0);
  for (size_t t = 32; t < T; ++t) smp[t] = 1.0;
  const std::vector<int64_t> off = {0, int64_t(T)};
  const std::vector<uint8_t> mask(T, 1);
  const std::vector<double> adv = {-1.0};
  ObjectiveConfig cfg;
  cfg.guard = Guard::kTriage;
  const auto r = compute_objective<double>({off, lp, lp, smp, {}, mask, adv}, cfg);
  const double w = std::exp(-2.0), sum_g = 32 * 1.0 + 32 * 0.3;
  EXPECT_NEAR(r.loss, (32 * 1.0 + 32 * 0.3 * w) / sum_g, 1e-15);
  EXPECT_NEAR(r.grad_logp_new[0], 1.0 / sum_g, 1e-15);
  EXPECT_NEAR(r.grad_logp_new[40], 0.3 * w / sum_g, 1e-15);
  EXPECT_EQ(r.stats.tis.tokens, 64);
  EXPECT_EQ(r.stats.gate.gated_tokens, 32);
  // A positive response in the same batch is repaired under triage, not under triage-gate.
  const std::vector<int64_t> off2 = {0, int64_t(T), int64_t(2 * T)};
  std::vector<double> lp2 = lp, smp2 = smp;
  lp2.insert(lp2.end(), T, -3.0);
  smp2.insert(smp2.end(), T, -1.0);  // delta -2 < margin -0.5
  const std::vector<uint8_t> mask2(2 * T, 1);
  const std::vector<double> adv2 = {-1.0, 1.0};
  const auto tri = compute_objective<double>({off2, lp2, lp2, smp2, {}, mask2, adv2}, cfg);
  EXPECT_EQ(tri.stats.repair.active_segments, 1);
  EXPECT_GT(tri.stats.repair_loss, 0);
  cfg.guard = Guard::kTriageGate;
  const auto gate_only = compute_objective<double>({off2, lp2, lp2, smp2, {}, mask2, adv2}, cfg);
  EXPECT_EQ(gate_only.stats.repair.segments, 0);
  EXPECT_EQ(gate_only.stats.repair_loss, 0);
  EXPECT_EQ(gate_only.stats.gate.gated_tokens, tri.stats.gate.gated_tokens);
}

TEST(RlTriageGate, OptionsMoveThresholdsWeightsAndSegments) {
  GateOptions o;
  o.segment = 32;
  o.mild_gap = -0.25;
  o.severe_gap = -1.0;
  o.tail_gap = -3.0;
  o.mild_weight = 0.5;
  o.severe_weight = 0.2;
  o.tail1_weight = 0.7;
  o.tail2_weight = 0.4;
  const std::vector<int64_t> off = {0, 64};
  const std::vector<uint8_t> mask(64, 1);
  const std::vector<double> adv = {-1.0};
  // Segment 0 (tokens 0..31): mean -0.5 -> mild (0.5). Segment 1: mean -1 exactly -> mild too
  // (-1 is not < -1); with one token below -3 -> min(0.5, 0.7).
  std::vector<double> d(64, -0.5);
  for (size_t t = 32; t < 64; ++t) d[t] = -1.0;
  std::vector<double> w = triage_gate_weights<double>(off, d, mask, adv, nullptr, o);
  EXPECT_EQ(w[0], 0.5);
  EXPECT_EQ(w[32], 0.5);
  d[33] = -3.5;
  d[34] = 1.5;  // keeps the mean at -1
  w = triage_gate_weights<double>(off, d, mask, adv, nullptr, o);
  EXPECT_EQ(w[33], 0.5);
  d[35] = -3.5;
  d[36] = 1.5;  // two tail tokens: 0.4 < 0.5
  TriageGateStats st;
  w = triage_gate_weights<double>(off, d, mask, adv, &st, o);
  EXPECT_EQ(w[32], 0.4);
  EXPECT_EQ(st.segments, 2);
  EXPECT_EQ(st.tail_segments, 1);
  // Below the severe threshold.
  std::fill(d.begin(), d.end(), below(-1.0));
  w = triage_gate_weights<double>(off, d, mask, adv, nullptr, o);
  EXPECT_EQ(w[0], 0.2);
  // Refused options name the rule.
  for (auto [field, value, needle] :
       {std::tuple{0, 0.0, "segment length 0"}, std::tuple{1, -2.0, "severe gap"},
        std::tuple{2, 1.5, "mild weight 1.5"}, std::tuple{3, -0.1, "tail weight (k >= 2) -0.1"}}) {
    GateOptions b;
    if (field == 0) b.segment = 0;
    if (field == 1) b.mild_gap = value;  // below severe -1.5... -2 < -1.5: severe > mild
    if (field == 2) b.mild_weight = value;
    if (field == 3) b.tail2_weight = value;
    try {
      triage_gate_weights<double>(off, d, mask, adv, nullptr, b);
      ADD_FAILURE() << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

TEST(RlTriageRepair, SegmentLengthIsAnOption) {
  // 64 tokens, repair segments of 32: the second half alone is short of the margin.
  const size_t T = 64;
  std::vector<double> lp_new(T, -1.0), smp(T, -1.0);
  for (size_t t = 32; t < T; ++t) lp_new[t] = -2.0;  // mean delta -1 there
  const std::vector<int64_t> off = {0, int64_t(T)};
  const std::vector<uint8_t> mask(T, 1);
  std::vector<double> grad(T, 0.0);
  RepairOptions opt;
  opt.segment = 32;
  RepairStats st;
  triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{1.0}, opt, 1, grad, &st);
  EXPECT_EQ(st.segments, 2);
  EXPECT_EQ(st.active_segments, 1);
  EXPECT_EQ(grad[0], 0.0);
  EXPECT_LT(grad[40], 0.0);
  opt.segment = 128;  // one segment of mean -0.5: at the margin, inactive
  triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{1.0}, opt, 1, grad, &st);
  EXPECT_EQ(st.segments, 1);
  EXPECT_EQ(st.active_segments, 0);
  opt.segment = 0;
  EXPECT_THROW(
      triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{1.0}, opt, 1, grad),
      std::invalid_argument);
}

// The trainer splits a batch into minibatches of whole responses and merges what each
// objective call applied: on the first optimizer step (logp_new = logp_old) the merged counts
// equal those of one call over the whole batch, with any number of minibatches.
TEST(RlTriageStats, MinibatchStatsMergeIntoTheWholeBatch) {
  const uint64_t seed = lockstep::rl::testing::test_seed();
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(0, 1);
  const int R = 12;
  ObjectiveConfig cfg;
  cfg.guard = Guard::kTriage;
  // A random batch of 12 responses; drawn again (from the same generator) until TIS clips, the
  // gate gates and the repair acts somewhere, so that every statistic below is non-trivial.
  std::vector<int64_t> off;
  std::vector<double> old, smp, adv;
  std::vector<uint8_t> mask;
  ObjectiveResultT<double> whole;
  int draws = 0;
  for (; draws < 100; ++draws) {
    std::vector<int64_t> lens;
    for (int i = 0; i < R; ++i) lens.push_back(1 + int64_t(u(g) * 300));
    off = offsets_of(lens);
    old.clear(), smp.clear(), adv.clear(), mask.clear();
    for (int i = 0; i < R; ++i) adv.push_back(i % 3 == 0 ? 0.0 : u(g) < 0.5 ? -1.0 : 1.0);
    for (int64_t t = 0; t < off.back(); ++t) {
      old.push_back(-3 * u(g));
      const double gap = u(g) < 0.05 ? -8 * u(g) - 4 : (u(g) < 0.5 ? -2.5 : 1.5) * u(g);
      smp.push_back(old.back() - gap);
      mask.push_back(u(g) < 0.95);
    }
    whole = compute_objective<double>({off, old, old, smp, {}, mask, adv}, cfg);
    if (whole.stats.gate.gated_tokens > 0 && whole.stats.repair.active_segments > 0 &&
        whole.stats.tis.clipped > 0)
      break;
  }
  ASSERT_LT(draws, 100) << "no batch in 100 draws made TIS, the gate and the repair all act; seed "
                        << seed;
  for (int K : {2, 3, 4, 6}) {
    TisStats tis;
    TriageGateStats gate;
    RepairStats rep;
    const int per = R / K;
    for (int c = 0; c < K; ++c) {
      const int64_t t0 = off[size_t(c * per)], t1 = off[size_t(c * per + per)];
      std::vector<int64_t> o;
      for (int i = 0; i <= per; ++i) o.push_back(off[size_t(c * per + i)] - t0);
      const auto sl = [&](const std::vector<double>& v) {
        return std::vector<double>(v.begin() + t0, v.begin() + t1);
      };
      const std::vector<double> a(adv.begin() + c * per, adv.begin() + c * per + per);
      const std::vector<uint8_t> m(mask.begin() + t0, mask.begin() + t1);
      const std::vector<double> so = sl(old), ss = sl(smp);
      const auto part = compute_objective<double>({o, so, so, ss, {}, m, a}, cfg);
      accumulate(tis, part.stats.tis);
      accumulate(gate, part.stats.gate);
      accumulate(rep, part.stats.repair);
    }
    EXPECT_EQ(tis.tokens, whole.stats.tis.tokens) << K;
    EXPECT_EQ(tis.clipped, whole.stats.tis.clipped) << K;
    EXPECT_EQ(tis.weight_max, whole.stats.tis.weight_max) << K;
    EXPECT_NEAR(tis.weight_mean, whole.stats.tis.weight_mean, 1e-12) << K;
    EXPECT_DOUBLE_EQ(tis.clip_frac, whole.stats.tis.clip_frac) << K;
    EXPECT_EQ(gate.segments, whole.stats.gate.segments) << K;
    EXPECT_EQ(gate.gated_segments, whole.stats.gate.gated_segments) << K;
    EXPECT_EQ(gate.tail_segments, whole.stats.gate.tail_segments) << K;
    EXPECT_EQ(gate.gated_tokens, whole.stats.gate.gated_tokens) << K;
    EXPECT_NEAR(gate.weight_mean, whole.stats.gate.weight_mean, 1e-12) << K;
    EXPECT_EQ(rep.segments, whole.stats.repair.segments) << K;
    EXPECT_EQ(rep.active_segments, whole.stats.repair.active_segments) << K;
  }
}

TEST(RlTriageRepair, ActivationValueAndGradient) {
  const size_t T = 128;
  std::vector<double> lp_new(T, -2.5), smp(T, -1.0);  // mean delta -1.5: x = -0.5 - -1.5 = 1
  const std::vector<int64_t> off = {0, int64_t(T)};
  const std::vector<uint8_t> mask(T, 1);
  std::vector<double> grad(T, 0.0);
  RepairOptions opt;
  RepairStats st;
  const double loss =
      triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{1.0}, opt, 1, grad, &st);
  EXPECT_NEAR(loss, 0.1 * (std::sqrt(2.0) - 1.0), 1e-15);
  EXPECT_NEAR(grad[0], -0.1 * (1.0 / std::sqrt(2.0)) / 128, 1e-15);  // raises logp_new
  EXPECT_EQ(st.active_segments, 1);
  // At the margin exactly: inactive.
  std::fill(lp_new.begin(), lp_new.end(), -1.5);  // mean delta -0.5
  std::fill(grad.begin(), grad.end(), 0.0);
  EXPECT_EQ(
      triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{1.0}, opt, 1, grad, &st),
      0.0);
  EXPECT_EQ(grad[0], 0.0);
  EXPECT_EQ(st.active_segments, 0);
  EXPECT_EQ(st.segments, 1);
  // Negative or zero advantage: never repaired.
  std::fill(lp_new.begin(), lp_new.end(), -9.0);
  for (double a : {0.0, -1.0}) {
    EXPECT_EQ(triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{a}, opt, 1, grad),
              0.0);
    EXPECT_EQ(grad[0], 0.0);
  }
}

TEST(RlTriageRepair, SegmentBoundaryAt128AndBoundedGradient) {
  // 129 tokens: segment 0 (128 tokens, delta 0, inactive), segment 1 (1 token, delta -100).
  const size_t T = 129;
  std::vector<double> lp_new(T, -1.0), smp(T, -1.0);
  lp_new[128] = -101.0;
  const std::vector<int64_t> off = {0, int64_t(T)};
  const std::vector<uint8_t> mask(T, 1);
  std::vector<double> grad(T, 0.0);
  RepairStats st;
  const double loss = triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{2.0},
                                            RepairOptions{}, 3, grad, &st);
  const double x = 99.5;
  EXPECT_NEAR(loss, 0.1 / (2 * 3) * (std::sqrt(1 + x * x) - 1), 1e-12);
  EXPECT_EQ(grad[127], 0.0);
  // |gradient| < weight * scale / (segments * responses): bounded however large the gap.
  EXPECT_LT(std::fabs(grad[128]), 0.1 / 6);
  EXPECT_NEAR(grad[128], -0.1 / 6 * x / std::sqrt(1 + x * x), 1e-15);
  EXPECT_EQ(st.segments, 2);
  EXPECT_EQ(st.active_segments, 1);
  // Disabled: nothing.
  RepairOptions off_opt;
  off_opt.enabled = false;
  std::fill(grad.begin(), grad.end(), 0.0);
  EXPECT_EQ(
      triage_repair<double>(off, lp_new, smp, mask, std::vector<double>{2.0}, off_opt, 3, grad),
      0.0);
  EXPECT_EQ(grad[128], 0.0);
}
