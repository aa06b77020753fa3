// Causal GQA attention CPU kernels (ops/attention.h): forward against a plain float64 softmax
// attention, float64 finite-difference gradients, batch invariance (alone vs packed, full
// sequence vs token-by-token decode on a KV cache), thread-count independence and edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "lockstep/ops/attention.h"
#include "ops_test_util.h"

using namespace lockstep::ops;
using ops_test::SeedTrace;

namespace {

struct Packed {
  std::vector<int64_t> cu;  // [b + 1]
  AttentionDims dims;
  int64_t tokens() const { return cu.back(); }
};

Packed packed(const std::vector<int64_t>& lengths, int64_t hq, int64_t hkv, int64_t d) {
  Packed p{{0}, {hq, hkv, d}};
  for (int64_t n : lengths) p.cu.push_back(p.cu.back() + n);
  return p;
}

// softmax(q k^T * scale + causal mask) v per sequence and head, in float64, plus logsumexp.
void attention_reference(const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const Packed& p, double scale,
                         std::vector<double>& out, std::vector<double>& lse) {
  const int64_t hq = p.dims.q_heads, hkv = p.dims.kv_heads, D = p.dims.head_dim;
  out.assign(size_t(p.tokens() * hq * D), 0.0);
  lse.assign(size_t(p.tokens() * hq), 0.0);
  for (size_t s = 0; s + 1 < p.cu.size(); ++s)
    for (int64_t i = p.cu[s]; i < p.cu[s + 1]; ++i)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / (hq / hkv);
        std::vector<double> sc;
        for (int64_t j = p.cu[s]; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q[size_t((i * hq + h) * D + d)] * k[size_t((j * hkv + g) * D + d)];
          sc.push_back(dot * scale);
        }
        double m = sc[0];
        for (double x : sc) m = std::max(m, x);
        double sum = 0;
        for (double x : sc) sum += std::exp(x - m);
        for (int64_t j = p.cu[s]; j <= i; ++j) {
          const double w = std::exp(sc[size_t(j - p.cu[s])] - m) / sum;
          for (int64_t d = 0; d < D; ++d)
            out[size_t((i * hq + h) * D + d)] += w * v[size_t((j * hkv + g) * D + d)];
        }
        lse[size_t(i * hq + h)] = m + std::log(sum);
      }
}

template <class T>
struct Result {
  std::vector<T> out, lse;
};

template <class T, class Idx = int64_t>
Result<T> forward(const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                  const Packed& p, T scale) {
  Result<T> r{std::vector<T>(size_t(p.tokens() * p.dims.q_heads * p.dims.head_dim)),
              std::vector<T>(size_t(p.tokens() * p.dims.q_heads))};
  const std::vector<Idx> cu(p.cu.begin(), p.cu.end());
  attention_fwd_cpu<T, Idx>(q.data(), k.data(), v.data(), cu.data(), int64_t(cu.size()) - 1, p.dims,
                            scale, r.out.data(), r.lse.data());
  return r;
}

template <class T>
std::vector<T> rows_of(const std::vector<T>& a, int64_t row_len, int64_t first, int64_t count) {
  return std::vector<T>(a.begin() + first * row_len, a.begin() + (first + count) * row_len);
}

}  // namespace

TEST(OpsAttention, ForwardMatchesFloat64SoftmaxAttention) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  // Lengths across the 32-key chunk boundaries, a length-1 and an empty sequence.
  const Packed p = packed({1, 5, 33, 0, 70}, 4, 2, 16);
  const int64_t nq = p.tokens() * 4 * 16, nk = p.tokens() * 2 * 16;
  const auto qf = ops_test::uniform<float>(size_t(nq), g),
             kf = ops_test::uniform<float>(size_t(nk), g),
             vf = ops_test::uniform<float>(size_t(nk), g);
  const std::vector<double> q(qf.begin(), qf.end()), k(kf.begin(), kf.end()),
      v(vf.begin(), vf.end());
  std::vector<double> ref_out, ref_lse;
  attention_reference(q, k, v, p, 0.25, ref_out, ref_lse);
  const auto rd = forward<double>(q, k, v, p, 0.25);
  for (size_t i = 0; i < ref_out.size(); ++i) ASSERT_NEAR(rd.out[i], ref_out[i], 1e-13) << i;
  for (size_t i = 0; i < ref_lse.size(); ++i) ASSERT_NEAR(rd.lse[i], ref_lse[i], 1e-13) << i;
  // float, |q|, |k|, |v| <= 1, D = 16, scale 1/4: a score's dot is within gamma_16 * 16 * 1/4
  // ~ 4e-6 absolute, exp_f32 within 2 ulp, the sums of <= 70 positive terms within
  // gamma_70 ~ 4.2e-6 relative; out (a convex combination of v) and lse are therefore within
  // ~1.5e-5 absolute. Bound: 5e-5.
  const auto rf = forward<float>(qf, kf, vf, p, 0.25f);
  for (size_t i = 0; i < ref_out.size(); ++i) ASSERT_NEAR(rf.out[i], ref_out[i], 5e-5) << i;
  for (size_t i = 0; i < ref_lse.size(); ++i) ASSERT_NEAR(rf.lse[i], ref_lse[i], 5e-5) << i;
  // int32 cu_seqlens give the same bits as int64.
  const auto rf32 = forward<float, int32_t>(qf, kf, vf, p, 0.25f);
  EXPECT_TRUE(ops_test::same_bits(rf.out, rf32.out));
  EXPECT_TRUE(ops_test::same_bits(rf.lse, rf32.lse));
}

TEST(OpsAttention, GradientMatchesFiniteDifferences) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  // A sequence longer than one key chunk, a length-1 one, and grouped heads (Hq = 2 Hkv).
  const Packed p = packed({3, 1, 35}, 4, 2, 4);
  const int64_t T = p.tokens(), nq = T * 4 * 4, nk = T * 2 * 4;
  auto q = ops_test::uniform<double>(size_t(nq), g), k = ops_test::uniform<double>(size_t(nk), g),
       v = ops_test::uniform<double>(size_t(nk), g);
  const auto r = ops_test::uniform<double>(size_t(nq), g);
  const double scale = 0.5;
  auto loss = [&] { return ops_test::dot(r, forward<double>(q, k, v, p, scale).out); };
  const auto f = forward<double>(q, k, v, p, scale);
  std::vector<double> dq(size_t(nq), 1e300), dk(size_t(nk), 1e300), dv(size_t(nk), 1e300);
  attention_bwd_cpu<double, int64_t>(q.data(), k.data(), v.data(), f.out.data(), f.lse.data(),
                                     r.data(), p.cu.data(), int64_t(p.cu.size()) - 1, p.dims, scale,
                                     dq.data(), dk.data(), dv.data());
  ops_test::check_gradient(q, dq, loss, "dq");
  ops_test::check_gradient(k, dk, loss, "dk");
  ops_test::check_gradient(v, dv, loss, "dv");
}

TEST(OpsAttention, SequenceAloneAndPackedGiveIdenticalBits) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t hq = 4, hkv = 1, D = 32, la = 45;
  const Packed alone = packed({la}, hq, hkv, D);
  const Packed mixed = packed({7, la, 1, 64, 0, 3}, hq, hkv, D);
  const int64_t off = 7;  // first token of the sequence inside the packed batch
  auto qm = ops_test::uniform<float>(size_t(mixed.tokens() * hq * D), g);
  auto km = ops_test::uniform<float>(size_t(mixed.tokens() * hkv * D), g);
  auto vm = ops_test::uniform<float>(size_t(mixed.tokens() * hkv * D), g);
  const auto qa = rows_of(qm, hq * D, off, la), ka = rows_of(km, hkv * D, off, la),
             va = rows_of(vm, hkv * D, off, la);
  const auto ra = forward<float>(qa, ka, va, alone, 0.17677669f);
  const auto rm = forward<float>(qm, km, vm, mixed, 0.17677669f);
  EXPECT_TRUE(ops_test::same_bits(ra.out, rows_of(rm.out, hq * D, off, la)));
  EXPECT_TRUE(ops_test::same_bits(ra.lse, rows_of(rm.lse, hq, off, la)));
}

TEST(OpsAttention, DecodeRowByRowOnAKvCacheEqualsFullSequence) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t hq = 6, hkv = 2, D = 24, n = 70, capacity = 96;
  const Packed p = packed({n}, hq, hkv, D);
  const auto q = ops_test::uniform<float>(size_t(n * hq * D), g);
  const auto k = ops_test::uniform<float>(size_t(n * hkv * D), g, -2, 2);
  const auto v = ops_test::uniform<float>(size_t(n * hkv * D), g);
  const float scale = 1.0f / std::sqrt(float(D));
  const auto full = forward<float>(q, k, v, p, scale);
  // The sampler's cache [capacity, Hkv, D] grows one position per step; step t reads 0..t.
  std::vector<float> kc(size_t(capacity * hkv * D), NAN), vc(kc.size(), NAN);
  std::vector<float> out(static_cast<size_t>(D));
  float lse = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(k.begin() + t * hkv * D, hkv * D, kc.begin() + t * hkv * D);
    std::copy_n(v.begin() + t * hkv * D, hkv * D, vc.begin() + t * hkv * D);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t gk = h / (hq / hkv);
      attention_row<float>(q.data() + (t * hq + h) * D, kc.data() + gk * D, vc.data() + gk * D,
                           hkv * D, t + 1, D, scale, out.data(), &lse);
      ASSERT_TRUE(ops_test::same_bits(out, rows_of(full.out, D, t * hq + h, 1))) << t << " " << h;
      ASSERT_EQ(std::bit_cast<uint32_t>(lse),
                std::bit_cast<uint32_t>(full.lse[size_t(t * hq + h)]));
    }
  }
}

TEST(OpsAttention, BitsIndependentOfThreadCount) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const Packed p = packed({64, 17, 1, 40, 33}, 8, 2, 32);
  const int64_t T = p.tokens(), nq = T * 8 * 32, nk = T * 2 * 32;
  const auto q = ops_test::uniform<float>(size_t(nq), g),
             k = ops_test::uniform<float>(size_t(nk), g),
             v = ops_test::uniform<float>(size_t(nk), g),
             dout = ops_test::uniform<float>(size_t(nq), g);
  auto run = [&] {
    auto f = forward<float>(q, k, v, p, 0.1767767f);
    std::vector<float> dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nk)),
        dv(static_cast<size_t>(nk));
    attention_bwd_cpu<float, int64_t>(q.data(), k.data(), v.data(), f.out.data(), f.lse.data(),
                                      dout.data(), p.cu.data(), int64_t(p.cu.size()) - 1, p.dims,
                                      0.1767767f, dq.data(), dk.data(), dv.data());
    for (const auto* part : {&f.lse, &dq, &dk, &dv})
      f.out.insert(f.out.end(), part->begin(), part->end());
    return f.out;
  };
  const auto res = ops_test::across_thread_counts(run);
  EXPECT_TRUE(ops_test::same_bits(res[0], res[1]));
  EXPECT_TRUE(ops_test::same_bits(res[0], res[2]));
}

TEST(OpsAttention, EdgeCases) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  // Length-1 sequences attend to themselves only: out = v exactly, lse = the scaled score.
  const Packed ones = packed({1, 1, 1}, 2, 1, 8);
  const auto q = ops_test::uniform<float>(3 * 2 * 8, g), k = ops_test::uniform<float>(3 * 8, g),
             v = ops_test::uniform<float>(3 * 8, g);
  const auto r = forward<float>(q, k, v, ones, 0.5f);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 8; ++d)
        ASSERT_EQ(r.out[size_t((t * 2 + h) * 8 + d)], v[size_t(t * 8 + d)]);
  // An empty batch and a batch of empty sequences write nothing and do not fail.
  const std::vector<int64_t> cu_empty{0}, cu_zeros{0, 0, 0};
  float dummy = 0;
  attention_fwd_cpu<float, int64_t>(&dummy, &dummy, &dummy, cu_empty.data(), 0, {2, 1, 8}, 0.5f,
                                    &dummy, &dummy);
  attention_bwd_cpu<float, int64_t>(&dummy, &dummy, &dummy, &dummy, &dummy, &dummy, cu_zeros.data(),
                                    2, {2, 1, 8}, 0.5f, &dummy, &dummy, &dummy);
  // Argument checks.
  const std::vector<int64_t> cu_bad{0, 3, 2};
  EXPECT_THROW((attention_fwd_cpu<float, int64_t>(&dummy, &dummy, &dummy, cu_empty.data(), 0,
                                                  {3, 2, 8}, 0.5f, &dummy, &dummy)),
               std::invalid_argument);
  EXPECT_THROW((attention_fwd_cpu<float, int64_t>(&dummy, &dummy, &dummy, cu_bad.data(), 2,
                                                  {2, 1, 8}, 0.5f, &dummy, &dummy)),
               std::invalid_argument);
  EXPECT_THROW(attention_row<float>(&dummy, &dummy, &dummy, 8, 0, 8, 0.5f, &dummy, &dummy),
               std::invalid_argument);
  EXPECT_THROW(attention_row<float>(&dummy, &dummy, &dummy, 512, 1, kAttentionMaxHeadDim + 1, 0.5f,
                                    &dummy, &dummy),
               std::invalid_argument);
}
