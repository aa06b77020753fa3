// Values near FLT_MAX: MXFP8 (and FP8 with power-of-two scales) maps a finite input to a code
// whose exact value is 2^128, +Inf in fp32 (docs/contract-notes.md); NVFP4 and FP8 with fp32
// scales do not. Error metrics and the sweep report such reconstructions as overflow.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "lockstep/numerics/hd.h"
#include "lockstep/quant/metrics.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/quant/simulate.h"
#include "test_util.h"

namespace lockstep {
namespace {

constexpr float kFltMax = std::numeric_limits<float>::max();
const float kE4m3Edge = std::ldexp(248.0f, 120);  // ties to E4M3 256: 256 x 2^120 = 2^128
const float kE5m2Edge = std::ldexp(240.0f, 120);  // ties to E5M2 32768 under a 2^113 scale

std::vector<float> dq(const QTensor& q) { return test::floats(dequantize(q)); }

// One row of 32 copies of v (one MXFP8 block, a full FP8 row).
std::vector<float> row_of(float v) { return std::vector<float>(32, v); }

QTensor quantize_row(const std::vector<float>& v, Format f, Scaling s, ElemCodec elem, bool pow2) {
  QuantConfig spec;
  spec.format = f;
  spec.scaling = s;
  spec.elem = elem;
  spec.pow2 = pow2;
  return quantize(test::mat(v, 1, int64_t(v.size())), spec, "x");
}

TEST(NearFltMax, Mxfp8E4m3OverflowsFrom248Times2To120) {
  const QTensor at =
      quantize_row(row_of(kE4m3Edge), Format::kMxfp8, Scaling::kBlock1x32, ElemCodec::kE4M3, false);
  EXPECT_EQ(test::rowwise(at).block_scale[0], 127 + 120);  // E8M0 2^120, as TE
  EXPECT_EQ(test::rowwise(at).data[0], 0x78);  // E4M3 256 (the tie 248 goes to the even code)
  const std::vector<float> back = dq(at);
  EXPECT_TRUE(std::isinf(back[0]) && back[0] > 0) << back[0];

  const float below = std::nextafter(kE4m3Edge, 0.0f);
  const QTensor ok =
      quantize_row(row_of(below), Format::kMxfp8, Scaling::kBlock1x32, ElemCodec::kE4M3, false);
  EXPECT_EQ(test::rowwise(ok).data[0], 0x77);  // E4M3 240
  EXPECT_EQ(dq(ok)[0], std::ldexp(240.0f, 120));

  std::vector<float> neg = row_of(-kFltMax);
  const std::vector<float> back_neg =
      dq(quantize_row(neg, Format::kMxfp8, Scaling::kBlock1x32, ElemCodec::kE4M3, false));
  EXPECT_TRUE(std::isinf(back_neg[0]) && back_neg[0] < 0);
}

TEST(NearFltMax, E5m2ElementsOverflowFrom240Times2To120) {
  const QTensor at =
      quantize_row(row_of(kE5m2Edge), Format::kMxfp8, Scaling::kBlock1x32, ElemCodec::kE5M2, false);
  EXPECT_EQ(test::rowwise(at).block_scale[0], 127 + 113);
  EXPECT_EQ(test::rowwise(at).data[0], 0x78);  // E5M2 32768
  EXPECT_TRUE(std::isinf(dq(at)[0]));
  const float below = std::nextafter(kE5m2Edge, 0.0f);
  EXPECT_TRUE(std::isfinite(dq(quantize_row(row_of(below), Format::kMxfp8, Scaling::kBlock1x32,
                                            ElemCodec::kE5M2, false))[0]));
}

TEST(NearFltMax, Fp8PowerOfTwoScalesOverflowLikeMxfp8) {
  for (Scaling s :
       {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kBlock1x128, Scaling::kBlock128x128}) {
    const QTensor q = quantize_row(row_of(kE4m3Edge), Format::kFp8, s, ElemCodec::kE4M3, true);
    EXPECT_EQ(test::rowwise(q).scale_inv[0], std::ldexp(1.0f, 120)) << scaling_name(s);
    EXPECT_TRUE(std::isinf(dq(q)[0])) << scaling_name(s);
    const QTensor e5 = quantize_row(row_of(kE5m2Edge), Format::kFp8, s, ElemCodec::kE5M2, true);
    EXPECT_TRUE(std::isinf(dq(e5)[0])) << scaling_name(s);
  }
}

TEST(NearFltMax, Nvfp4AndFp8WithFp32ScalesStayFinite) {
  // Their scales are fp32 ratios of the amax, so the largest code maps back to about the amax.
  // Row r: an amax A_r from the top binade (the last 512 floats below FLT_MAX, then random ones),
  // then A_r times random fractions, so blocks with smaller amaxes round their codes up too.
  // Per-row and 1x128 domains see each A_r; per-tensor ones the largest.
  const char* env = std::getenv("LOCKSTEP_TEST_SEED");  // replays a printed seed
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> frac(0.5f, 1.0f);
  std::uniform_int_distribution<uint32_t> top(0x7F000000u, 0x7F7FFFFFu);
  constexpr int64_t kRows = 2048, kCols = 128;
  std::vector<float> v(size_t(kRows * kCols));
  for (int64_t r = 0; r < kRows; ++r) {
    const float a =
        r < 512 ? num::f32_from_bits(0x7F7FFFFFu - uint32_t(r)) : num::f32_from_bits(top(g));
    v[size_t(r * kCols)] = a;
    for (int64_t c = 1; c < kCols; ++c)
      v[size_t(r * kCols + c)] = (c % 2 ? -1.0f : 1.0f) * a * frac(g);
  }
  const Tensor m = test::mat(v, kRows, kCols);
  auto all_finite = [](const std::vector<float>& x) {
    return std::all_of(x.begin(), x.end(), [](float y) { return std::isfinite(y); });
  };
  for (Scaling s : {Scaling::kPerTensor, Scaling::kPerRow}) {
    QuantConfig spec;
    spec.format = Format::kNvfp4;
    spec.scaling = s;
    EXPECT_TRUE(all_finite(dq(quantize(m, spec))))
        << "seed " << seed << " nvfp4 " << scaling_name(s);
  }
  for (Scaling s : {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kBlock1x128})
    for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2}) {
      QuantConfig spec;
      spec.format = Format::kFp8;
      spec.scaling = s;
      spec.elem = e;
      EXPECT_TRUE(all_finite(dq(quantize(m, spec))))
          << "seed " << seed << " fp8 " << scaling_name(s);
    }
}

TEST(NearFltMax, ErrorMetricsReportOverflowNotANumber) {
  const std::vector<float> x = {1.0f, kFltMax, -kFltMax, 2.0f};
  const std::vector<float> xh = {1.0f, INFINITY, -INFINITY, 2.0f};
  const ErrorMetrics m = error_metrics(x, xh);
  EXPECT_EQ(m.overflow, 2);
  EXPECT_FALSE(m.rel_l2.has_value());
  EXPECT_FALSE(m.snr_db.has_value());  // not 20 log10(ref / inf) = -inf
  EXPECT_TRUE(std::isinf(m.mae));
  // An Inf input reconstructed as Inf is not an overflow of the format.
  const ErrorMetrics same =
      error_metrics(std::vector<float>{INFINITY}, std::vector<float>{INFINITY});
  EXPECT_EQ(same.overflow, 0);
  EXPECT_EQ(error_metrics(std::vector<float>{1.0f}, std::vector<float>{1.0f}).overflow, 0);
}

TEST(NearFltMax, SweepMarksOverflowingFormatsAndRows) {
  // Row 1 holds FLT_MAX: E8M0-scaled simulated formats round it up to 2^128 (e.g. E2M1: FLT_MAX / 6
  // rounds up to the scale 2^126, and FLT_MAX / 2^126 rounds to the code 4).
  std::vector<float> v(2 * 32, 0.5f);
  for (int c = 0; c < 32; ++c) v[size_t(32 + c)] = (c % 2 ? -1.0f : 1.0f) * kFltMax;
  const std::vector<SweepRow> rows = sweep(test::mat(v, 2, 32), Scaling::kPerTensor);
  int overflowing = 0;
  for (const SweepRow& r : rows) {
    if (r.format.scale == ScaleKind::kE8M0 && r.format.e_bits == 2 && r.format.m_bits == 1) {
      EXPECT_EQ(r.metrics.overflow, 32) << r.format.name();
    }
    if (r.metrics.overflow == 0) {
      EXPECT_TRUE(r.metrics.snr_db.has_value()) << r.format.name();
      continue;
    }
    ++overflowing;
    EXPECT_FALSE(r.metrics.snr_db.has_value()) << r.format.name();
    EXPECT_EQ(r.worst_row, 1) << r.format.name();
    EXPECT_TRUE(std::isinf(r.worst_row_rel_l2)) << r.format.name();
  }
  EXPECT_GT(overflowing, 0);
}

}  // namespace
}  // namespace lockstep
