// The reduction orders that the CPU and CUDA backends share (ops/row_exec.h, ops/rmsnorm.h,
// ops/swiglu.h, ops/elementwise.h), replayed here by plain loops written from the header text:
// 32 lanes per row sum, the fixed pairwise tree, the rmsnorm weight gradient in chunks of 256 rows.
// Each replay also checks that the data tells the documented order from a sequential sum, so a
// kernel that summed sequentially would fail.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/swiglu.h"
#include "lockstep/ops/tensor_ops.h"
#include "ops_test_util.h"

using namespace lockstep;
using namespace lockstep::ops;
using ops_test::SeedTrace;

namespace lanes_test {

// sum_j f(j) for j < n as row_exec.h states it: lane l adds f(l), f(l + 32), ... from +0, then
// for off = 16, 8, 4, 2, 1: p[l] = p[l] + p[l + off].
template <class F>
float lanes32(int64_t n, F f) {
  float p[32] = {};
  for (int64_t j = 0; j < n; ++j) p[j % 32] = p[j % 32] + f(j);
  for (int off = 16; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) p[l] = p[l] + p[l + off];
  return p[0];
}

template <class F>
float sequential(int64_t n, F f) {
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s = s + f(j);
  return s;
}

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

TEST(OpsLaneOrder, RmsNormRowSumsUse32LanesAndDwChunksOf256Rows) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 600, d = 70;  // 3 chunks (256, 256, 88); d not a multiple of 32
  const float eps = 1e-6f;
  const auto x = ops_test::uniform<float>(size_t(rows * d), g, -3, 3);
  const auto w = ops_test::uniform<float>(size_t(d), g, 0.5, 1.5);
  const auto dy = ops_test::uniform<float>(size_t(rows * d), g);
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows)), dx(x.size()),
      dw(static_cast<size_t>(d));
  rmsnorm_fwd_cpu<float>(x.data(), w.data(), rows, d, eps, y.data(), rstd.data());
  rmsnorm_bwd_cpu<float>(dy.data(), x.data(), w.data(), rstd.data(), rows, d, dx.data(), dw.data());
  int differs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * d;
    const float* dyr = dy.data() + r * d;
    auto sq = [&](int64_t c) { return xr[c] * xr[c]; };
    const float ss = lanes32(d, sq);
    differs += bits(ss) != bits(sequential(d, sq));
    const float rs = 1.0f / std::sqrt(ss / float(d) + eps);
    ASSERT_EQ(bits(rstd[size_t(r)]), bits(rs)) << r;
    for (int64_t c = 0; c < d; ++c)
      ASSERT_EQ(bits(y[size_t(r * d + c)]), bits((xr[c] * rs) * w[size_t(c)])) << r << "," << c;
    const float dot = lanes32(d, [&](int64_t c) { return (dyr[c] * w[size_t(c)]) * (xr[c] * rs); });
    const float mean = dot / float(d);
    for (int64_t c = 0; c < d; ++c)
      ASSERT_EQ(bits(dx[size_t(r * d + c)]),
                bits(rs * ((dyr[c] * w[size_t(c)]) - (xr[c] * rs) * mean)))
          << r << "," << c;
  }
  EXPECT_GT(differs, 0) << "the data does not tell the lane order from a sequential sum";
  int dw_differs = 0;
  for (int64_t c = 0; c < d; ++c) {
    auto term = [&](int64_t r) {
      return dy[size_t(r * d + c)] * (x[size_t(r * d + c)] * rstd[size_t(r)]);
    };
    float total = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += 256) {
      float part = 0;
      for (int64_t r = r0; r < std::min(rows, r0 + 256); ++r) part = part + term(r);
      total = total + part;
    }
    ASSERT_EQ(bits(dw[size_t(c)]), bits(total)) << c;
    dw_differs += bits(total) != bits(sequential(rows, term));
  }
  EXPECT_GT(dw_differs, 0) << "the data does not tell the chunked order from a sequential sum";
}

TEST(OpsLaneOrder, SwigluProbabilityGradientSumsOver32Lanes) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 40, I = 97;
  const auto x = ops_test::uniform<float>(size_t(rows * 2 * I), g, -6, 6);
  const auto p = ops_test::uniform<float>(size_t(rows), g, 0, 1);
  const auto dy = ops_test::uniform<float>(size_t(rows * I), g);
  std::vector<float> dx(x.size()), dp(static_cast<size_t>(rows));
  swiglu_bwd_cpu<float>(x.data(), p.data(), dy.data(), rows, I, dx.data(), dp.data());
  int differs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    auto term = [&](int64_t c) {
      const float gate = x[size_t(r * 2 * I + c)], up = x[size_t(r * 2 * I + I + c)];
      const float silu = gate / (1.0f + num::exp_f32(-gate));
      return dy[size_t(r * I + c)] * (silu * up);
    };
    ASSERT_EQ(bits(dp[size_t(r)]), bits(lanes32(I, term))) << r;
    differs += bits(lanes32(I, term)) != bits(sequential(I, term));
  }
  EXPECT_GT(differs, 0);
}

TEST(OpsLaneOrder, RowDotSumsOver32Lanes) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 50, d = 333;
  const auto a = ops_test::uniform<float>(size_t(rows * d), g, -2, 2);
  const auto b = ops_test::uniform<float>(size_t(rows * d), g, -2, 2);
  const Tensor ta = Tensor::from_vector<float>(a, {rows, d}, DType::kF32);
  const Tensor tb = Tensor::from_vector<float>(b, {rows, d}, DType::kF32);
  const Tensor y = row_dot(ta, tb);
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{rows}));
  int differs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    auto term = [&](int64_t c) { return a[size_t(r * d + c)] * b[size_t(r * d + c)]; };
    ASSERT_EQ(bits(y.ptr<float>()[r]), bits(lanes32(d, term))) << r;
    differs += bits(lanes32(d, term)) != bits(sequential(d, term));
  }
  EXPECT_GT(differs, 0);
  // A row of zero columns sums to +0.
  const Tensor e = row_dot(Tensor(DType::kF32, {3, 0}), Tensor(DType::kF32, {3, 0}));
  for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(bits(e.ptr<float>()[r]), 0u);
}

}  // namespace lanes_test
