// Softmax, log-softmax and token log-prob / entropy CPU kernels (ops/softmax.h): forward against
// plain float64 loops, float64 finite-difference gradients, row and thread-count invariance, the
// 1024-lane order against an independent statement of it, and rows without a distribution.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <stdexcept>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/ops/router.h"
#include "lockstep/ops/softmax.h"
#include "ops_test_util.h"

using namespace lockstep::ops;
using ops_test::SeedTrace;

namespace {

// softmax and log-softmax of each row in float64.
void softmax_reference(const std::vector<double>& x, int64_t rows, int64_t n,
                       std::vector<double>& p, std::vector<double>& logp) {
  p.assign(x.size(), 0.0);
  logp.assign(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double m = x[size_t(r * n)];
    for (int64_t j = 0; j < n; ++j) m = std::max(m, x[size_t(r * n + j)]);
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += std::exp(x[size_t(r * n + j)] - m);
    for (int64_t j = 0; j < n; ++j) {
      p[size_t(r * n + j)] = std::exp(x[size_t(r * n + j)] - m) / s;
      logp[size_t(r * n + j)] = x[size_t(r * n + j)] - m - std::log(s);
    }
  }
}

struct TokenOut {
  std::vector<double> logp, entropy, lse;
};

TokenOut token_logprobs(const std::vector<double>& logits, const std::vector<int32_t>& targets,
                        int64_t vocab) {
  const int64_t T = int64_t(targets.size());
  TokenOut o{std::vector<double>(targets.size()), std::vector<double>(targets.size()),
             std::vector<double>(targets.size())};
  token_logprobs_fwd_cpu<double>(logits.data(), targets.data(), T, vocab, o.logp.data(),
                                 o.entropy.data(), o.lse.data());
  return o;
}

}  // namespace

TEST(OpsSoftmax, ForwardMatchesFloat64Reference) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 9, n = 100;
  const auto xf = ops_test::uniform<float>(size_t(rows * n), g, -5, 5);
  const std::vector<double> x(xf.begin(), xf.end());
  std::vector<double> p, lp;
  softmax_reference(x, rows, n, p, lp);
  std::vector<float> yf(x.size()), lf(x.size());
  std::vector<double> yd(x.size()), ld(x.size());
  softmax_fwd_cpu<float>(xf.data(), rows, n, yf.data());
  log_softmax_fwd_cpu<float>(xf.data(), rows, n, lf.data());
  softmax_fwd_cpu<double>(x.data(), rows, n, yd.data());
  log_softmax_fwd_cpu<double>(x.data(), rows, n, ld.data());
  // float: x - m within 10u absolute (|x| <= 5), exp_f32 within 2 ulp, the sum of n = 100
  // positive terms within gamma_100 ~ 6e-6 relative, one division: softmax within ~7e-6
  // relative; log-softmax within ~7e-6 + u * 15 absolute. Bounds: 2e-5 relative / absolute.
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(yf[i], p[i], 2e-5 * p[i]) << i;
    ASSERT_NEAR(lf[i], lp[i], 2e-5) << i;
    ASSERT_NEAR(yd[i], p[i], 1e-14 * p[i]) << i;
    ASSERT_NEAR(ld[i], lp[i], 1e-13) << i;
  }
}

TEST(OpsSoftmax, GradientsMatchFiniteDifferences) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 3, n = 6;
  auto x = ops_test::uniform<double>(size_t(rows * n), g, -3, 3);
  const auto r = ops_test::uniform<double>(x.size(), g);
  std::vector<double> y(x.size()), dx(x.size());
  auto loss_sm = [&] {
    softmax_fwd_cpu<double>(x.data(), rows, n, y.data());
    return ops_test::dot(r, y);
  };
  loss_sm();
  softmax_bwd_cpu<double>(y.data(), r.data(), rows, n, dx.data());
  ops_test::check_gradient(x, dx, loss_sm, "softmax dx");
  auto loss_lsm = [&] {
    log_softmax_fwd_cpu<double>(x.data(), rows, n, y.data());
    return ops_test::dot(r, y);
  };
  loss_lsm();
  log_softmax_bwd_cpu<double>(y.data(), r.data(), rows, n, dx.data());
  ops_test::check_gradient(x, dx, loss_lsm, "log_softmax dx");
}

TEST(OpsTokenLogprobs, ForwardMatchesFloat64Reference) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t T = 11, V = 256;
  const auto xf = ops_test::uniform<float>(size_t(T * V), g, -6, 6);
  const std::vector<double> x(xf.begin(), xf.end());
  std::vector<int32_t> targets(static_cast<size_t>(T));
  for (auto& t : targets) t = int32_t(g() % V);
  targets[0] = 0;
  targets[1] = int32_t(V - 1);
  std::vector<double> p, lp;
  softmax_reference(x, T, V, p, lp);
  std::vector<float> logp(static_cast<size_t>(T)), ent(static_cast<size_t>(T)),
      lse(static_cast<size_t>(T));
  token_logprobs_fwd_cpu<float>(xf.data(), targets.data(), T, V, logp.data(), ent.data(),
                                lse.data());
  const auto d = token_logprobs(x, targets, V);
  for (int64_t t = 0; t < T; ++t) {
    double h = 0;
    for (int64_t j = 0; j < V; ++j) h -= p[size_t(t * V + j)] * lp[size_t(t * V + j)];
    const double ref_lp = lp[size_t(t * V + targets[size_t(t)])];
    const double ref_lse = x[size_t(t * V + targets[size_t(t)])] - ref_lp;
    EXPECT_NEAR(d.logp[size_t(t)], ref_lp, 1e-13);
    EXPECT_NEAR(d.entropy[size_t(t)], h, 1e-13);
    EXPECT_NEAR(d.lse[size_t(t)], ref_lse, 1e-13);
    // float: log-probs within ~1e-5 absolute (sum of V = 256 exps within gamma_256 ~ 1.5e-5
    // relative, |x - m| <= 12); entropy sums p * lp with p within ~2e-5 relative and
    // |lp| <= 13: within ~1e-4 of H <= log 256. Bounds: 5e-5 for logp and lse, 2e-4 for H.
    EXPECT_NEAR(logp[size_t(t)], ref_lp, 5e-5);
    EXPECT_NEAR(lse[size_t(t)], ref_lse, 5e-5);
    EXPECT_NEAR(ent[size_t(t)], h, 2e-4);
  }
}

TEST(OpsTokenLogprobs, GradientMatchesFiniteDifferences) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t T = 4, V = 7;
  auto x = ops_test::uniform<double>(size_t(T * V), g, -3, 3);
  const std::vector<int32_t> targets{0, 6, 3, 3};
  const auto a = ops_test::uniform<double>(size_t(T), g),
             b = ops_test::uniform<double>(size_t(T), g);
  auto loss = [&] {
    const auto o = token_logprobs(x, targets, V);
    return ops_test::dot(a, o.logp) + ops_test::dot(b, o.entropy);
  };
  const auto o = token_logprobs(x, targets, V);
  std::vector<double> dx(x.size());
  token_logprobs_bwd_cpu<double>(x.data(), targets.data(), o.lse.data(), o.entropy.data(), a.data(),
                                 b.data(), T, V, dx.data());
  ops_test::check_gradient(x, dx, loss, "dlogits");
  // A null gradient stands for zero: only the log-prob term.
  token_logprobs_bwd_cpu<double>(x.data(), targets.data(), o.lse.data(), o.entropy.data(), a.data(),
                                 nullptr, T, V, dx.data());
  ops_test::check_gradient(
      x, dx, [&] { return ops_test::dot(a, token_logprobs(x, targets, V).logp); },
      "dlogits (logp only)");
}

TEST(OpsTokenLogprobs, RowsAndThreadCountsDoNotChangeBits) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t T = 300, V = 200;
  const auto x = ops_test::uniform<float>(size_t(T * V), g, -8, 8);
  std::vector<int32_t> targets(static_cast<size_t>(T));
  for (auto& t : targets) t = int32_t(g() % V);
  const auto dl = ops_test::uniform<float>(size_t(T), g),
             dh = ops_test::uniform<float>(size_t(T), g);
  auto run = [&] {
    std::vector<float> lp(static_cast<size_t>(T)), h(static_cast<size_t>(T)),
        lse(static_cast<size_t>(T)), dx(x.size()), sm(x.size()), lsm(x.size()), dsm(x.size());
    token_logprobs_fwd_cpu<float>(x.data(), targets.data(), T, V, lp.data(), h.data(), lse.data());
    token_logprobs_bwd_cpu<float>(x.data(), targets.data(), lse.data(), h.data(), dl.data(),
                                  dh.data(), T, V, dx.data());
    softmax_fwd_cpu<float>(x.data(), T, V, sm.data());
    log_softmax_fwd_cpu<float>(x.data(), T, V, lsm.data());
    softmax_bwd_cpu<float>(sm.data(), x.data(), T, V, dsm.data());
    for (const auto* part : {&h, &lse, &dx, &sm, &lsm, &dsm})
      lp.insert(lp.end(), part->begin(), part->end());
    return lp;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
  // One row scored alone (as a sampler would) has the bits it had in the batch.
  float lp1 = 0, h1 = 0, lse1 = 0;
  token_logprobs_fwd_cpu<float>(x.data() + 123 * V, targets.data() + 123, 1, V, &lp1, &h1, &lse1);
  EXPECT_EQ(std::bit_cast<uint32_t>(lp1), std::bit_cast<uint32_t>(res[0][123]));
  EXPECT_EQ(std::bit_cast<uint32_t>(h1), std::bit_cast<uint32_t>(res[0][size_t(T + 123)]));
  std::vector<float> row(static_cast<size_t>(V));
  log_softmax_row(HostVocabLanes{}, x.data() + 123 * V, V, row.data());
  EXPECT_TRUE(
      ops_test::same_bits(row, std::vector<float>(res[0].begin() + (3 * T + 2 * T * V) + 123 * V,
                                                  res[0].begin() + (3 * T + 2 * T * V) + 124 * V)));
}

TEST(OpsTokenLogprobs, RejectsTargetsOutsideTheVocabulary) {
  const std::vector<float> x(8, 0.0f);
  const std::vector<int32_t> targets{1, 4};
  std::vector<float> lp(2, -1.0f), h(2), lse(2);
  EXPECT_THROW(token_logprobs_fwd_cpu<float>(x.data(), targets.data(), 2, 4, lp.data(), h.data(),
                                             lse.data()),
               std::out_of_range);
  EXPECT_EQ(lp[0], -1.0f);
  EXPECT_THROW(softmax_fwd_cpu<float>(x.data(), 2, 0, lp.data()), std::invalid_argument);
}

namespace {

// The executor order of ops/row_exec.h, restated: lane l folds v[l], v[l + L], ... ascending from
// `init`, then p[l] = op(p[l], p[l + off]) for off = L/2 .. 1.
template <class Op>
float lane_fold(const std::vector<float>& v, int L, float init, Op op) {
  std::vector<float> p(size_t(L), init);
  for (size_t j = 0; j < v.size(); ++j) p[j % size_t(L)] = op(p[j % size_t(L)], v[j]);
  for (int off = L / 2; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) p[size_t(l)] = op(p[size_t(l)], p[size_t(l + off)]);
  return p[0];
}
float lane_sum(const std::vector<float>& v, int L) {
  return lane_fold(v, L, 0.0f, [](float a, float b) { return a + b; });
}
float lane_max(const std::vector<float>& v, int L) {
  return lane_fold(v, L, -INFINITY, [](float a, float b) { return b > a ? b : a; });
}

uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }

}  // namespace

// The rows reduce in the 1024-lane order: softmax, log-softmax and the token log-probs equal the
// formulas evaluated with the lane sums of the test (a sequential sum differs in the last bits for
// most rows of 3000 values, so this fails for any other order).
TEST(OpsSoftmax, RowsReduceInTheLaneOrder) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 6, n = 3000;
  const auto x = ops_test::uniform<float>(size_t(rows * n), g, -9, 9);
  std::vector<float> sm(x.size()), lsm(x.size()), lp(static_cast<size_t>(rows)),
      h(static_cast<size_t>(rows)), lse(static_cast<size_t>(rows));
  std::vector<int32_t> tg(static_cast<size_t>(rows));
  for (auto& t : tg) t = int32_t(g() % n);
  softmax_fwd_cpu<float>(x.data(), rows, n, sm.data());
  log_softmax_fwd_cpu<float>(x.data(), rows, n, lsm.data());
  token_logprobs_fwd_cpu<float>(x.data(), tg.data(), rows, n, lp.data(), h.data(), lse.data());
  int sequential_differs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row(x.begin() + r * n, x.begin() + (r + 1) * n);
    const float m = lane_max(row, 1024);
    std::vector<float> e(row.size()), u(row.size());
    for (size_t j = 0; j < row.size(); ++j) {
      e[j] = lockstep::num::exp_f32(row[j] - m);
      u[j] = e[j] * (row[j] - m);
    }
    const float s = lane_sum(e, 1024), log_s = lockstep::num::log_f32(s);
    float seq = 0;
    for (float v : e) seq += v;
    sequential_differs += bits(seq) != bits(s);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(bits(sm[size_t(r * n + j)]), bits(e[size_t(j)] / s)) << r << " " << j;
      ASSERT_EQ(bits(lsm[size_t(r * n + j)]), bits((row[size_t(j)] - m) - log_s)) << r << " " << j;
    }
    EXPECT_EQ(bits(lp[size_t(r)]), bits(lsm[size_t(r * n + tg[size_t(r)])]));
    EXPECT_EQ(bits(h[size_t(r)]), bits(log_s - lane_sum(u, 1024) / s));
    EXPECT_EQ(bits(lse[size_t(r)]), bits(m + log_s));
  }
  EXPECT_GT(sequential_differs, 0) << "the rows do not tell the lane order from a sequential sum";
  // The backward sums in the same order.
  const auto dy = ops_test::uniform<float>(x.size(), g);
  std::vector<float> dx(x.size());
  log_softmax_bwd_cpu<float>(lsm.data(), dy.data(), rows, n, dx.data());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> d(dy.begin() + r * n, dy.begin() + (r + 1) * n);
    const float s = lane_sum(d, 1024);
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(bits(dx[size_t(r * n + j)]),
                bits(d[size_t(j)] - lockstep::num::exp_f32(lsm[size_t(r * n + j)]) * s));
  }
}

// sum2 of the host executor: each component has the bits of sum over it.
TEST(OpsRowExec, Sum2ComponentsEqualSums) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  for (int64_t n : {1, 31, 1023, 1024, 1025, 5000}) {
    const auto a = ops_test::uniform<float>(size_t(n), g, -3, 3),
               b = ops_test::uniform<float>(size_t(n), g, 0, 1e6);
    const auto f2 = [&](int64_t j) { return Sum2<float>{a[size_t(j)], b[size_t(j)]}; };
    const Sum2<float> s = HostVocabLanes{}.sum2<float>(n, f2);
    EXPECT_EQ(bits(s.a),
              bits(HostVocabLanes{}.sum<float>(n, [&](int64_t j) { return a[size_t(j)]; })));
    EXPECT_EQ(bits(s.b), bits(lane_sum(b, 1024)));
    const Sum2<float> w = HostLanes<32>{}.sum2<float>(n, f2);
    EXPECT_EQ(bits(w.a), bits(lane_sum(a, 32)));
    EXPECT_EQ(bits(w.b), bits(lane_sum(b, 32)));
  }
}

// -inf logits carry no probability and no gradient; a NaN, a +inf or an all -inf row has no
// distribution and gives NaN everywhere.
TEST(OpsTokenLogprobs, InfiniteAndNanLogits) {
  const float inf = INFINITY, nan = NAN;
  const int64_t V = 5;
  const std::vector<float> x{1.0f, -inf, 2.0f, -inf, 0.5f,  // masked tokens
                             1.0f, nan,  2.0f, 0.0f, 0.5f,  // NaN
                             1.0f, inf,  2.0f, 0.0f, 0.5f,  // +inf
                             -inf, -inf, -inf, -inf, -inf};
  const std::vector<int32_t> tg{2, 0, 0, 0};
  std::vector<float> lp(4), h(4), lse(4), dx(x.size()), sm(x.size());
  token_logprobs_fwd_cpu<float>(x.data(), tg.data(), 4, V, lp.data(), h.data(), lse.data());
  const std::vector<float> dl(4, 0.5f), dh(4, 0.25f);
  token_logprobs_bwd_cpu<float>(x.data(), tg.data(), lse.data(), h.data(), dl.data(), dh.data(), 4,
                                V, dx.data());
  softmax_fwd_cpu<float>(x.data(), 4, V, sm.data());
  // Row 0 equals the row without its masked tokens.
  const std::vector<float> kept{1.0f, 2.0f, 0.5f};
  const int32_t t1 = 1;
  float lp3 = 0, h3 = 0, lse3 = 0;
  token_logprobs_fwd_cpu<float>(kept.data(), &t1, 1, 3, &lp3, &h3, &lse3);
  EXPECT_TRUE(std::isfinite(h[0]));
  EXPECT_NEAR(lp[0], lp3, 1e-6);
  EXPECT_NEAR(h[0], h3, 1e-6);
  EXPECT_EQ(dx[1], 0.0f);
  EXPECT_EQ(dx[3], 0.0f);
  EXPECT_EQ(sm[1], 0.0f);
  EXPECT_TRUE(std::isfinite(dx[0]) && std::isfinite(dx[2]) && std::isfinite(dx[4]));
  for (int64_t r = 1; r < 4; ++r) {
    EXPECT_TRUE(std::isnan(lp[size_t(r)]) && std::isnan(h[size_t(r)])) << r;
    for (int64_t j = 0; j < V; ++j) EXPECT_TRUE(std::isnan(sm[size_t(r * V + j)])) << r << j;
  }
}

// A router row without a distribution takes experts 0..k-1 with NaN weights; a finite row with
// -inf logits never selects a -inf expert before a finite one.
TEST(OpsMoeRouter, RowsWithInfiniteOrNanLogits) {
  const float inf = INFINITY;
  const int64_t E = 6, k = 3;
  const std::vector<float> x{0.0f, NAN,  1.0f, 2.0f, 0.5f, 0.0f,  //
                             -inf, 1.0f, -inf, 0.5f, -inf, -inf};
  std::vector<float> probs(x.size()), w(2 * k);
  std::vector<int32_t> ids(2 * k);
  moe_router_topk_fwd_cpu<float>(x.data(), 2, E, k, true, probs.data(), ids.data(), w.data());
  for (int64_t s = 0; s < k; ++s) {
    EXPECT_EQ(ids[size_t(s)], s);
    EXPECT_TRUE(std::isnan(w[size_t(s)]));
  }
  EXPECT_EQ(ids[3], 1);
  EXPECT_EQ(ids[4], 3);
  EXPECT_EQ(ids[5], 0);  // the -inf experts tie at probability 0: the lowest index
  EXPECT_EQ(w[5], 0.0f);
  EXPECT_NEAR(w[3] + w[4], 1.0f, 1e-6);
}
