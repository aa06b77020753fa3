// RMSNorm and RoPE CPU kernels (ops/rmsnorm.h, ops/rope.h): forward against plain float64 loops,
// float64 finite-difference gradients, thread-count independence and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/rope.h"
#include "ops_test_util.h"

using namespace lockstep::ops;
using ops_test::SeedTrace;

namespace {

// Hugging Face Qwen3RMSNorm in float64: w * (x * rsqrt(mean(x^2) + eps)).
std::vector<double> rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                      int64_t rows, int64_t d, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < d; ++c) ms += x[r * d + c] * x[r * d + c] / double(d);
    const double rs = 1.0 / std::sqrt(ms + eps);
    for (int64_t c = 0; c < d; ++c) y[r * d + c] = w[c] * (x[r * d + c] * rs);
  }
  return y;
}

template <class To, class From>
std::vector<To> cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

}  // namespace

TEST(OpsRmsNorm, ForwardMatchesFloat64Reference) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 13, d = 64;
  const double eps = 1e-6;
  auto xf = ops_test::uniform<float>(size_t(rows * d), g, -3, 3);
  auto wf = ops_test::uniform<float>(size_t(d), g, 0.5, 1.5);
  const auto ref = rmsnorm_reference(cast<double>(xf), cast<double>(wf), rows, d, eps);
  std::vector<float> y(xf.size()), rstd(static_cast<size_t>(rows));
  rmsnorm_fwd_cpu<float>(xf.data(), wf.data(), rows, d, float(eps), y.data(), rstd.data());
  // float: the sum of d positive squares is within gamma_d = d u / (1 - d u) ~ 3.8e-6 relative
  // (u = 2^-24), rstd and the two products add a few u: 1e-5 relative leaves a 2.5x margin.
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-5 * std::fabs(ref[i])) << i;
  std::vector<double> yd(xf.size()), rstdd(static_cast<size_t>(rows));
  const auto xd = cast<double>(xf), wd = cast<double>(wf);
  rmsnorm_fwd_cpu<double>(xd.data(), wd.data(), rows, d, eps, yd.data(), rstdd.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(yd[i], ref[i], 1e-14 * std::fabs(ref[i])) << i;
}

TEST(OpsRmsNorm, GradientMatchesFiniteDifferences) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 3, d = 7;
  const double eps = 1e-5;
  auto x = ops_test::uniform<double>(size_t(rows * d), g, -2, 2);
  auto w = ops_test::uniform<double>(size_t(d), g, 0.5, 1.5);
  const auto r = ops_test::uniform<double>(size_t(rows * d), g);
  std::vector<double> y(x.size()), rstd(static_cast<size_t>(rows)), dx(x.size()),
      dw(static_cast<size_t>(d));
  auto loss = [&] {
    rmsnorm_fwd_cpu<double>(x.data(), w.data(), rows, d, eps, y.data(), rstd.data());
    return ops_test::dot(r, y);
  };
  loss();
  rmsnorm_bwd_cpu<double>(r.data(), x.data(), w.data(), rstd.data(), rows, d, dx.data(), dw.data());
  ops_test::check_gradient(x, dx, loss, "dx");
  ops_test::check_gradient(w, dw, loss, "dw");
}

TEST(OpsRmsNorm, BitsIndependentOfThreadCountAndOfTheOtherRows) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 300, d = 160;
  const auto x = ops_test::uniform<float>(size_t(rows * d), g, -3, 3);
  const auto w = ops_test::uniform<float>(size_t(d), g);
  const auto dy = ops_test::uniform<float>(size_t(rows * d), g);
  auto run = [&] {
    std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows)), dx(x.size()),
        dw(static_cast<size_t>(d));
    rmsnorm_fwd_cpu<float>(x.data(), w.data(), rows, d, 1e-6f, y.data(), rstd.data());
    rmsnorm_bwd_cpu<float>(dy.data(), x.data(), w.data(), rstd.data(), rows, d, dx.data(),
                           dw.data());
    y.insert(y.end(), rstd.begin(), rstd.end());
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
  // Row 17 normalised alone gives the bits it had inside the batch.
  std::vector<float> y1(static_cast<size_t>(d));
  float rs1 = 0;
  rmsnorm_fwd_cpu<float>(x.data() + 17 * d, w.data(), 1, d, 1e-6f, y1.data(), &rs1);
  EXPECT_TRUE(ops_test::same_bits(
      y1, std::vector<float>(res[0].begin() + 17 * d, res[0].begin() + 18 * d)));
}

TEST(OpsRmsNorm, RejectsAnEmptyRow) {
  float x = 1, w = 1, y, rs;
  EXPECT_THROW(rmsnorm_fwd_cpu<float>(&x, &w, 1, 0, 1e-6f, &y, &rs), std::invalid_argument);
}

TEST(OpsRope, TableHalvesMatchFloat64Angles) {
  const int64_t max_pos = 50, hd = 16;
  const double theta = 1e6;
  std::vector<float> c(static_cast<size_t>(max_pos * hd)), s(c.size());
  rope_table_cpu<float>(max_pos, hd, theta, c.data(), s.data());
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = double(p) / std::pow(theta, double(2 * i) / double(hd));
      EXPECT_EQ(c[p * hd + i], float(std::cos(a)));
      EXPECT_EQ(s[p * hd + i], float(std::sin(a)));
      EXPECT_EQ(c[p * hd + i + hd / 2], c[p * hd + i]);
      EXPECT_EQ(s[p * hd + i + hd / 2], s[p * hd + i]);
    }
}

TEST(OpsRope, ForwardMatchesRotateHalfAndGradientsCheck) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t tokens = 5, heads = 3, hd = 8, max_pos = 40, h = hd / 2;
  std::vector<double> c(static_cast<size_t>(max_pos * hd)), s(c.size());
  rope_table_cpu<double>(max_pos, hd, 10000.0, c.data(), s.data());
  const std::vector<int32_t> pos{0, 7, 39, 3, 3};
  auto x = ops_test::uniform<double>(size_t(tokens * heads * hd), g);
  std::vector<double> y(x.size());
  rope_fwd_cpu<double>(x.data(), pos.data(), tokens, heads, hd, c.data(), s.data(), max_pos,
                       y.data());
  // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[h:], x[:h]).
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t hh = 0; hh < heads; ++hh)
      for (int64_t i = 0; i < hd; ++i) {
        const double* xr = x.data() + (t * heads + hh) * hd;
        const double rot = i < h ? -xr[i + h] : xr[i - h];
        const double ref = xr[i] * c[pos[t] * hd + i] + rot * s[pos[t] * hd + i];
        ASSERT_NEAR(y[size_t((t * heads + hh) * hd + i)], ref, 1e-15);
      }
  const auto r = ops_test::uniform<double>(x.size(), g);
  std::vector<double> dx(x.size());
  rope_bwd_cpu<double>(r.data(), pos.data(), tokens, heads, hd, c.data(), s.data(), max_pos,
                       dx.data());
  ops_test::check_gradient(
      x, dx,
      [&] {
        rope_fwd_cpu<double>(x.data(), pos.data(), tokens, heads, hd, c.data(), s.data(), max_pos,
                             y.data());
        return ops_test::dot(r, y);
      },
      "dx");
  // The backward is the inverse rotation: it undoes the forward, also in place.
  rope_fwd_cpu<double>(x.data(), pos.data(), tokens, heads, hd, c.data(), s.data(), max_pos,
                       y.data());
  std::vector<double> back = y;
  rope_bwd_cpu<double>(back.data(), pos.data(), tokens, heads, hd, c.data(), s.data(), max_pos,
                       back.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(back[i], x[i], 1e-14);
}

TEST(OpsRope, FloatBoundThreadsAndPositionCheck) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t tokens = 200, heads = 4, hd = 64, max_pos = 128;
  std::vector<float> c(static_cast<size_t>(max_pos * hd)), s(c.size());
  rope_table_cpu<float>(max_pos, hd, 1e6, c.data(), s.data());
  std::vector<int32_t> pos(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) pos[size_t(t)] = int32_t((t * 7) % max_pos);
  const auto x = ops_test::uniform<float>(size_t(tokens * heads * hd), g, -4, 4);
  auto run = [&] {
    std::vector<float> y(x.size()), dx(x.size());
    rope_fwd_cpu<float>(x.data(), pos.data(), tokens, heads, hd, c.data(), s.data(), max_pos,
                        y.data());
    rope_bwd_cpu<float>(x.data(), pos.data(), tokens, heads, hd, c.data(), s.data(), max_pos,
                        dx.data());
    y.insert(y.end(), dx.begin(), dx.end());
    return y;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
  // float: two rounded products and one rounded sum, each within u = 2^-24 relative:
  // |err| <= 3u (|x_i c| + |x_j s|) <= 3u * 8 (|x| <= 4, |c|, |s| <= 1) < 1.5e-6.
  const int64_t h = hd / 2;
  for (int64_t row = 0; row < tokens * heads; ++row) {
    const int64_t p = pos[size_t(row / heads)];
    for (int64_t i = 0; i < hd; ++i) {
      const double xi = x[size_t(row * hd + i)];
      const double rot = i < h ? -double(x[size_t(row * hd + i + h)]) : x[size_t(row * hd + i - h)];
      const double ref = xi * c[p * hd + i] + rot * s[p * hd + i];
      ASSERT_NEAR(res[0][size_t(row * hd + i)], ref, 1.5e-6);
    }
  }
  std::vector<int32_t> bad = pos;
  bad[9] = int32_t(max_pos);
  std::vector<float> y(x.size(), -7.0f);
  EXPECT_THROW(rope_fwd_cpu<float>(x.data(), bad.data(), tokens, heads, hd, c.data(), s.data(),
                                   max_pos, y.data()),
               std::out_of_range);
  EXPECT_EQ(y[0], -7.0f);  // nothing written
}
