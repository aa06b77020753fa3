// Softmax, log-softmax and token log-prob / entropy CPU kernels (ops/softmax.h): forward against
// plain float64 loops, float64 finite-difference gradients, row and thread-count invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

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
  log_softmax_row<float>(x.data() + 123 * V, V, row.data());
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
