// SwiGLU and MoE routing CPU kernels (ops/swiglu.h, ops/moe_routing.h): bit equality with the
// numerics/ weighted SwiGLU, float64 references and finite-difference gradients, top-k ties and
// k = E, permutations with zero-token experts, thread-count independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/ops/moe_routing.h"
#include "lockstep/ops/softmax.h"
#include "lockstep/ops/swiglu.h"
#include "ops_test_util.h"

using namespace lockstep;
using namespace lockstep::ops;
using ops_test::SeedTrace;

TEST(OpsSwiglu, FloatForwardIsTheNumericsSwiglu) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 300, I = 96;
  const auto x = ops_test::uniform<float>(size_t(rows * 2 * I), g, -12, 12);
  const auto p = ops_test::uniform<float>(size_t(rows), g, 0, 1);
  auto run = [&] {
    std::vector<float> yw(static_cast<size_t>(rows * I)), yu(static_cast<size_t>(rows * I));
    swiglu_fwd_cpu<float>(x.data(), p.data(), rows, I, yw.data());
    swiglu_fwd_cpu<float>(x.data(), nullptr, rows, I, yu.data());
    yw.insert(yw.end(), yu.begin(), yu.end());
    return yw;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < I; ++c) {
      const float gate = x[size_t(r * 2 * I + c)], up = x[size_t(r * 2 * I + I + c)];
      ASSERT_EQ(std::bit_cast<uint32_t>(res[0][size_t(r * I + c)]),
                std::bit_cast<uint32_t>(num::swiglu_weighted_f32(gate, up, p[size_t(r)])));
      ASSERT_EQ(std::bit_cast<uint32_t>(res[0][size_t(rows * I + r * I + c)]),
                std::bit_cast<uint32_t>(num::mul_rn(num::silu_f32(gate), up)));
    }
}

TEST(OpsSwiglu, GradientsMatchFiniteDifferences) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 3, I = 5;
  auto x = ops_test::uniform<double>(size_t(rows * 2 * I), g, -4, 4);
  auto p = ops_test::uniform<double>(size_t(rows), g, 0, 1);
  const auto r = ops_test::uniform<double>(size_t(rows * I), g);
  std::vector<double> y(static_cast<size_t>(rows * I)), dx(x.size()), dp(p.size());
  for (const bool weighted : {true, false}) {
    const double* pw = weighted ? p.data() : nullptr;
    auto loss = [&] {
      swiglu_fwd_cpu<double>(x.data(), pw, rows, I, y.data());
      return ops_test::dot(r, y);
    };
    // The float64 forward against silu(g) u p written out.
    loss();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < I; ++c) {
        const double gate = x[size_t(i * 2 * I + c)], up = x[size_t(i * 2 * I + I + c)];
        const double ref = gate / (1 + std::exp(-gate)) * up * (weighted ? p[size_t(i)] : 1.0);
        ASSERT_NEAR(y[size_t(i * I + c)], ref, 1e-14 * (1 + std::fabs(ref)));
      }
    swiglu_bwd_cpu<double>(x.data(), pw, r.data(), rows, I, dx.data(), dp.data());
    ops_test::check_gradient(x, dx, loss, weighted ? "dx (weighted)" : "dx");
    if (weighted) ops_test::check_gradient(p, dp, loss, "dp");
  }
}

namespace {

// Reference top-k: experts sorted by descending prob, ties by ascending index.
std::vector<int32_t> topk_reference(const float* probs, int64_t E, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  idx.resize(size_t(k));
  return idx;
}

// The CPU router over T tokens of E logits.
struct TopkOut {
  std::vector<float> probs, w;
  std::vector<int32_t> ids;
};
TopkOut run_topk(const std::vector<float>& logits, int64_t T, int64_t E, int64_t k, bool renorm) {
  TopkOut o{std::vector<float>(size_t(T * E)), std::vector<float>(size_t(T * k)),
            std::vector<int32_t>(size_t(T * k))};
  moe_router_topk_fwd_cpu<float>(logits.data(), T, E, k, renorm, o.probs.data(), o.ids.data(),
                                 o.w.data());
  return o;
}

// One token's router output against the stable-sort reference over its softmax row: ids in
// (p descending, e ascending) order, weights p or p / (sum of the k p in slot order), bit for bit.
void expect_topk_of_row(const std::vector<float>& row, const int32_t* ids, const float* w,
                        int64_t E, int64_t k, bool renorm, const std::string& at) {
  const auto ref = topk_reference(row.data(), E, k);
  float sum = 0;
  for (int64_t s = 0; s < k; ++s) sum += row[size_t(ref[size_t(s)])];
  for (int64_t s = 0; s < k; ++s) {
    ASSERT_EQ(ids[s], ref[size_t(s)]) << at << " slot " << s;
    const float p = row[size_t(ref[size_t(s)])], want = renorm ? p / sum : p;
    ASSERT_EQ(std::bit_cast<uint32_t>(w[s]), std::bit_cast<uint32_t>(want)) << at << " slot " << s;
  }
}

}  // namespace

TEST(OpsMoeRouter, TopkFollowsSoftmaxWithTiesToTheLowerExpert) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t T = 40, E = 8;
  // Logits on a coarse grid so that ties are frequent.
  std::vector<float> logits(static_cast<size_t>(T * E));
  for (auto& l : logits) l = float(int(g() % 5)) * 0.5f;
  std::fill(logits.begin(), logits.begin() + E, 1.0f);  // token 0: all experts tie
  for (const int64_t k : {int64_t(1), int64_t(2), E}) {
    for (const bool renorm : {false, true}) {
      const auto [probs, w, ids] = run_topk(logits, T, E, k, renorm);
      std::vector<float> row(static_cast<size_t>(E));
      for (int64_t t = 0; t < T; ++t) {
        softmax_row(HostRouterLanes{}, logits.data() + t * E, E, row.data());
        ASSERT_TRUE(ops_test::same_bits(
            row, std::vector<float>(probs.begin() + t * E, probs.begin() + (t + 1) * E)));
        expect_topk_of_row(row, ids.data() + t * k, w.data() + t * k, E, k, renorm,
                           "token " + std::to_string(t));
      }
      // token 0 ties everywhere: experts 0..k-1 in order.
      for (int64_t s = 0; s < k; ++s) EXPECT_EQ(ids[size_t(s)], s);
    }
  }
  std::vector<float> probs(static_cast<size_t>(T * E)), w(size_t(T * (E + 1)));
  std::vector<int32_t> ids(size_t(T * (E + 1)));
  EXPECT_THROW(moe_router_topk_fwd_cpu<float>(logits.data(), T, E, E + 1, false, probs.data(),
                                              ids.data(), w.data()),
               std::invalid_argument);
}

// Rows wider than the 32 lanes (several experts per lane), -inf logits (probabilities of exactly
// +0 that tie and go to the lower expert) and rows without a distribution (a NaN logit, every
// logit -inf: experts 0..k-1 with NaN weights); weights compared bit for bit. Rows up to
// kRouterDimsExperts keep their probabilities in the executor's Dims array, wider rows read them
// back from probs: both sides of that limit are covered.
TEST(OpsMoeRouter, TopkOnWideRowsWithZeroProbabilitiesAndRowsWithoutADistribution) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const float kNegInf = -std::numeric_limits<float>::infinity();
  static_assert(kRouterDimsExperts == 256);
  for (const int64_t E :
       {int64_t(33), int64_t(128), int64_t(200), int64_t(256), int64_t(257), int64_t(600)}) {
    const int64_t T = 6;
    std::vector<float> logits(static_cast<size_t>(T * E));
    for (auto& l : logits) l = float(int(g() % 7)) * 0.25f - 1.0f;
    for (int64_t e = 0; e < E; ++e) {
      if (e % 3 != 1) logits[size_t(E + e)] = kNegInf;  // token 1: most experts at p = +0
      logits[size_t(3 * E + e)] = kNegInf;              // token 3: no distribution
    }
    logits[size_t(2 * E + E / 2)] = std::numeric_limits<float>::quiet_NaN();  // token 2
    for (const int64_t k : {int64_t(1), int64_t(8), E}) {
      for (const bool renorm : {false, true}) {
        const auto [probs, w, ids] = run_topk(logits, T, E, k, renorm);
        std::vector<float> row(static_cast<size_t>(E));
        for (int64_t t = 0; t < T; ++t) {
          const std::string at =
              "E " + std::to_string(E) + " k " + std::to_string(k) + " token " + std::to_string(t);
          softmax_row(HostRouterLanes{}, logits.data() + t * E, E, row.data());
          if (t == 2 || t == 3) {  // no distribution: experts 0..k-1, NaN weights
            for (int64_t s = 0; s < k; ++s) {
              ASSERT_EQ(ids[size_t(t * k + s)], s) << at;
              ASSERT_TRUE(std::isnan(w[size_t(t * k + s)])) << at;
            }
            continue;
          }
          expect_topk_of_row(row, ids.data() + t * k, w.data() + t * k, E, k, renorm, at);
        }
      }
    }
  }
}

TEST(OpsMoeRouter, GradientMatchesFiniteDifferences) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t T = 3, E = 6, k = 2;
  // Distinct logits 0.4 apart (shuffled), so a step of 1e-5 never changes the top-k choice.
  auto logits = std::vector<double>(size_t(T * E));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> row(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) row[size_t(e)] = 0.4 * double(e) - 1.0;
    std::shuffle(row.begin(), row.end(), g);
    std::copy(row.begin(), row.end(), logits.begin() + t * E);
  }
  const auto r = ops_test::uniform<double>(size_t(T * k), g);
  std::vector<double> probs(static_cast<size_t>(T * E)), w(static_cast<size_t>(T * k)),
      dlogits(static_cast<size_t>(T * E));
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (const bool renorm : {false, true}) {
    auto loss = [&] {
      moe_router_topk_fwd_cpu<double>(logits.data(), T, E, k, renorm, probs.data(), ids.data(),
                                      w.data());
      return ops_test::dot(r, w);
    };
    loss();
    moe_router_topk_bwd_cpu<double>(probs.data(), ids.data(), r.data(), T, E, k, renorm,
                                    dlogits.data());
    ops_test::check_gradient(logits, dlogits, loss, renorm ? "dlogits (renormalised)" : "dlogits");
  }
}

TEST(OpsMoePermutation, ExpertMajorTokensAscendingWithEmptyExperts) {
  // 5 tokens, k = 2, experts 0, 3 and 5 receive no token.
  const int64_t T = 5, E = 6, k = 2;
  const std::vector<int32_t> ids{4, 1, 1, 2, 4, 2, 1, 4, 2, 1};
  const MoePermutation p = moe_permutation_cpu(ids.data(), T, E, k);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 0, 4, 7, 7, 10, 10}));
  // expert 1: tokens 0, 1, 3, 4; expert 2: tokens 1, 2, 4; expert 4: tokens 0, 2, 3.
  EXPECT_EQ(p.row_token, (std::vector<int32_t>{0, 1, 3, 4, 1, 2, 4, 0, 2, 3}));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const int32_t row = p.slot_row[size_t(t * k + s)];
      EXPECT_EQ(p.row_token[size_t(row)], t);
      EXPECT_GE(row, p.offsets[size_t(ids[size_t(t * k + s)])]);
      EXPECT_LT(row, p.offsets[size_t(ids[size_t(t * k + s)] + 1)]);
    }
  std::vector<int32_t> bad = ids;
  bad[7] = int32_t(E);
  EXPECT_THROW(moe_permutation_cpu(bad.data(), T, E, k), std::out_of_range);
  const MoePermutation empty = moe_permutation_cpu(nullptr, 0, E, k);
  EXPECT_EQ(empty.offsets, std::vector<int64_t>(size_t(E + 1), 0));
}

TEST(OpsMoeCombine, GatherAndCombineGradientsAndReference) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t T = 4, E = 5, k = 3, d = 3;
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token, expert 4 never used
    std::vector<int32_t> e{0, 1, 2, 3};
    std::shuffle(e.begin(), e.end(), g);
    std::copy_n(e.begin(), k, ids.begin() + t * k);
  }
  const MoePermutation p = moe_permutation_cpu(ids.data(), T, E, k);
  auto x = ops_test::uniform<double>(size_t(T * d), g);
  auto eo = ops_test::uniform<double>(size_t(T * k * d), g);
  auto w = ops_test::uniform<double>(size_t(T * k), g);
  std::vector<double> gathered(static_cast<size_t>(T * k * d)), out(static_cast<size_t>(T * d));
  // Gather: a permutation copy; its backward sums each token's slots.
  const auto rg = ops_test::uniform<double>(gathered.size(), g);
  std::vector<double> dx(x.size());
  moe_gather_bwd_cpu<double>(rg.data(), p, d, dx.data());
  ops_test::check_gradient(
      x, dx,
      [&] {
        moe_gather_fwd_cpu<double>(x.data(), p, d, gathered.data());
        return ops_test::dot(rg, gathered);
      },
      "gather dx");
  // Combine against the slot loop written out, and its gradients.
  moe_combine_fwd_cpu<double>(eo.data(), w.data(), p, d, out.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < d; ++c) {
      double ref = 0;
      for (int64_t s = 0; s < k; ++s) {
        const int64_t row = p.slot_row[size_t(t * k + s)];
        ASSERT_EQ(p.row_token[size_t(row)], t);
        ref += w[size_t(t * k + s)] * eo[size_t(row * d + c)];
      }
      ASSERT_NEAR(out[size_t(t * d + c)], ref, 1e-15);
    }
  const auto rc = ops_test::uniform<double>(out.size(), g);
  std::vector<double> deo(eo.size()), dw(w.size());
  moe_combine_bwd_cpu<double>(rc.data(), eo.data(), w.data(), p, d, deo.data(), dw.data());
  auto loss = [&] {
    moe_combine_fwd_cpu<double>(eo.data(), w.data(), p, d, out.data());
    return ops_test::dot(rc, out);
  };
  ops_test::check_gradient(eo, deo, loss, "dexpert_out");
  ops_test::check_gradient(w, dw, loss, "dweights");
  moe_combine_bwd_cpu<double>(rc.data(), eo.data(), nullptr, p, d, deo.data(), nullptr);
  ops_test::check_gradient(
      eo, deo,
      [&] {
        moe_combine_fwd_cpu<double>(eo.data(), nullptr, p, d, out.data());
        return ops_test::dot(rc, out);
      },
      "dexpert_out (unweighted)");
}

TEST(OpsMoe, BitsIndependentOfThreadCount) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t T = 257, E = 16, k = 4, d = 64;
  const auto logits = ops_test::uniform<float>(size_t(T * E), g, -3, 3);
  const auto x = ops_test::uniform<float>(size_t(T * d), g);
  const auto dw = ops_test::uniform<float>(size_t(T * k), g);
  const auto dout = ops_test::uniform<float>(size_t(T * d), g);
  auto run = [&] {
    std::vector<float> probs(static_cast<size_t>(T * E)), w(static_cast<size_t>(T * k)),
        dl(static_cast<size_t>(T * E));
    std::vector<int32_t> ids(static_cast<size_t>(T * k));
    moe_router_topk_fwd_cpu<float>(logits.data(), T, E, k, true, probs.data(), ids.data(),
                                   w.data());
    moe_router_topk_bwd_cpu<float>(probs.data(), ids.data(), dw.data(), T, E, k, true, dl.data());
    const MoePermutation p = moe_permutation_cpu(ids.data(), T, E, k);
    std::vector<float> gx(static_cast<size_t>(T * k * d)), out(static_cast<size_t>(T * d)),
        dgx(gx.size()), dwc(w.size()), dxg(x.size());
    moe_gather_fwd_cpu<float>(x.data(), p, d, gx.data());
    moe_combine_fwd_cpu<float>(gx.data(), w.data(), p, d, out.data());
    moe_combine_bwd_cpu<float>(dout.data(), gx.data(), w.data(), p, d, dgx.data(), dwc.data());
    moe_gather_bwd_cpu<float>(dgx.data(), p, d, dxg.data());
    for (const auto* part : {&w, &dl, &out, &dwc, &dxg})
      probs.insert(probs.end(), part->begin(), part->end());
    for (int32_t id : ids) probs.push_back(float(id));
    return probs;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
}
