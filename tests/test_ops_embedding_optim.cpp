// Embedding and optimizer CPU kernels (ops/embedding.h, ops/optim.h): the documented summation
// and update orders replayed bit for bit, float64 finite differences for the embedding,
// thread-count independence, range checks.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "lockstep/ops/embedding.h"
#include "lockstep/ops/optim.h"
#include "ops_test_util.h"

using namespace lockstep::ops;
using ops_test::SeedTrace;

TEST(OpsEmbedding, ForwardGathersAndBackwardSumsTokensInAscendingOrder) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t V = 50, d = 64, T = 2000;
  const auto table = ops_test::uniform<float>(size_t(V * d), g);
  const auto dout = ops_test::uniform<float>(size_t(T * d), g);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (auto& id : ids) id = int32_t(g() % 40);  // ids 40..49 unused
  auto run = [&] {
    std::vector<float> out(static_cast<size_t>(T * d)), dtable(size_t(V * d), NAN);
    embedding_fwd_cpu<float>(table.data(), V, d, ids.data(), T, out.data());
    embedding_bwd_cpu<float>(dout.data(), ids.data(), T, V, d, dtable.data());
    out.insert(out.end(), dtable.begin(), dtable.end());
    return out;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
  std::vector<float> ref(size_t(V * d), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < d; ++c) {
      ASSERT_EQ(res[0][size_t(t * d + c)], table[size_t(ids[size_t(t)] * d + c)]);
      ref[size_t(ids[size_t(t)] * d + c)] += dout[size_t(t * d + c)];
    }
  EXPECT_TRUE(ops_test::same_bits(ref, std::vector<float>(res[0].begin() + T * d, res[0].end())));
}

TEST(OpsEmbedding, GradientMatchesFiniteDifferences) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t V = 5, d = 3, T = 7;
  auto table = ops_test::uniform<double>(size_t(V * d), g);
  const std::vector<int32_t> ids{3, 0, 3, 1, 3, 0, 1};  // id 2 and 4 unused
  const auto r = ops_test::uniform<double>(size_t(T * d), g);
  std::vector<double> out(static_cast<size_t>(T * d)), dtable(table.size());
  embedding_bwd_cpu<double>(r.data(), ids.data(), T, V, d, dtable.data());
  ops_test::check_gradient(
      table, dtable,
      [&] {
        embedding_fwd_cpu<double>(table.data(), V, d, ids.data(), T, out.data());
        return ops_test::dot(r, out);
      },
      "dtable");
}

TEST(OpsEmbedding, OutOfRangeIdNamesTheIdAndVocabulary) {
  const std::vector<float> table(12, 1.0f);
  const std::vector<int32_t> ids{0, 2, 4};
  std::vector<float> out(9, -1.0f);
  try {
    embedding_fwd_cpu<float>(table.data(), 4, 3, ids.data(), 3, out.data());
    FAIL() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("token id 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("V = 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(out[0], -1.0f);  // checked before anything is written
  const std::vector<int32_t> negative{-1};
  EXPECT_THROW(embedding_bwd_cpu<float>(table.data(), negative.data(), 1, 4, 3, out.data()),
               std::out_of_range);
}

TEST(OpsAdamW, FollowsTheDocumentedFormulaBitForBit) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t n = 100000;
  const AdamWConfig cfg{3e-4, 0.9, 0.95, 1e-8, 0.1};
  const auto p0 = ops_test::uniform<float>(size_t(n), g),
             grad = ops_test::uniform<float>(size_t(n), g),
             m0 = ops_test::uniform<float>(size_t(n), g, -0.1, 0.1),
             v0 = ops_test::uniform<float>(size_t(n), g, 0, 0.01);
  const int64_t step = 7;
  const float scale = 0.75f;
  auto run = [&] {
    auto p = p0, m = m0, v = v0;
    adamw_step_cpu<float>(p.data(), grad.data(), m.data(), v.data(), n, cfg, step, scale);
    p.insert(p.end(), m.begin(), m.end());
    p.insert(p.end(), v.begin(), v.end());
    return p;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
  const float decay = float(1.0 - 3e-4 * 0.1), b1 = 0.9f, b2 = 0.95f, c1 = float(1.0 - 0.9),
              c2 = float(1.0 - 0.95);
  const float step_size = float(3e-4 / (1.0 - std::pow(0.9, 7.0)));
  const float bc2 = float(std::sqrt(1.0 - std::pow(0.95, 7.0)));
  for (int64_t i = 0; i < n; ++i) {
    const float gi = grad[size_t(i)] * scale;
    const float m = b1 * m0[size_t(i)] + c1 * gi;
    const float v = b2 * v0[size_t(i)] + c2 * (gi * gi);
    const float p = p0[size_t(i)] * decay - step_size * (m / (std::sqrt(v) / bc2 + 1e-8f));
    ASSERT_EQ(res[0][size_t(i)], p) << i;
    ASSERT_EQ(res[0][size_t(n + i)], m) << i;
    ASSERT_EQ(res[0][size_t(2 * n + i)], v) << i;
  }
}

TEST(OpsAdamW, FirstStepMovesEachWeightByAboutLr) {
  // From zero moments, step 1 without decay gives p - lr * g / (|g| + eps') = p - lr * sign(g).
  std::vector<double> p{1.0, -2.0, 0.5}, grad{0.3, -4.0, 1e-3}, m(3, 0.0), v(3, 0.0);
  const AdamWConfig cfg{0.01, 0.9, 0.999, 1e-8, 0.0};
  adamw_step_cpu<double>(p.data(), grad.data(), m.data(), v.data(), 3, cfg, 1);
  EXPECT_NEAR(p[0], 0.99, 1e-9);
  EXPECT_NEAR(p[1], -1.99, 1e-9);
  EXPECT_NEAR(p[2], 0.49, 1e-6);
  EXPECT_THROW(adamw_step_cpu<double>(p.data(), grad.data(), m.data(), v.data(), 3, cfg, 0),
               std::invalid_argument);
}

TEST(OpsGradNorm, ChunkedFloat64SumAndClipping) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const std::vector<size_t> sizes{10000, 4096, 1, 0, 50001};
  std::vector<std::vector<float>> grads;
  for (size_t n : sizes) grads.push_back(ops_test::uniform<float>(n, g));
  auto views = [&] {
    std::vector<std::span<const float>> v;
    for (auto& x : grads) v.emplace_back(x);
    return v;
  };
  const auto norms = ops_test::across_thread_counts(
      [&] { return std::vector<double>{grad_norm_cpu<float>(views())}; });
  EXPECT_TRUE(ops_test::same_bits(norms[0], norms[1]));
  EXPECT_TRUE(ops_test::same_bits(norms[0], norms[2]));
  // The documented order replayed: chunks of kGradNormChunk, then chunk order, then tensors.
  double total = 0, plain = 0;
  for (const auto& x : grads) {
    double tensor = 0;
    for (size_t c0 = 0; c0 < x.size(); c0 += size_t(kGradNormChunk)) {
      double chunk = 0;
      for (size_t i = c0; i < std::min(x.size(), c0 + size_t(kGradNormChunk)); ++i)
        chunk += double(x[i]) * double(x[i]);
      tensor += chunk;
    }
    total += tensor;
    for (float e : x) plain += double(e) * double(e);
  }
  EXPECT_EQ(norms[0][0], std::sqrt(total));
  EXPECT_NEAR(norms[0][0], std::sqrt(plain), 1e-12 * std::sqrt(plain));
  // Clipping to half the norm scales every element by RN(max_norm / (norm + 1e-6)).
  const auto before = grads;
  std::vector<std::span<float>> mut;
  for (auto& x : grads) mut.emplace_back(x);
  const double max_norm = norms[0][0] / 2;
  EXPECT_EQ(clip_grad_norm_cpu<float>(mut, max_norm), norms[0][0]);
  const float coef = float(max_norm / (norms[0][0] + 1e-6));
  for (size_t t = 0; t < grads.size(); ++t)
    for (size_t i = 0; i < grads[t].size(); ++i) ASSERT_EQ(grads[t][i], before[t][i] * coef);
  // Below the limit, and with a non-finite norm, nothing changes.
  const auto clipped = grads;
  clip_grad_norm_cpu<float>(mut, 1e9);
  EXPECT_EQ(grads, clipped);
  grads[0][3] = INFINITY;
  EXPECT_TRUE(std::isinf(clip_grad_norm_cpu<float>(mut, 1.0)));
  EXPECT_EQ(grads[1], clipped[1]);
}

TEST(OpsAdamW, AmaxPerDomainIsEachEqualPartsAmaxAndLeavesTheUpdateAsIs) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t n = 3 * 40000;
  const AdamWConfig cfg{1e-3, 0.9, 0.95, 1e-8, 0.0};
  auto p0 = ops_test::uniform<float>(size_t(n), g);
  p0[size_t(n / 3 + 5)] = -7.5f;  // the second domain's amax, negative
  const auto grad = ops_test::uniform<float>(size_t(n), g);
  auto run = [&](int64_t domains, std::vector<float>& amax) {
    auto p = p0;
    std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    amax.assign(size_t(domains), -1.0f);
    adamw_step_cpu<float>(p.data(), grad.data(), m.data(), v.data(), n, cfg, 1, 1.0f, amax.data(),
                          domains);
    return p;
  };
  std::vector<float> one, three;
  const auto p1 = run(1, one), p3 = run(3, three);
  EXPECT_TRUE(ops_test::same_bits(p1, p3));
  for (int64_t d = 0; d < 3; ++d) {
    float want = 0.0f;
    for (int64_t i = d * n / 3; i < (d + 1) * n / 3; ++i)
      want = std::max(want, std::fabs(p3[size_t(i)]));
    EXPECT_EQ(three[size_t(d)], want) << "domain " << d;
  }
  EXPECT_EQ(one[0], std::max({three[0], three[1], three[2]}));
  EXPECT_GT(three[1], 7.0f);
  std::vector<float> bad;
  EXPECT_THROW(run(7, bad), std::invalid_argument);  // 7 does not divide n
}
