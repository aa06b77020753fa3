// The Tensor-level entries of the basic op families on the CPU (ops/tensor_ops.h): the AdamW step
// and its amax output, the global gradient norm over a list of tensors, the elementwise helpers
// (sigmoid, scale_rows, scale, add, bf16 rounding) against their documented expressions, the rope
// table's device copy, and the argument checks. The CUDA side: tests/cuda/test_gpu_ops_basic.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/ops/optim.h"
#include "lockstep/ops/tensor_ops.h"
#include "ops_test_util.h"

using namespace lockstep;
using namespace lockstep::ops;
using ops_test::SeedTrace;

namespace entries_test {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

Tensor f32(const std::vector<float>& v) {
  return Tensor::from_vector<float>(v, {int64_t(v.size())}, DType::kF32);
}

std::vector<float> values(const Tensor& t) {
  const auto d = t.data<float>();
  return {d.begin(), d.end()};
}

TEST(OpsEntryAdamW, AmaxIsTheLargestMagnitudeOfTheUpdatedWeight) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t n = 70000;
  const AdamWConfig cfg{1e-3, 0.9, 0.95, 1e-8, 0.1};
  auto p0 = ops_test::uniform<float>(size_t(n), g, -2, 2);
  p0[123] = -7.5f;                                   // the largest magnitude is negative
  p0[77] = std::numeric_limits<float>::quiet_NaN();  // NaN elements are ignored
  const auto grad = ops_test::uniform<float>(size_t(n), g);
  Tensor p = f32(p0), m(DType::kF32, {n}), v(DType::kF32, {n});
  Tensor amax;
  adamw_step(p, f32(grad), m, v, cfg, 3, 0.5, &amax);
  ASSERT_EQ(amax.dtype(), DType::kF32);
  ASSERT_EQ(amax.numel(), 1);
  float expect = 0;
  for (float x : values(p))
    if (!std::isnan(x)) expect = std::max(expect, std::fabs(x));
  EXPECT_EQ(bits(amax.ptr<float>()[0]), bits(expect));
  EXPECT_GT(expect, 7.0f);
  // The same update without the amax output: identical weights and moments.
  Tensor p2 = f32(p0), m2(DType::kF32, {n}), v2(DType::kF32, {n});
  adamw_step(p2, f32(grad), m2, v2, cfg, 3, 0.5);
  EXPECT_TRUE(ops_test::same_bits(values(p), values(p2)));
  EXPECT_TRUE(ops_test::same_bits(values(m), values(m2)));
  // A caller's F32 [1] buffer is written in place.
  const void* where = amax.raw();
  adamw_step(p2, f32(grad), m2, v2, cfg, 4, 1.0, &amax);
  EXPECT_EQ(amax.raw(), where);
}

TEST(OpsEntryAdamW, AmaxOfOnlyNanIsTheQuietNanAndOfNothingZero) {
  const AdamWConfig cfg{};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor p = f32({nan, -nan}), m(DType::kF32, {2}), v(DType::kF32, {2});
  Tensor amax;
  adamw_step(p, f32({1.0f, 2.0f}), m, v, cfg, 1, 1.0, &amax);
  EXPECT_EQ(bits(amax.ptr<float>()[0]), 0x7FC00000u);
  Tensor e(DType::kF32, {0}), em(DType::kF32, {0}), ev(DType::kF32, {0});
  adamw_step(e, Tensor(DType::kF32, {0}), em, ev, cfg, 1, 1.0, &amax);
  EXPECT_EQ(bits(amax.ptr<float>()[0]), 0u);
  // Infinity counts as the largest magnitude.
  Tensor pi = f32({1.0f, -std::numeric_limits<float>::infinity()}), mi(DType::kF32, {2}),
         vi(DType::kF32, {2});
  adamw_step(pi, f32({0.0f, 0.0f}), mi, vi, cfg, 1, 1.0, &amax);
  EXPECT_EQ(amax.ptr<float>()[0], std::numeric_limits<float>::infinity());
}

TEST(OpsEntryAdamW, F64AmaxIsThatOfTheValuesRoundedToFloat) {
  std::vector<double> p0{1.0000000001, -3.00000000007, 0.5};
  Tensor p = Tensor::from_vector<double>(p0, {3}, DType::kF64), m(DType::kF64, {3}),
         v(DType::kF64, {3});
  const Tensor grad(DType::kF64, {3});
  Tensor amax;
  AdamWConfig cfg;
  cfg.lr = 0;  // the weight stays
  adamw_step(p, grad, m, v, cfg, 1, 1.0, &amax);
  EXPECT_EQ(amax.ptr<float>()[0], float(3.00000000007));
}

TEST(OpsEntryGradNorm, TheListEntryIsTheChunkedFloat64Norm) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  std::vector<std::vector<float>> gs;
  for (size_t n : {10000u, 4096u, 1u, 0u, 50001u}) gs.push_back(ops_test::uniform<float>(n, g));
  std::vector<Tensor> ts;
  std::vector<std::span<const float>> views;
  for (const auto& x : gs) {
    ts.push_back(f32(x));
    views.emplace_back(x);
  }
  EXPECT_EQ(grad_norm(ts), grad_norm_cpu<float>(views));
  EXPECT_EQ(grad_norm(std::span<const Tensor>{}), 0.0);
  // Order matters and is the list order: the entry follows it (reversed lists may differ, but each
  // equals the kernel on the same list).
  std::vector<Tensor> rts(ts.rbegin(), ts.rend());
  std::vector<std::span<const float>> rviews(views.rbegin(), views.rend());
  EXPECT_EQ(grad_norm(rts), grad_norm_cpu<float>(rviews));
  std::vector<Tensor> mixed{ts[0], Tensor(DType::kF64, {3})};
  EXPECT_THROW(grad_norm(mixed), std::invalid_argument);
}

TEST(OpsEntryElementwise, SigmoidScaleRowsScaleAddAndRounding) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  auto xv = ops_test::uniform<float>(1000, g, -30, 30);
  xv[0] = std::numeric_limits<float>::infinity();
  xv[1] = -std::numeric_limits<float>::infinity();
  xv[2] = -0.0f;
  Tensor x = f32(xv);
  sigmoid_inplace(x);
  for (size_t i = 0; i < xv.size(); ++i)
    ASSERT_EQ(bits(x.ptr<float>()[i]), bits(1.0f / (1.0f + num::exp_f32(-xv[i])))) << i;
  EXPECT_EQ(x.ptr<float>()[0], 1.0f);
  EXPECT_EQ(x.ptr<float>()[1], 0.0f);

  const int64_t rows = 7, d = 33;
  const auto mv = ops_test::uniform<float>(size_t(rows * d), g);
  const auto av = ops_test::uniform<float>(size_t(rows), g);
  const Tensor mt = Tensor::from_vector<float>(mv, {rows, d}, DType::kF32);
  const Tensor y = scale_rows(mt, f32(av));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c)
      ASSERT_EQ(bits(y.ptr<float>()[r * d + c]), bits(av[size_t(r)] * mv[size_t(r * d + c)]));
  EXPECT_THROW(scale_rows(mt, f32({1.0f})), std::invalid_argument);

  const Tensor s = scale(mt, 0.1);
  const Tensor sum = add(mt, s);
  Tensor acc = mt.clone();
  add_inplace(acc, s);
  Tensor rounded = mt.clone();
  round_bf16_inplace(rounded);
  for (int64_t i = 0; i < rows * d; ++i) {
    const float e = mv[size_t(i)] * float(0.1);
    ASSERT_EQ(bits(s.ptr<float>()[i]), bits(e));
    ASSERT_EQ(bits(sum.ptr<float>()[i]), bits(mv[size_t(i)] + e));
    ASSERT_EQ(bits(acc.ptr<float>()[i]), bits(mv[size_t(i)] + e));
    ASSERT_EQ(bits(rounded.ptr<float>()[i]),
              bits(num::bf16_to_f32(num::f32_to_bf16(mv[size_t(i)]))));
  }
  Tensor strided = mt.transpose();
  EXPECT_THROW(add_inplace(strided, mt.transpose().contiguous()), std::invalid_argument);
}

TEST(OpsEntryRope, TheTableCopyKeepsItsValuesAndTheEntryChecksShapes) {
  const RopeTable t = rope_table(16, 8, 1e4, DType::kF32);
  EXPECT_EQ(t.device(), Device::cpu());
  const RopeTable c = t.to(Device::cpu());
  EXPECT_EQ(c.cos.raw(), t.cos.raw());  // already there: no copy
  EXPECT_EQ(c.max_pos, 16);
  Tensor x(DType::kF32, {3, 2 * 8});
  Tensor pos = Tensor::from_vector<int32_t>(std::vector<int32_t>{0, 5, 15}, {3}, DType::kI32);
  rope_inplace(x, pos, 2, t);
  EXPECT_THROW(rope_inplace(x, pos, 3, t), std::invalid_argument);  // not [3, 3, 8]
  Tensor bad = Tensor::from_vector<int32_t>(std::vector<int32_t>{0, 16, 1}, {3}, DType::kI32);
  EXPECT_THROW(rope_inplace(x, bad, 2, t), std::out_of_range);
}

// The bf16 output of rmsnorm and swiglu (the input of a bf16 GEMM operand, written by its
// producer) has the bits of the F32 output cast to bf16: values far apart, rounding ties, values
// that round up to inf, NaN and inf; only F32 inputs narrow.
TEST(OpsEntryBf16Output, RmsnormAndSwigluWriteTheCastOfTheirF32Output) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 5, d = 96;
  std::vector<float> xv(static_cast<size_t>(rows * d)), wv(static_cast<size_t>(d));
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (float& v : xv) v = n(g);
  for (float& v : wv) v = n(g);
  // Row 1: weights make outputs whose low 16 bits are exactly half an ulp of bf16 (ties) and
  // values near float's largest (bf16 rounding overflows to inf); row 2: NaN; row 3: an inf.
  for (int64_t c = 0; c < d; ++c) xv[size_t(d + c)] = 1.0f;
  for (int64_t c = 0; c < 8; ++c) wv[size_t(c)] = std::bit_cast<float>(0x3F808000u + uint32_t(c));
  wv[8] = 3.4e38f;
  xv[size_t(2 * d + 7)] = std::numeric_limits<float>::quiet_NaN();
  xv[size_t(3 * d + 3)] = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::from_vector<float>(xv, {rows, d}, DType::kF32);
  const Tensor w = f32(wv);
  const auto same = [](const Tensor& a, const Tensor& b, const char* what) {
    ASSERT_EQ(a.dtype(), DType::kBF16) << what;
    ASSERT_EQ(a.shape(), b.shape()) << what;
    const auto* pa = static_cast<const uint16_t*>(a.raw());
    const auto* pb = static_cast<const uint16_t*>(b.raw());
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(pa[i], pb[i]) << what << " element " << i;
  };
  Tensor rstd, rstd_b;
  const Tensor y = rmsnorm(x, w, 1e-6, &rstd);
  same(rmsnorm(x, w, 1e-6, &rstd_b, DType::kBF16), cast(y, DType::kBF16), "rmsnorm");
  EXPECT_EQ(std::memcmp(rstd_b.raw(), rstd.raw(), size_t(rows) * 4), 0);
  const Tensor p = f32({0.5f, -2.0f, 1.0f, 3.0e38f, 0.25f});
  for (const Tensor& pp : {Tensor(), p})
    same(swiglu(x, pp, DType::kBF16), cast(swiglu(x, pp), DType::kBF16), "swiglu");
  // Only an F32 input narrows; an output dtype other than x's or BF16 is refused.
  const Tensor xd = cast(x, DType::kF64), wd = cast(w, DType::kF64);
  EXPECT_THROW(rmsnorm(xd, wd, 1e-6, nullptr, DType::kBF16), std::invalid_argument);
  EXPECT_THROW(rmsnorm(x, w, 1e-6, nullptr, DType::kF64), std::invalid_argument);
  EXPECT_THROW(swiglu(xd, Tensor(), DType::kBF16), std::invalid_argument);
  EXPECT_THROW(swiglu(x, Tensor(), DType::kF16), std::invalid_argument);
}

// add_rmsnorm (the residual add fused into the next norm) leaves x with add_inplace's bits and
// returns rmsnorm of the sum, F32 and bf16; an undefined residual is rmsnorm alone; a residual of
// another size, in x's own storage or x not contiguous is refused before anything is written.
TEST(OpsEntryAddRmsnorm, EqualsAddInplaceThenRmsnorm) {
  SeedTrace seed;
  std::mt19937_64 g(seed.value);
  const int64_t rows = 7, d = 80;
  std::normal_distribution<float> n(0.0f, 2.0f);
  const auto random = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& e : v) e = n(g);
    return v;
  };
  const std::vector<float> xv = random(rows * d), rv = random(rows * d), wv = random(d);
  const Tensor res = Tensor::from_vector<float>(rv, {rows, d}, DType::kF32), w = f32(wv);
  for (const std::optional<DType> out : {std::optional<DType>(), std::optional(DType::kBF16)}) {
    Tensor ref = Tensor::from_vector<float>(xv, {rows, d}, DType::kF32);
    add_inplace(ref, res);
    Tensor rstd_ref, rstd;
    const Tensor y_ref = rmsnorm(ref, w, 1e-6, &rstd_ref, out);
    Tensor x = Tensor::from_vector<float>(xv, {rows, d}, DType::kF32);
    const Tensor y = add_rmsnorm(x, res, w, 1e-6, &rstd, out);
    ASSERT_EQ(y.dtype(), y_ref.dtype());
    EXPECT_EQ(std::memcmp(x.raw(), ref.raw(), size_t(rows * d) * 4), 0) << "x after the add";
    EXPECT_EQ(std::memcmp(y.raw(), y_ref.raw(), size_t(y.numel()) * dtype_size(y.dtype())), 0);
    EXPECT_EQ(std::memcmp(rstd.raw(), rstd_ref.raw(), size_t(rows) * 4), 0);
  }
  Tensor x = Tensor::from_vector<float>(xv, {rows, d}, DType::kF32);
  Tensor rstd;
  const Tensor y = add_rmsnorm(x, Tensor(), w, 1e-6, &rstd);
  EXPECT_EQ(std::memcmp(x.raw(), xv.data(), xv.size() * 4), 0) << "no residual: x unchanged";
  EXPECT_EQ(std::memcmp(y.raw(), rmsnorm(x, w, 1e-6, &rstd).raw(), xv.size() * 4), 0);
  const Tensor short_res = Tensor::from_vector<float>(random(d), {1, d}, DType::kF32);
  EXPECT_THROW(add_rmsnorm(x, short_res, w, 1e-6, nullptr), std::invalid_argument);
  EXPECT_THROW(add_rmsnorm(x, x, w, 1e-6, nullptr), std::invalid_argument);
  Tensor xt = Tensor::from_vector<float>(xv, {d, rows}, DType::kF32).transpose();
  EXPECT_THROW(add_rmsnorm(xt, res, w, 1e-6, nullptr), std::invalid_argument);
  EXPECT_EQ(std::memcmp(x.raw(), xv.data(), xv.size() * 4), 0) << "a refused call wrote x";
  // No rows: nothing to add or normalise.
  Tensor x0 = Tensor::empty(DType::kF32, {0, d}, Device::cpu());
  EXPECT_EQ(
      add_rmsnorm(x0, Tensor::empty(DType::kF32, {0, d}, Device::cpu()), w, 1e-6, &rstd).numel(),
      0);
}

TEST(OpsEntryEmbedding, BackwardChecksThatDoutHasARowPerToken) {
  const Tensor ids = Tensor::from_vector<int32_t>(std::vector<int32_t>{0, 1, 1}, {3}, DType::kI32);
  EXPECT_THROW(embedding_backward(Tensor(DType::kF32, {2, 4}), ids, 5), std::invalid_argument);
  const Tensor dt = embedding_backward(Tensor(DType::kF32, {3, 4}), ids, 5);
  EXPECT_EQ(dt.shape(), (std::vector<int64_t>{5, 4}));
}

}  // namespace entries_test
