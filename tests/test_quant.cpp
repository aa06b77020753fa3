// CPU reference quantizers (CONTRACT.md sections 2-10): operation order of the scale rules,
// packing, domains, grouped buffers, layouts, thread-count independence and error reporting.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <random>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"
#include "lockstep/quant/metrics.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/quant/simulate.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep::test;
namespace num = lockstep::num;

namespace {

std::vector<float> random_values(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::student_t_distribution<float> d(3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g) * scale;
  return v;
}

QuantConfig spec_of(Format f, Scaling s) {
  QuantConfig q;
  q.format = f;
  q.scaling = s;
  return q;
}

uint8_t nibble(const QTensor& q, int64_t r, int64_t c) {
  return test::nibble(rowwise(q).data, q.cols, r, c);
}

QTensor quant(const Tensor& x, const QuantConfig& cfg) { return quantize(x, cfg, "x"); }
std::vector<float> dequant(const QTensor& q) { return floats(dequantize(q)); }
std::vector<float> hadamard(const Tensor& x) { return floats(hadamard16_rows(x)); }

std::vector<QuantConfig> all_specs() {
  std::vector<QuantConfig> v;
  for (Scaling s : {Scaling::kPerTensor, Scaling::kPerRow}) {
    v.push_back(spec_of(Format::kNvfp4, s));
    QuantConfig sr = spec_of(Format::kNvfp4, s);
    sr.stochastic = true;
    sr.seed = 99;
    v.push_back(sr);
  }
  QuantConfig b2 = spec_of(Format::kNvfp4, Scaling::kPerTensor);
  b2.block2d = true;
  v.push_back(b2);
  QuantConfig mx = spec_of(Format::kMxfp8, Scaling::kBlock1x32);
  mx.colwise = true;
  v.push_back(mx);
  for (Scaling s :
       {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kBlock1x128, Scaling::kBlock128x128}) {
    v.push_back(spec_of(Format::kFp8, s));
    QuantConfig p = spec_of(Format::kFp8, s);
    p.pow2 = true;
    v.push_back(p);
  }
  return v;
}

}  // namespace

// ---- NVFP4 scale rules -------------------------------------------------------------------------

TEST(Nvfp4, ScaleRulesFollowTheContractOrder) {
  // Search for (A, b) where the contract's order RN(b * RN(S_enc * fl(1/6))) differs from the
  // tempting alternatives, then check that lockstep's block scale follows the contract.
  // Random (A, b) almost never separate the orders (E4M3 rounding absorbs a 1-ulp difference),
  // so b is placed next to E4M3 rounding midpoints, where one ulp decides the code.
  const float inv6 = 1.0f / 6.0f;
  std::mt19937 g(1234);
  std::uniform_real_distribution<float> d(0.01f, 1000.0f);
  int differing = 0;
  for (int i = 0; i < 2000; ++i) {
    const float A = d(g);
    volatile float s_enc = std::fmin(2688.0f / A, num::kFltMax);
    volatile float f1 = s_enc * inv6;
    const num::TwoLevelOuter o = num::two_level_outer(A, 6.0f);
    ASSERT_EQ(o.s_enc, s_enc);
    for (int code = 8; code < 0x7E; code += 7) {
      const float mid =
          0.5f * (num::decode_e4m3(uint8_t(code)) + num::decode_e4m3(uint8_t(code + 1)));
      float b = mid / f1;
      for (int k = 0; k < 4; ++k, b = std::nextafter(b, 0.0f)) {
        volatile float contract = b * f1;
        volatile float alt1 = b * s_enc;
        volatile float alt1b = alt1 * inv6;
        volatile float alt2 = alt1 / 6.0f;
        const uint8_t want = num::encode_e4m3(contract);
        ASSERT_EQ(num::two_level_block_scale(b, o), want) << "A=" << A << " b=" << b;
        if (num::encode_e4m3(alt1b) != want || num::encode_e4m3(alt2) != want) ++differing;
      }
    }
  }
  EXPECT_GT(differing, 0) << "the search found no case that distinguishes the operation orders";
}

TEST(Nvfp4, EncodeFactorIsReciprocalOfDecodedScaleTimesSdec) {
  num::TwoLevelOuter o = num::two_level_outer(10.0f, 6.0f);
  for (int c = 0; c < 0x7F; ++c) {
    volatile float prod = num::decode_e4m3(uint8_t(c)) * o.s_dec;
    volatile float inv = 1.0f / prod;
    float want = std::fmin(inv, num::kFltMax);
    EXPECT_EQ(num::two_level_encode_factor(uint8_t(c), o), want) << c;
  }
  EXPECT_EQ(num::two_level_encode_factor(0, o), num::kFltMax);  // s_b = 0 -> FLT_MAX
}

TEST(Nvfp4, OuterScaleEdgeCases) {
  EXPECT_EQ(num::two_level_outer(0.0f, 6.0f).s_enc, 1.0f);
  EXPECT_EQ(num::two_level_outer(std::numeric_limits<float>::infinity(), 6.0f).s_enc, 1.0f);
  EXPECT_EQ(num::two_level_outer(1e-40f, 6.0f).s_enc, num::kFltMax);  // 2688 / A overflows: clamp
  EXPECT_EQ(num::two_level_outer(6.0f, 6.0f).s_enc, 448.0f);
}

TEST(Nvfp4, PacksEvenColumnInLowNibble) {
  std::vector<float> x(16, 0.0f);
  x[0] = 1.0f;   // code 2
  x[1] = 6.0f;   // code 7
  x[2] = -0.5f;  // code 9
  x[3] = 0.0f;
  QTensor q = quant(mat(x, 1, 16), spec_of(Format::kNvfp4, Scaling::kPerTensor));
  ASSERT_EQ(rowwise(q).data.size(), 8u);
  EXPECT_EQ(rowwise(q).data[0], 0x72);
  EXPECT_EQ(rowwise(q).data[1], 0x09);
  EXPECT_EQ(rowwise(q).amax, std::vector<float>{6.0f});
  EXPECT_EQ(rowwise(q).block_scale[0], 0x7E);  // 6 * RN(448 * fl(1/6)) = 448
}

TEST(Nvfp4, ScaleUnderflowSaturatesElementsThatDecodeToZero) {
  // One huge block sets A; a block of tiny values gets s_b = 0 -> enc = FLT_MAX -> codes +-6.
  std::vector<float> x(32, 0.0f);
  x[0] = 1e30f;
  x[16] = 1e-10f;
  x[17] = -1e-10f;
  QTensor q = quant(mat(x, 1, 32), spec_of(Format::kNvfp4, Scaling::kPerTensor));
  EXPECT_EQ(rowwise(q).block_scale[1], 0x00);
  EXPECT_EQ(nibble(q, 0, 16), 0x7);
  EXPECT_EQ(nibble(q, 0, 17), 0xF);
  EXPECT_EQ(nibble(q, 0, 18), 0x0);
  std::vector<float> back = dequant(q);
  EXPECT_EQ(back[16], 0.0f);
  EXPECT_EQ(back[17], 0.0f);
}

TEST(Nvfp4, NonFiniteInputsFollowTheRules) {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(32, 1.0f);
  x[1] = nan;
  x[16] = inf;
  QTensor q = quant(mat(x, 1, 32), spec_of(Format::kNvfp4, Scaling::kPerTensor));
  // A = inf -> S_enc = 1; NaN is ignored by amax.
  EXPECT_TRUE(std::isinf(rowwise(q).amax[0]));
  EXPECT_EQ(nibble(q, 0, 1), 0x7);  // NaN element -> 0x7
  // A block of only NaN has amax NaN -> scale fminf(NaN, FLT_MAX) = FLT_MAX -> E4M3 448.
  std::vector<float> y(16, nan);
  QTensor qy = quant(mat(y, 1, 16), spec_of(Format::kNvfp4, Scaling::kPerTensor));
  EXPECT_TRUE(std::isnan(rowwise(qy).amax[0]));
  EXPECT_EQ(rowwise(qy).block_scale[0], 0x7E);
}

TEST(Nvfp4, ValuesOnTheGridRoundTripExactly) {
  // With A = 6 * 448 and block amax 6 * 448 / k... use S_dec = 1 domains: elements e * s.
  std::vector<float> x;
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int i = 0; i < 64; ++i) x.push_back((i % 2 ? -1.0f : 1.0f) * grid[i % 8] * 2.0f);
  x[7] = 12.0f;  // every block holds 6 * 2 so the block scale is exact
  x[23] = 12.0f;
  x[39] = 12.0f;
  x[55] = 12.0f;
  QuantConfig s = spec_of(Format::kNvfp4, Scaling::kPerRow);
  std::vector<float> amax_one(16, 0);
  // Force S_enc = 1: A = 2688.
  x[63] = 2688.0f;
  x[62] = 2688.0f;
  QTensor q = quant(mat(x, 1, 64), s);
  std::vector<float> back = dequant(q);
  for (int i = 0; i < 48; ++i) EXPECT_EQ(back[size_t(i)], x[size_t(i)]) << i;
}

TEST(Nvfp4, PerRowDomainsAreIndependentOfOtherRows) {
  const uint64_t seed = test_seed();
  auto v = random_values(8 * 64, seed);
  QTensor all = quant(mat(v, 8, 64), spec_of(Format::kNvfp4, Scaling::kPerRow));
  for (int64_t r = 0; r < 8; ++r) {
    std::vector<float> row(v.begin() + r * 64, v.begin() + (r + 1) * 64);
    QTensor one = quant(mat(row, 1, 64), spec_of(Format::kNvfp4, Scaling::kPerRow));
    const CopyBytes o = rowwise(one), a = rowwise(all);
    EXPECT_TRUE(std::equal(o.data.begin(), o.data.end(), a.data.begin() + r * 32))
        << "seed " << seed;
    EXPECT_TRUE(
        std::equal(o.block_scale.begin(), o.block_scale.end(), a.block_scale.begin() + r * 4));
    EXPECT_EQ(o.amax[0], a.amax[size_t(r)]);
  }
}

TEST(Nvfp4, TwoDimensionalBlocksShareOneScalePerTile) {
  const uint64_t seed = test_seed();
  auto v = random_values(32 * 48, seed);
  QuantConfig s = spec_of(Format::kNvfp4, Scaling::kPerTensor);
  s.block2d = true;
  QTensor q = quant(mat(v, 32, 48), s);
  num::TwoLevelOuter o = num::two_level_outer(rowwise(q).amax[0], 6.0f);
  for (int64_t tr = 0; tr < 2; ++tr)
    for (int64_t j = 0; j < 3; ++j) {
      float acc = num::amax_empty();
      for (int64_t r = tr * 16; r < tr * 16 + 16; ++r)
        for (int64_t c = j * 16; c < j * 16 + 16; ++c)
          acc = num::amax_fold(acc, v[size_t(r * 48 + c)]);
      for (int64_t r = tr * 16; r < tr * 16 + 16; ++r)
        EXPECT_EQ(rowwise(q).block_scale[size_t(r * 3 + j)], num::two_level_block_scale(acc, o))
            << "seed " << seed;
    }
}

TEST(Nvfp4, JointSharesTheLargerAmax) {
  const uint64_t seed = test_seed();
  auto a = random_values(16 * 32, seed, 10.0f);
  auto b = random_values(16 * 32, seed + 1, 0.1f);
  std::vector<Tensor> xs{mat(a, 16, 32), mat(b, 16, 32)};
  auto j = quantize_joint(xs, spec_of(Format::kNvfp4, Scaling::kPerTensor));
  QTensor qa = quant(xs[0], spec_of(Format::kNvfp4, Scaling::kPerTensor));
  QTensor qb = quant(xs[1], spec_of(Format::kNvfp4, Scaling::kPerTensor));
  float big = std::max(rowwise(qa).amax[0], rowwise(qb).amax[0]);
  EXPECT_EQ(rowwise(j[0]).amax[0], big);
  EXPECT_EQ(rowwise(j[1]).amax[0], big);
  const QTensor& larger = rowwise(qa).amax[0] >= rowwise(qb).amax[0] ? qa : qb;
  EXPECT_TRUE(same_bytes(rowwise(qa).amax[0] >= rowwise(qb).amax[0] ? j[0] : j[1], larger))
      << "seed " << seed;
  EXPECT_NE(rowwise(j[1]).block_scale, rowwise(qb).block_scale)
      << "the smaller tensor must be scaled by the shared amax";
}

// ---- grouped buffers
// -----------------------------------------------------------------------------

TEST(Grouped, EachGroupMatchesQuantizingItAlone) {
  const uint64_t seed = test_seed();
  const std::vector<int64_t> offsets{0, 5, 5, 21, 22, 40};  // includes an empty group
  auto v = random_values(40 * 32, seed);
  for (Scaling s : {Scaling::kPerGroup, Scaling::kPerRow}) {
    QTensor g = quantize_grouped(mat(v, 40, 32), offsets, spec_of(Format::kNvfp4, s));
    for (size_t k = 0; k + 1 < offsets.size(); ++k) {
      const int64_t r0 = offsets[k], r1 = offsets[k + 1];
      std::vector<float> part(v.begin() + r0 * 32, v.begin() + r1 * 32);
      QTensor alone =
          quant(mat(part, r1 - r0, 32),
                spec_of(Format::kNvfp4, s == Scaling::kPerGroup ? Scaling::kPerTensor : s));
      const CopyBytes al = rowwise(alone), gb = rowwise(g);
      EXPECT_TRUE(std::equal(al.data.begin(), al.data.end(), gb.data.begin() + r0 * 16))
          << "group " << k << " seed " << seed;
      EXPECT_TRUE(std::equal(al.block_scale.begin(), al.block_scale.end(),
                             gb.block_scale.begin() + r0 * 2));
      if (s == Scaling::kPerGroup) {
        EXPECT_EQ(num::f32_bits(rowwise(alone).amax[0]), num::f32_bits(rowwise(g).amax[k]));
      }
    }
  }
}

TEST(Grouped, PaddingRowsStayZero) {
  const uint64_t seed = test_seed();
  const std::vector<int64_t> offsets{0, 3, 3, 20};
  auto v = random_values(20 * 16, seed);
  PaddedGroups p = pad_groups(v, 16, offsets, 16);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 16, 16, 48}));
  QTensor q = quantize_grouped(mat(p.values, 48, 16), p.offsets,
                               spec_of(Format::kNvfp4, Scaling::kPerGroup));
  for (int64_t r : {3, 10, 15, 37, 47}) {
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(rowwise(q).data[size_t(r * 8 + c)], 0) << r;
    EXPECT_EQ(rowwise(q).block_scale[size_t(r)], 0) << r;
  }
  EXPECT_EQ(rowwise(q).amax[1], 0.0f);  // empty group
}

TEST(Grouped, RejectsBadOffsets) {
  std::vector<float> v(4 * 16, 1.0f);
  auto s = spec_of(Format::kNvfp4, Scaling::kPerGroup);
  EXPECT_THROW(quantize_grouped(mat(v, 4, 16), std::vector<int64_t>{0, 3}, s), QuantError);
  EXPECT_THROW(quantize_grouped(mat(v, 4, 16), std::vector<int64_t>{1, 4}, s), QuantError);
  EXPECT_THROW(quantize_grouped(mat(v, 4, 16), std::vector<int64_t>{0, 3, 2, 4}, s), QuantError);
  EXPECT_THROW(quant(mat(v, 4, 16), s), QuantError);
}

// ---- MXFP8 and FP8 ------------------------------------------------------------------------------

TEST(Mxfp8, ColumnwiseEqualsRowwiseOfTheTranspose) {
  const uint64_t seed = test_seed();
  auto v = random_values(64 * 96, seed, 100.0f);
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 96; ++c) t[size_t(c * 64 + r)] = v[size_t(r * 96 + c)];
  QuantConfig s = spec_of(Format::kMxfp8, Scaling::kBlock1x32);
  s.colwise = true;
  QTensor q = quant(mat(v, 64, 96), s);
  QTensor qt = quant(mat(t, 96, 64), spec_of(Format::kMxfp8, Scaling::kBlock1x32));
  const CopyBytes qc = colwise(q), qtr = rowwise(qt);
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 96; ++c) {
      ASSERT_EQ(qc.data[size_t(r * 96 + c)], qtr.data[size_t(c * 64 + r)]) << "seed " << seed;
      ASSERT_EQ(qc.block_scale[size_t(r / 32 * 96 + c)], qtr.block_scale[size_t(c * 2 + r / 32)]);
    }
}

TEST(Mxfp8, BlockExponentAndElements) {
  std::vector<float> x(32, 0.0f);
  x[0] = 448.0f;  // b * RN(1/448) just below or at 1 -> e = 127
  x[1] = 1.0f;
  QTensor q = quant(mat(x, 1, 32), spec_of(Format::kMxfp8, Scaling::kBlock1x32));
  volatile float t = 448.0f * (1.0f / 448.0f);
  EXPECT_EQ(rowwise(q).block_scale[0], num::encode_e8m0(t));
  std::vector<float> back = dequant(q);
  EXPECT_EQ(back[1], 1.0f);
}

TEST(Fp8, ScaleRuleAndFallbacks) {
  EXPECT_EQ(num::fp8_scale(2.0f, 448.0f, 0.0f, num::kFltMax, false), 224.0f);
  EXPECT_EQ(num::fp8_scale(0.0f, 448.0f, 0.0f, num::kFltMax, false), 1.0f);
  EXPECT_EQ(
      num::fp8_scale(std::numeric_limits<float>::infinity(), 448.0f, 0.0f, num::kFltMax, false),
      1.0f);
  EXPECT_EQ(
      num::fp8_scale(std::numeric_limits<float>::quiet_NaN(), 448.0f, 0.0f, num::kFltMax, false),
      1.0f);
  EXPECT_EQ(num::fp8_scale(1e-39f, 448.0f, 0.0f, num::kFltMax, false), num::kFltMax);
  EXPECT_EQ(num::fp8_scale(1e-39f, 448.0f, 0.0f, num::kBf16Max, false), num::kBf16Max);
  EXPECT_EQ(num::f32_bits(num::kBf16Max), 0x7F7F0000u);
  EXPECT_EQ(num::fp8_scale(3.0f, 448.0f, 0.0f, num::kFltMax, true), 128.0f);    // 149.33 -> 128
  EXPECT_EQ(num::fp8_scale(1e-6f, 448.0f, 1.0f, num::kFltMax, false), 448.0f);  // eps floor
}

TEST(Fp8, BlocksMatchPerTensorOfEachBlock) {
  const uint64_t seed = test_seed();
  const int64_t rows = 200, cols = 300;  // ragged: partial last blocks
  auto v = random_values(rows * cols, seed);
  QTensor q = quant(mat(v, rows, cols), spec_of(Format::kFp8, Scaling::kBlock128x128));
  ASSERT_EQ(q.rowwise.scale_rows, 2);
  ASSERT_EQ(q.rowwise.scale_cols, 3);
  for (int64_t bi = 0; bi < 2; ++bi)
    for (int64_t bj = 0; bj < 3; ++bj) {
      const int64_t r0 = bi * 128, r1 = std::min<int64_t>(rows, r0 + 128), c0 = bj * 128,
                    c1 = std::min<int64_t>(cols, c0 + 128);
      std::vector<float> tile;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) tile.push_back(v[size_t(r * cols + c)]);
      QTensor t = quant(mat(tile, r1 - r0, c1 - c0), spec_of(Format::kFp8, Scaling::kPerTensor));
      EXPECT_EQ(rowwise(t).scale_inv[0], rowwise(q).scale_inv[size_t(bi * 3 + bj)]);
      size_t k = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          ASSERT_EQ(rowwise(t).data[k++], rowwise(q).data[size_t(r * cols + c)]) << "seed " << seed;
    }
}

// ---- properties over every format ---------------------------------------------------------------

TEST(AllFormats, BytesDoNotDependOnThreadCount) {
  const uint64_t seed = test_seed();
  auto v = random_values(256 * 256, seed);
  const int saved = omp_get_max_threads();
  for (const QuantConfig& s : all_specs()) {
    omp_set_num_threads(1);
    QTensor one = quant(mat(v, 256, 256), s);
    for (int t : {2, 3, 8}) {
      omp_set_num_threads(t);
      QTensor many = quant(mat(v, 256, 256), s);
      EXPECT_TRUE(same_bytes(one, many)) << format_name(s.format) << " " << scaling_name(s.scaling)
                                         << " threads " << t << " seed " << seed;
    }
  }
  omp_set_num_threads(saved);
}

TEST(AllFormats, DequantizeErrorIsBoundedByTheFormat) {
  const uint64_t seed = test_seed();
  auto v = random_values(128 * 256, seed);
  for (const QuantConfig& s : all_specs()) {
    if (s.stochastic) continue;
    QTensor q = quant(mat(v, 128, 256), s);
    ErrorMetrics m = error_metrics(v, dequant(q));
    // Relative rounding error of one element is at most 2^-(m+1) of its block's scale range:
    // E2M1 (m = 1) gives rel-L2 well under 0.25; E4M3 (m = 3) under 0.0625.
    double bound = s.format == Format::kNvfp4 ? 0.25 : 0.0625;
    ASSERT_TRUE(m.rel_l2.has_value());
    EXPECT_LT(*m.rel_l2, bound) << format_name(s.format) << " " << scaling_name(s.scaling)
                                << " seed " << seed;
  }
}

TEST(AllFormats, ShapeRulesAreErrorsNamingTheTensor) {
  std::vector<float> v(24 * 40, 1.0f);
  try {
    quant(mat(v, 24, 40), spec_of(Format::kNvfp4, Scaling::kPerTensor));
    FAIL() << "cols % 16 accepted";
  } catch (const QuantError& e) {
    EXPECT_NE(std::string(e.what()).find("cols % 16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
  }
  std::vector<float> w(24 * 32, 1.0f);
  QuantConfig b2 = spec_of(Format::kNvfp4, Scaling::kPerTensor);
  b2.block2d = true;
  EXPECT_THROW(quant(mat(w, 24, 32), b2), QuantError);  // rows % 16
  EXPECT_THROW(quant(mat(v, 24, 40), spec_of(Format::kMxfp8, Scaling::kBlock1x32)), QuantError);
  QuantConfig col = spec_of(Format::kMxfp8, Scaling::kBlock1x32);
  col.colwise = true;
  EXPECT_THROW(quant(mat(w, 24, 32), col), QuantError);  // rows % 32
  EXPECT_THROW(quant(mat(w, 24, 32), spec_of(Format::kMxfp8, Scaling::kPerRow)), QuantError);
  EXPECT_THROW(quant(mat(w, 24, 32), spec_of(Format::kFp8, Scaling::kBlock1x32)), QuantError);
  QuantConfig b2row = spec_of(Format::kNvfp4, Scaling::kPerRow);
  b2row.block2d = true;
  EXPECT_THROW(quant(mat(w, 32, 24 * 32 / 32), b2row), QuantError);
}

TEST(AllFormats, EmptyTensors) {
  std::vector<float> none;
  for (const QuantConfig& s : all_specs()) {
    QTensor q = quant(mat(none, 0, 32 * 4), s);
    EXPECT_TRUE(rowwise(q).data.empty());
    EXPECT_TRUE(dequant(q).empty());
  }
}

// ---- stochastic rounding, Hadamard, layouts, simulation, metrics --------------------------------

TEST(Stochastic, DependsOnSeedAndStreamOnly) {
  auto v = random_values(16 * 64, 7);
  QuantConfig s = spec_of(Format::kNvfp4, Scaling::kPerRow);
  s.stochastic = true;
  s.seed = 5;
  QTensor a = quant(mat(v, 16, 64), s), b = quant(mat(v, 16, 64), s);
  EXPECT_TRUE(same_bytes(a, b));
  s.rng_stream = 1;
  QTensor c = quant(mat(v, 16, 64), s);
  EXPECT_NE(rowwise(a).data, rowwise(c).data);
  EXPECT_EQ(rowwise(a).block_scale, rowwise(c).block_scale);  // scales are never stochastic
}

TEST(Hadamard, UnitVectorsGiveSignedRowsOfH16) {
  // H16 built by Sylvester doubling, [[H, H], [H, -H]], independently of the library's parity rule.
  int h[16][16];
  h[0][0] = 1;
  for (int n = 1; n < 16; n *= 2)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        h[i][j + n] = h[i][j];
        h[i + n][j] = h[i][j];
        h[i + n][j + n] = -h[i][j];
      }
  const int signs[16] = {1,  1,  1,  -1, 1,  -1, -1, -1,
                         -1, -1, -1, 1,  -1, 1,  -1, -1};  // bits of 0xD7E8
  for (int k = 0; k < 16; ++k) {
    std::vector<float> x(16, 0.0f);
    x[size_t(k)] = 1.0f;
    std::vector<float> y = hadamard(mat(x, 1, 16));
    for (int j = 0; j < 16; ++j)
      EXPECT_EQ(y[size_t(j)], float(signs[k] * h[k][j]) * 0.25f) << k << "," << j;
  }
}

TEST(Hadamard, PreservesEnergyAndRoundsToBf16) {
  auto v = random_values(4 * 64, 3);
  std::vector<float> y = hadamard(mat(v, 4, 64));
  double ex = 0, ey = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    ex += double(v[i]) * v[i];
    ey += double(y[i]) * y[i];
    EXPECT_EQ(num::f32_bits(y[i]) & 0xFFFFu, 0u) << "not a bf16 value";
  }
  EXPECT_NEAR(ey / ex, 1.0, 2 * 0x1p-8);  // bf16 rounding: relative error < 2^-8 per element
}

TEST(Layout, SwizzleFormulaAndRoundTrip) {
  EXPECT_EQ(swizzled_offset(0, 0, 4), 0);
  EXPECT_EQ(swizzled_offset(0, 1, 4), 1);
  EXPECT_EQ(swizzled_offset(1, 0, 4), 16);
  EXPECT_EQ(swizzled_offset(32, 0, 4), 4);
  EXPECT_EQ(swizzled_offset(0, 4, 8), 512);
  EXPECT_EQ(swizzled_offset(128, 0, 8), 1024);
  const int64_t rows = 130, cols = 7;
  std::vector<uint8_t> c(size_t(rows * cols));
  for (size_t i = 0; i < c.size(); ++i) c[i] = uint8_t(1 + i % 250);
  auto s = swizzle_scales(c, rows, cols);
  EXPECT_EQ(s.size(), size_t(256 * 8));
  EXPECT_EQ(unswizzle_scales(s, rows, cols), c);
  size_t zeros = 0;
  for (uint8_t b : s) zeros += b == 0;
  EXPECT_EQ(zeros, s.size() - c.size());  // padding bytes are zero
}

TEST(Layout, SharedScaleViewAndDomains) {
  // scale_access.h: one definition for the CPU reference and the CUDA kernels.
  std::vector<uint8_t> buf(size_t(256 * 8), 0);
  const ScaleView sw = scale_view(buf.data(), 7, /*swizzled=*/true),
                  cp = scale_view(buf.data(), 7, false);
  EXPECT_EQ(sw.padded_cols, 8);
  EXPECT_EQ(sw.offset(129, 5), swizzled_offset(129, 5, 8));
  EXPECT_EQ(cp.offset(3, 2), 3 * 7 + 2);
  sw.store(129, 5, 42);
  EXPECT_EQ(sw.load(129, 5), 42);
  // Group of a row: empty groups are skipped (offsets 0, 0, 5, 5, 9: groups 1 and 3 hold rows).
  const int64_t off[] = {0, 0, 5, 5, 9};
  EXPECT_EQ(group_of_row(off, 4, 0), 1);
  EXPECT_EQ(group_of_row(off, 4, 4), 1);
  EXPECT_EQ(group_of_row(off, 4, 5), 3);
  EXPECT_EQ(group_of_row(off, 4, 8), 3);
  EXPECT_EQ(rowwise_domain(Scaling::kPerRow, off, 4, 6), 6);
  EXPECT_EQ(rowwise_domain(Scaling::kPerGroup, off, 4, 6), 3);
  EXPECT_EQ(rowwise_domain(Scaling::kPerTensor, off, 4, 6), 0);
}

TEST(Layout, SwizzledQuantizeEqualsSwizzleOfCompact) {
  auto v = random_values(200 * 80, 11);
  QuantConfig s = spec_of(Format::kNvfp4, Scaling::kPerRow);
  QTensor compact = quant(mat(v, 200, 80), s);
  s.scale_layout = ScaleLayout::kSwizzled;
  QTensor sw = quant(mat(v, 200, 80), s);
  EXPECT_EQ(rowwise(sw).data, rowwise(compact).data);
  EXPECT_EQ(rowwise(sw).block_scale, swizzle_scales(rowwise(compact).block_scale, 200, 5));
  EXPECT_EQ(dequant(sw), dequant(compact));
}

TEST(Simulate, E2M1WithE4M3ScaleReproducesNvfp4) {
  const uint64_t seed = test_seed();
  auto v = random_values(32 * 64, seed);
  for (Scaling s : {Scaling::kPerTensor, Scaling::kPerRow}) {
    QTensor q = quant(mat(v, 32, 64), spec_of(Format::kNvfp4, s));
    SimQuantized sim = simulate_quantize(mat(v, 32, 64), SimFormat{2, 1, ScaleKind::kE4M3}, s, "x");
    EXPECT_EQ(sim.block_scale, rowwise(q).block_scale) << "seed " << seed;
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t c = 0; c < 64; ++c)
        ASSERT_EQ(sim.codes[size_t(r * 64 + c)], nibble(q, r, c)) << "seed " << seed;
    EXPECT_EQ(sim.values, dequant(q));
  }
}

TEST(Simulate, MoreMantissaBitsMeanLessError) {
  auto v = generate_activation_like(64, 256, 0);
  auto rows = sweep(mat(v, 64, 256));
  ASSERT_EQ(rows.size(), 14u);
  // E2M1 < E2M2 < E2M3 < E2M4 in SNR with E4M3 scales
  for (int i = 0; i + 2 < 8; i += 2)
    EXPECT_LT(*rows[size_t(i)].metrics.snr_db, *rows[size_t(i + 2)].metrics.snr_db);
}

TEST(Metrics, KnownValuesAndUndefinedCase) {
  std::vector<float> x{3, 4}, h{3, 5};
  ErrorMetrics m = error_metrics(x, h);
  EXPECT_DOUBLE_EQ(*m.rel_l2, 0.2);
  EXPECT_NEAR(*m.snr_db, 20 * std::log10(5.0), 1e-12);
  EXPECT_DOUBLE_EQ(m.mae, 0.5);
  EXPECT_DOUBLE_EQ(m.max_abs, 1.0);
  std::vector<float> z{0, 0};
  ErrorMetrics u = error_metrics(z, h);
  EXPECT_FALSE(u.rel_l2.has_value());
  EXPECT_FALSE(u.snr_db.has_value());
}
