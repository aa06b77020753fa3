// The KV cache ops (ops/kv_cache.h, tensor_ops.h) on the CPU: the rounding rule written out by hand
// (bf16 RNE; fp8 with a scale per (token, kv head) row, edges), the cache write + attention_cached
// of a sampler against the learner's kv_round_inplace + kRowwise attention bit for bit (GQA
// ratios, head dims, chunk boundaries, rows in any order), several heads per attention_row call
// against one head per call, and the argument checks.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>

#include "lockstep/numerics/codecs.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/kv_cache.h"
#include "lockstep/ops/tensor_ops.h"
#include "ops_test_util.h"

using namespace lockstep;
using namespace lockstep::ops;
using ops_test::SeedTrace;

namespace {

Tensor f32(const std::vector<float>& v, std::vector<int64_t> shape) {
  return Tensor::from_vector<float>(v, std::move(shape), DType::kF32);
}
Tensor i64(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}, DType::kI64);
}
Tensor i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, DType::kI32);
}
std::vector<float> values(const Tensor& t) {
  const auto d = t.data<float>();
  return {d.begin(), d.end()};
}

// The fp8 rule of ops/kv_cache.h written out with the codecs, for one row.
std::vector<float> fp8_rule(const std::vector<float>& x) {
  float a = 0;
  bool any = false;
  for (float v : x)
    if (!std::isnan(v)) a = any ? std::max(a, std::fabs(v)) : std::fabs(v), any = true;
  if (!any) a = NAN;
  float s = 1.0f;
  if (a > 0 && std::isfinite(a)) {
    s = 448.0f / a;
    if (std::isinf(s)) s = std::numeric_limits<float>::max();
  }
  std::vector<float> out;
  for (float v : x) out.push_back(num::decode_e4m3(num::encode_e4m3(v * s)) / s);
  return out;
}

}  // namespace

TEST(OpsKvCache, Bf16RoundingIsRne) {
  std::vector<float> x{1.0f, 1.00390625f, 1.01171875f, -3.14159f, 0.0f, -0.0f, INFINITY, 1e-40f};
  Tensor t = f32(x, {2, 4});
  kv_round_inplace(t, 2, KvDtype::kBf16);
  const auto got = values(t);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(got[i]),
              std::bit_cast<uint32_t>(num::bf16_to_f32(num::f32_to_bf16(x[i]))))
        << i;
  EXPECT_EQ(got[1], 1.0f);       // tie to even
  EXPECT_EQ(got[2], 1.015625f);  // tie to even upward
}

TEST(OpsKvCache, Fp8ScaleFollowsEachTokenAndHead) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t hkv = 2, D = 8;
  // Token 0 small, token 1 a thousand times larger: with a scale per token nothing saturates.
  std::vector<float> x = ops_test::uniform<float>(size_t(2 * hkv * D), g);
  for (int64_t i = hkv * D; i < 2 * hkv * D; ++i) x[size_t(i)] *= 1000.0f;
  // Edge rows: zeros (s = 1), NaN among values (ignored by amax), all NaN (s = 1), inf (s = 1,
  // inf saturates to 448), a subnormal amax (448 / a overflows: s = FLT_MAX).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> edge{
      std::vector<float>(D, 0.0f),
      {nan, 1.0f, -2.0f, 0.5f, 3.0f, nan, 0.25f, -0.125f},
      std::vector<float>(D, nan),
      {INFINITY, 1.0f, -1.0f, 2.0f, 0.0f, 5.0f, -7.0f, 1e-3f},
      {1e-40f, -2e-41f, 0.0f, 1e-40f, 5e-41f, 0.0f, -1e-40f, 3e-45f},
      {448.0f, 464.0f, -448.0f, 1.0f, 0.0625f, 0.001953125f, 0.0009765625f, -0.5f}};
  for (const auto& r : edge) x.insert(x.end(), r.begin(), r.end());
  const int64_t rows = int64_t(x.size()) / (hkv * D);
  Tensor t = f32(x, {rows, hkv * D});
  kv_round_inplace(t, hkv, KvDtype::kFp8E4M3);
  const auto got = values(t);
  for (int64_t r = 0; r < rows * hkv; ++r) {
    const std::vector<float> row(x.begin() + r * D, x.begin() + (r + 1) * D);
    const auto want = fp8_rule(row);
    for (int64_t d = 0; d < D; ++d) {
      const float a = got[size_t(r * D + d)], b = want[size_t(d)];
      EXPECT_TRUE((std::isnan(a) && std::isnan(b)) ||
                  std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b))
          << "row " << r << " dim " << d << ": " << a << " vs " << b;
    }
  }
  // E4M3 keeps 4 significant bits: every value of the two random tokens is within 2^-4 relative
  // of its input, or half the subnormal step 2^-10 / s of its own row (s = 448 / row amax).
  for (int64_t r = 0; r < 2 * hkv; ++r) {
    float a = 0;
    for (int64_t d = 0; d < D; ++d) a = std::max(a, std::fabs(x[size_t(r * D + d)]));
    for (int64_t d = 0; d < D; ++d) {
      const float in = x[size_t(r * D + d)], out = got[size_t(r * D + d)];
      EXPECT_LE(std::fabs(out - in), std::fabs(in) * (1.0f / 16 + 1e-6f) + a / 448 / 1024)
          << r << " " << d;
    }
  }
  EXPECT_EQ(got[size_t(2 * hkv * D + 3 * D)], 448.0f);  // inf with s = 1
  EXPECT_TRUE(std::isnan(got[size_t(2 * hkv * D + 2 * D)]));
  EXPECT_EQ(kv_fp8_scale(1e-40f), std::numeric_limits<float>::max());
}

TEST(OpsKvCache, SamplerCacheEqualsLearnerRowwiseBits) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  struct Case {
    int64_t hq, hkv, D;
  };
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3})
    for (Case c : {Case{4, 4, 16}, Case{4, 2, 24}, Case{8, 1, 64}, Case{6, 1, 8}}) {
      SCOPED_TRACE(std::to_string(int(dt)) + " " + std::to_string(c.hq) + "/" +
                   std::to_string(c.hkv) + " D " + std::to_string(c.D));
      const std::vector<int64_t> lengths{1, 31, 32, 33, 70};
      std::vector<int64_t> cu{0};
      for (int64_t n : lengths) cu.push_back(cu.back() + n);
      const int64_t T = cu.back(), W = c.hkv * c.D;
      const auto q = ops_test::uniform<float>(size_t(T * c.hq * c.D), g);
      auto k = ops_test::uniform<float>(size_t(T * W), g, -3, 3);
      auto v = ops_test::uniform<float>(size_t(T * W), g);
      // Learner: K / V rounded by the cache rule, packed rowwise attention.
      Tensor kt = f32(k, {T, W}), vt = f32(v, {T, W});
      kv_round_inplace(kt, c.hkv, dt);
      kv_round_inplace(vt, c.hkv, dt);
      Tensor lse_l;
      const Tensor out_l = attention(f32(q, {T, c.hq * c.D}), kt, vt, i64(cu), {c.hq, c.hkv, c.D},
                                     AttentionKernel::kRowwise, &lse_l);
      // Sampler: sequence s in slot (s * 3) % 5, its tokens written unrounded in one call (rows of
      // all sequences interleaved), then every token attends in one call, rows in reverse order.
      KvCacheLayer L = kv_cache_layer(5, 80, c.hkv, c.D, dt);
      std::vector<int64_t> slot_of(static_cast<size_t>(T)), pos_of(static_cast<size_t>(T));
      for (size_t s = 0; s + 1 < cu.size(); ++s)
        for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
          slot_of[size_t(t)] = int64_t(s * 3 % 5), pos_of[size_t(t)] = t - cu[s];
      kv_cache_write(L, f32(k, {T, W}), f32(v, {T, W}), i64(slot_of), i64(pos_of));
      std::vector<float> qr;
      std::vector<int32_t> sr, pr;
      for (int64_t t = T - 1; t >= 0; --t) {
        qr.insert(qr.end(), q.begin() + t * c.hq * c.D, q.begin() + (t + 1) * c.hq * c.D);
        sr.push_back(int32_t(slot_of[size_t(t)]));
        pr.push_back(int32_t(pos_of[size_t(t)]));
      }
      Tensor lse_s;
      const Tensor out_s = attention_cached(f32(qr, {T, c.hq * c.D}), L, i32(sr), i32(pr),
                                            {c.hq, c.hkv, c.D}, &lse_s);
      const auto ol = values(out_l), os = values(out_s), ll = values(lse_l), ls = values(lse_s);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t r = T - 1 - t;
        for (int64_t i = 0; i < c.hq * c.D; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(ol[size_t(t * c.hq * c.D + i)]),
                    std::bit_cast<uint32_t>(os[size_t(r * c.hq * c.D + i)]))
              << "token " << t << " element " << i;
        for (int64_t h = 0; h < c.hq; ++h)
          ASSERT_EQ(std::bit_cast<uint32_t>(ll[size_t(t * c.hq + h)]),
                    std::bit_cast<uint32_t>(ls[size_t(r * c.hq + h)]))
              << "token " << t << " head " << h;
      }
    }
}

TEST(OpsKvCache, GroupedHeadsPerCallEqualOneHeadPerCall) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  // Hq 8 / Hkv 1: the packed forward serves the 8 heads of a group in one attention_row call; each
  // head's bits equal the single-head row function's.
  const int64_t hq = 8, D = 40, n = 75;
  const auto q = ops_test::uniform<float>(size_t(n * hq * D), g);
  const auto k = ops_test::uniform<float>(size_t(n * D), g, -2, 2);
  const auto v = ops_test::uniform<float>(size_t(n * D), g);
  Tensor lse;
  const Tensor out = attention(f32(q, {n, hq * D}), f32(k, {n, D}), f32(v, {n, D}), i64({0, n}),
                               {hq, 1, D}, AttentionKernel::kRowwise, &lse);
  const auto o = values(out), l = values(lse);
  const float scale = float(attention_scale(D));
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < hq; ++h) {
      float lr = 0;
      attention_row<float>(q.data() + (t * hq + h) * D, k.data(), v.data(), D, t + 1, D, scale,
                           row.data(), &lr);
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(std::bit_cast<uint32_t>(row[size_t(d)]),
                  std::bit_cast<uint32_t>(o[size_t((t * hq + h) * D + d)]));
      ASSERT_EQ(std::bit_cast<uint32_t>(lr), std::bit_cast<uint32_t>(l[size_t(t * hq + h)]));
    }
}

// cached_qkv_prologue on the CPU: q and the cache rows of split_cols -> rmsnorm -> rope_inplace ->
// kv_cache_write run one by one (the GPU kernel is checked against the same sequence by
// lockstep_test_gpu --op kv_cache), and its refusals.
TEST(OpsKvCache, CachedQkvPrologueIsTheSequence) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3}) {
    const int64_t hq = 6, hkv = 2, D = 16, T = 5, W = (hq + 2 * hkv) * D;
    const auto qkv = ops_test::uniform<float>(size_t(T * W), g, -3, 3);
    const Tensor qn = f32(ops_test::uniform<float>(size_t(D), g), {D});
    const Tensor kn = f32(ops_test::uniform<float>(size_t(D), g), {D});
    const RopeTable rope = rope_table(32, D, 1e6, DType::kF32);
    const Tensor slots = i64({2, 0, 1, 0, 2}), pos = i32({0, 7, 3, 31, 9});
    KvCacheLayer a = kv_cache_layer(3, 32, hkv, D, dt), b = kv_cache_layer(3, 32, hkv, D, dt);
    // The sequence, on copies of the parts.
    const auto part = [&](int64_t col, int64_t width) {
      std::vector<float> out;
      for (int64_t t = 0; t < T; ++t)
        out.insert(out.end(), qkv.begin() + t * W + col, qkv.begin() + t * W + col + width);
      return out;
    };
    Tensor q = rmsnorm(f32(part(0, hq * D), {T * hq, D}), qn, 1e-6, nullptr).view({T, hq * D});
    Tensor k =
        rmsnorm(f32(part(hq * D, hkv * D), {T * hkv, D}), kn, 1e-6, nullptr).view({T, hkv * D});
    rope_inplace(q, pos, hq, rope);
    rope_inplace(k, pos, hkv, rope);
    kv_cache_write(a, k, f32(part((hq + hkv) * D, hkv * D), {T, hkv * D}), slots, pos);
    const Tensor got = cached_qkv_prologue(f32(qkv, {T, W}), qn, kn, 1e-6, pos, rope, b, slots, hq);
    ASSERT_EQ(got.shape(), (std::vector<int64_t>{T, hq * D}));
    const auto e = values(q), o = values(got);
    for (size_t i = 0; i < e.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(e[i]), std::bit_cast<uint32_t>(o[i])) << "q " << i;
    for (const auto& [x, y] :
         {std::pair{&a.k, &b.k}, std::pair{&a.v, &b.v}, std::pair{&a.k_scale, &b.k_scale},
          std::pair{&a.v_scale, &b.v_scale}}) {
      ASSERT_EQ(x->defined(), y->defined());
      if (x->defined()) {
        ASSERT_EQ(0, std::memcmp(x->raw(), y->raw(), x->nbytes()));
      }
    }
  }
  KvCacheLayer L = kv_cache_layer(2, 8, 2, 8, KvDtype::kBf16);
  const Tensor w = f32(std::vector<float>(8, 1.0f), {8});
  const RopeTable rope = rope_table(8, 8, 1e6, DType::kF32);
  const auto refused = [&](const Tensor& qkv, int64_t hq, const char* what) {
    try {
      cached_qkv_prologue(qkv, w, w, 1e-6, i32({0}), rope, L, i64({0}), hq);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(f32(std::vector<float>(40, 1.0f), {1, 40}), 2, "qkv");      // 2 + 4 heads of 8 = 48
  refused(f32(std::vector<float>(56, 1.0f), {1, 56}), 3, "q heads");  // 3 over 2 kv heads
  // A position outside the rope table: refused on the CPU before the cache is written.
  EXPECT_THROW(cached_qkv_prologue(f32(std::vector<float>(48, 1.0f), {1, 48}), w, w, 1e-6, i32({8}),
                                   rope, L, i64({0}), 2),
               std::out_of_range);
  for (uint16_t x : std::span<const uint16_t>(L.k.ptr<uint16_t>(), size_t(L.k.numel())))
    ASSERT_EQ(x, 0u);
}

TEST(OpsKvCache, ArgumentChecks) {
  KvCacheLayer L = kv_cache_layer(2, 4, 1, 8, KvDtype::kFp8E4M3);
  const Tensor rows = f32(std::vector<float>(8, 1.0f), {1, 8});
  EXPECT_THROW(kv_cache_write(L, rows, rows, i64({2}), i64({0})), std::invalid_argument);
  EXPECT_THROW(kv_cache_write(L, rows, rows, i64({0}), i64({4})), std::invalid_argument);
  EXPECT_THROW(kv_cache_write(L, rows, rows, i64({-1}), i64({0})), std::invalid_argument);
  EXPECT_THROW(kv_cache_write(L, rows, rows, i64({0, 1}), i64({0, 1})), std::invalid_argument);
  EXPECT_THROW(attention_cached(rows, L, i64({0}), i64({4}), {1, 1, 8}), std::invalid_argument);
  EXPECT_THROW(attention_cached(rows, L, i64({0}), i64({0}), {1, 1, 16}), std::invalid_argument);
  EXPECT_THROW(attention_cached(rows, L, i64({0}), i64({0}), {3, 2, 8}), std::invalid_argument);
  KvCacheLayer bad = L;
  bad.k_scale = Tensor();
  EXPECT_THROW(attention_cached(rows, bad, i64({0}), i64({0}), {1, 1, 8}), std::invalid_argument);
  bad = L;
  bad.dtype = KvDtype::kBf16;  // U8 codes under a bf16 label
  EXPECT_THROW(kv_cache_write(bad, rows, rows, i64({0}), i64({0})), std::invalid_argument);
  Tensor odd = f32(std::vector<float>(12, 1.0f), {2, 6});
  EXPECT_THROW(kv_round_inplace(odd, 4, KvDtype::kBf16), std::invalid_argument);
  EXPECT_THROW(kv_cache_layer(1, 1, 1, kAttentionMaxHeadDim + 1, KvDtype::kBf16),
               std::invalid_argument);
  // A written position is read back: one token attends to itself only, out = its v value.
  kv_cache_write(L, rows, rows, i64({1}), i64({0}));
  const Tensor o = attention_cached(rows, L, i64({1}), i64({0}), {1, 1, 8});
  for (float x : values(o)) EXPECT_EQ(x, 1.0f);
}
