// Token sampling (ops/sampling.h) on the CPU: the empirical distribution of many draws against the
// probabilities (plain, temperature, top-k, top-p), the inverse CDF on exact weights, greedy ties,
// rows without a distribution, the log-probs against token_logprobs, and the Tensor entry's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "lockstep/numerics/philox.h"
#include "lockstep/ops/sampling.h"
#include "lockstep/ops/tensor_ops.h"
#include "ops_test_util.h"

using namespace lockstep;
using namespace lockstep::ops;
using ops_test::SeedTrace;

namespace {

uint32_t sbits(float v) { return std::bit_cast<uint32_t>(v); }

struct Draws {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// `rows` draws from one row of logits: positions 0 .. rows-1 of one stream.
Draws draw(const std::vector<float>& row, int64_t rows, const SampleConfig& cfg,
           uint32_t stream = 3) {
  const int64_t V = int64_t(row.size());
  std::vector<float> x(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r) std::copy(row.begin(), row.end(), x.begin() + r * V);
  std::vector<uint32_t> st(size_t(rows), stream);
  std::vector<int64_t> pos(static_cast<size_t>(rows));
  std::iota(pos.begin(), pos.end(), 0);
  Draws d{std::vector<int32_t>(size_t(rows)), std::vector<float>(size_t(rows))};
  sample_tokens_cpu(x.data(), rows, V, st.data(), pos.data(), cfg, d.tokens.data(),
                    d.logprobs.data());
  return d;
}

// Probabilities of logits * float(1/t) in float64.
std::vector<double> probabilities(const std::vector<float>& row, double temperature) {
  const float inv = sampling_scale(temperature);
  double m = -INFINITY;
  for (float v : row) m = std::max(m, double(v * inv));
  std::vector<double> p(row.size());
  double s = 0;
  for (size_t j = 0; j < row.size(); ++j) s += p[j] = std::exp(double(row[j] * inv) - m);
  for (double& v : p) v /= s;
  return p;
}

// Every count within 6 standard deviations (plus one) of N p (a binomial per token; a false
// alarm about 2e-9 per token), and no token outside the support.
void expect_distribution(const std::vector<int32_t>& tokens, const std::vector<double>& p,
                         const char* what) {
  const double N = double(tokens.size());
  std::vector<double> count(p.size(), 0.0);
  for (int32_t t : tokens) {
    ASSERT_TRUE(t >= 0 && size_t(t) < p.size()) << what << ": token " << t;
    count[size_t(t)] += 1;
  }
  for (size_t j = 0; j < p.size(); ++j) {
    if (p[j] == 0) {
      EXPECT_EQ(count[j], 0) << what << ": token " << j << " has no mass";
      continue;
    }
    const double sd = std::sqrt(N * p[j] * (1 - p[j]));
    EXPECT_NEAR(count[j], N * p[j], 6 * sd + 1) << what << ": token " << j;
  }
}

}  // namespace

TEST(OpsSampling, UniformIsPhiloxWordZeroOfPositionAndStream) {
  for (const int64_t pos : {int64_t(0), int64_t(7), (int64_t(5) << 32) + 11})
    for (const uint32_t stream : {0u, 9u}) {
      const uint64_t seed = 0x0123456789ABCDEFull;
      const num::Philox4x32 w = num::philox4x32_10(
          {{uint32_t(pos), uint32_t(uint64_t(pos) >> 32), stream, 0u}}, 0x89ABCDEFu, 0x01234567u);
      EXPECT_EQ(sampling_uniform(seed, stream, pos), float(double(w.v[0] >> 8) / 16777216.0));
    }
}

// The empirical distribution of 200000 draws matches the probabilities of logits / temperature.
TEST(OpsSampling, DrawsFollowTheProbabilities) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const auto row = ops_test::uniform<float>(10, g, -2, 2);
  for (const double t : {1.0, 0.7, 1.6}) {
    SampleConfig cfg;
    cfg.temperature = t;
    cfg.seed = g();
    const Draws d = draw(row, 200000, cfg);
    expect_distribution(d.tokens, probabilities(row, t), "plain");
  }
}

// top-k renormalises over the k most likely tokens; top-p over the shortest prefix whose mass
// reaches top_p.
TEST(OpsSampling, TopKAndTopPDrawFromTheTruncatedDistribution) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  // Probabilities 1/2, 1/4, 1/8, ... (log2 spaced logits) in a shuffled order.
  std::vector<float> row(8);
  std::vector<int> order(8);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), g);
  for (int i = 0; i < 8; ++i) row[size_t(order[size_t(i)])] = -float(i) * std::log(2.0f);
  const std::vector<double> p = probabilities(row, 1.0);
  SampleConfig cfg;
  cfg.seed = g();
  cfg.top_k = 3;
  std::vector<double> q(8, 0.0);
  for (int i = 0; i < 3; ++i) q[size_t(order[size_t(i)])] = p[size_t(order[size_t(i)])];
  double s = q[size_t(order[0])] + q[size_t(order[1])] + q[size_t(order[2])];
  for (double& v : q) v /= s;
  expect_distribution(draw(row, 100000, cfg).tokens, q, "top_k 3");
  // top_p 0.8: 1/2 + 1/4 < 0.8 <= 1/2 + 1/4 + 1/8 (about 0.50, 0.25, 0.13 after the tail).
  cfg.top_k = 0;
  cfg.top_p = 0.8;
  expect_distribution(draw(row, 100000, cfg).tokens, q, "top_p 0.8");
  // Both: top_k 2 cuts first.
  cfg.top_k = 2;
  std::fill(q.begin(), q.end(), 0.0);
  q[size_t(order[0])] = 2.0 / 3.0;
  q[size_t(order[1])] = 1.0 / 3.0;
  expect_distribution(draw(row, 100000, cfg).tokens, q, "top_k 2 top_p 0.8");
}

// The inverse CDF on weights that sum exactly: every target picks floor(target / w).
TEST(OpsSampling, InverseCdfPicksTheFirstPrefixAboveTheTarget) {
  const int64_t n = 1024;  // 4 blocks of 256
  const float wv = 1.0f / 1024;
  const auto w = [&](int64_t) { return wv; };
  std::vector<float> P(4);
  for (int64_t b = 0; b < 4; ++b) P[size_t(b)] = sample_block_sum(w, b * 256, (b + 1) * 256);
  sample_prefix_chain(P.data(), 4);
  EXPECT_EQ(P[3], 1.0f);
  const auto first_block = [&](int64_t lim, float thr, bool at_least) {
    for (int64_t b = 0; b < lim; ++b)
      if (at_least ? P[size_t(b)] >= thr : P[size_t(b)] > thr) return b;
    return lim;
  };
  const auto scan = [&](int64_t b, int64_t e, float base, float thr, bool al, float* q) {
    return sample_scan_block(w, b, e, base, thr, al, q);
  };
  for (int64_t k = 0; k < (int64_t(1) << 24); k += 4093) {
    const float u = float(k) / 16777216.0f;
    EXPECT_EQ(sample_pick(n, P.data(), false, 1.0f, u, first_block, scan),
              int64_t(std::floor(double(u) * 1024)))
        << "u = " << u;
    // top_p 0.5 keeps the first 512 (Q_511 = 0.5): the target is u / 2.
    EXPECT_EQ(sample_pick(n, P.data(), true, 0.5f, u, first_block, scan),
              int64_t(std::floor(double(u) * 512)))
        << "u = " << u;
  }
  const float u_max = float((1 << 24) - 1) / 16777216.0f;
  EXPECT_EQ(sample_pick(n, P.data(), false, 1.0f, u_max, first_block, scan), n - 1);
}

// A zero weight is never drawn, at block edges included.
TEST(OpsSampling, ZeroWeightsAreNeverDrawn) {
  const int64_t n = 700;
  const auto w = [&](int64_t i) { return (i % 3 == 0 || i == 255 || i == 256) ? 0.0f : 0.25f; };
  std::vector<float> P(3);
  for (int64_t b = 0; b < 3; ++b)
    P[size_t(b)] = sample_block_sum(w, b * 256, std::min(n, (b + 1) * 256));
  sample_prefix_chain(P.data(), 3);
  const auto first_block = [&](int64_t lim, float thr, bool at_least) {
    for (int64_t b = 0; b < lim; ++b)
      if (at_least ? P[size_t(b)] >= thr : P[size_t(b)] > thr) return b;
    return lim;
  };
  const auto scan = [&](int64_t b, int64_t e, float base, float thr, bool al, float* q) {
    return sample_scan_block(w, b, e, base, thr, al, q);
  };
  for (int64_t k = 0; k < (int64_t(1) << 24); k += 997) {
    const int64_t i =
        sample_pick(n, P.data(), false, 1.0f, float(k) / 16777216.0f, first_block, scan);
    ASSERT_TRUE(i >= 0 && i < n && w(i) > 0) << k << " -> " << i;
  }
}

// Greedy: the lowest index among the largest log-probs, including log-probs that tie after
// rounding although the logits differ; the general rule with top_k 1 (first sorted candidate).
TEST(OpsSampling, GreedyTakesTheLowestIndexOfTheLargestLogprob) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t V = 3000;
  auto row = ops_test::uniform<float>(size_t(V), g, -4, 4);
  row[17] = 10.0f;
  row[2500] = 10.0f;
  SampleConfig cfg;
  cfg.top_k = 1;
  EXPECT_EQ(draw(row, 3, cfg).tokens, std::vector<int32_t>(3, 17));
  // Logits 1e-8 below the max tie with it after (x - m) - log S (log S is about 8 here, half an
  // ulp of it 5e-7): the lowest such index wins.
  row = ops_test::uniform<float>(size_t(V), g, -0.01, 0.0009);
  row[2500] = 0.001f;
  row[17] = 0.001f - 1e-8f;
  row[40] = 0.001f - 2e-8f;
  std::vector<float> lsm(static_cast<size_t>(V));
  log_softmax_fwd_cpu<float>(row.data(), 1, V, lsm.data());
  const float top = *std::max_element(lsm.begin(), lsm.end());
  int64_t want = 0;
  while (lsm[size_t(want)] != top) ++want;
  const Draws d = draw(row, 1, cfg);
  EXPECT_EQ(d.tokens[0], want);
  EXPECT_EQ(sbits(d.logprobs[0]), sbits(top));
  EXPECT_LT(want, 2500) << "the rounding tie did not occur";
}

// The log-prob of each drawn token has the bits of token_logprobs on logits * float(1/t) (what the
// learner computes), for every mode.
TEST(OpsSampling, LogprobsAreTheLearnersBits) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 6, V = 2000;
  const auto x = ops_test::uniform<float>(size_t(rows * V), g, -6, 6);
  std::vector<uint32_t> st(static_cast<size_t>(rows));
  std::vector<int64_t> pos(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) st[size_t(r)] = uint32_t(r), pos[size_t(r)] = 40 + r;
  for (const double t : {1.0, 0.6})
    for (const int64_t k : {int64_t(0), int64_t(1), int64_t(40)})
      for (const double p : {1.0, 0.9}) {
        const SampleConfig cfg{t, k, p, 77};
        std::vector<int32_t> tok(static_cast<size_t>(rows));
        std::vector<float> lp(static_cast<size_t>(rows)), xs(x.size());
        sample_tokens_cpu(x.data(), rows, V, st.data(), pos.data(), cfg, tok.data(), lp.data());
        const float inv = sampling_scale(t);
        for (size_t i = 0; i < x.size(); ++i) xs[i] = x[i] * inv;
        std::vector<float> want(static_cast<size_t>(rows)), h(static_cast<size_t>(rows)),
            lse(static_cast<size_t>(rows));
        token_logprobs_fwd_cpu<float>(xs.data(), tok.data(), rows, V, want.data(), h.data(),
                                      lse.data());
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_EQ(sbits(lp[size_t(r)]), sbits(want[size_t(r)])) << t << " " << k << " " << p;
        // A row drawn alone draws the same token.
        int32_t one = -2;
        float one_lp = 0;
        sample_tokens_cpu(x.data() + 4 * V, 1, V, st.data() + 4, pos.data() + 4, cfg, &one,
                          &one_lp);
        EXPECT_EQ(one, tok[4]);
      }
}

TEST(OpsSampling, RowsWithoutADistribution) {
  const float inf = INFINITY;
  const int64_t V = 4;
  const std::vector<float> x{0.0f, NAN,  1.0f, 2.0f,  // NaN
                             0.0f, inf,  1.0f, 2.0f,  // +inf
                             -inf, -inf, -inf, -inf, -inf, 3.0f, -inf, -inf};
  const std::vector<uint32_t> st(4, 0);
  const std::vector<int64_t> pos{0, 1, 2, 3};
  for (const int64_t k : {int64_t(0), int64_t(1), int64_t(2)}) {
    const SampleConfig cfg{1.0, k, 1.0, 5};
    std::vector<int32_t> tok(4);
    std::vector<float> lp(4);
    sample_tokens_cpu(x.data(), 4, V, st.data(), pos.data(), cfg, tok.data(), lp.data());
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(tok[size_t(r)], -1) << r;
      EXPECT_TRUE(std::isnan(lp[size_t(r)])) << r;
    }
    EXPECT_EQ(tok[3], 1);  // the one finite logit
    EXPECT_EQ(lp[3], 0.0f);
  }
}

TEST(OpsSampling, EntryChecksAndPositionTypes) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 5, V = 300;
  const auto xv = ops_test::uniform<float>(size_t(rows * V), g, -3, 3);
  const Tensor x = Tensor::from_vector<float>(xv, {rows, V}, DType::kF32);
  const std::vector<int32_t> sv{1, 2, 3, 4, 5}, p32{9, 8, 7, 6, 5};
  const std::vector<int64_t> p64{9, 8, 7, 6, 5};
  const Tensor s = Tensor::from_vector<int32_t>(sv, {rows}, DType::kI32);
  const Tensor a = Tensor::from_vector<int32_t>(p32, {rows}, DType::kI32);
  const Tensor b = Tensor::from_vector<int64_t>(p64, {rows}, DType::kI64);
  SampleConfig cfg;
  cfg.seed = 3;
  const SampledTokens ra = sample_tokens(x, s, a, cfg), rb = sample_tokens(x, s, b, cfg);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(ra.tokens.ptr<int32_t>()[r], rb.tokens.ptr<int32_t>()[r]);
    EXPECT_EQ(sbits(ra.logprobs.ptr<float>()[r]), sbits(rb.logprobs.ptr<float>()[r]));
  }
  auto bad = [&](SampleConfig c) {
    EXPECT_THROW(sample_tokens(x, s, a, c), std::invalid_argument);
  };
  SampleConfig c = cfg;
  c.temperature = 0;
  bad(c);
  c = cfg, c.temperature = INFINITY;
  bad(c);
  c = cfg, c.top_p = 0;
  bad(c);
  c = cfg, c.top_p = 1.5;
  bad(c);
  c = cfg, c.top_k = -1;
  bad(c);
  EXPECT_THROW(sample_tokens(x, s.slice_rows(0, 4), a, cfg), std::invalid_argument);
  EXPECT_THROW(
      sample_tokens(x, s, Tensor::from_vector<float>(std::vector<float>(5), {rows}, DType::kF32),
                    cfg),
      std::invalid_argument);
}
