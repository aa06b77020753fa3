// Scalar codecs, rounding rules, E8M0, bf16 and Philox (CONTRACT.md sections 0, 1, 5): exhaustive
// round trips and one named test per tie, subnormal, saturation and NaN rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/philox.h"

using namespace lockstep::num;

namespace {
float bits(uint32_t b) { return f32_from_bits(b); }
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST(E2M1, EveryCodeRoundTrips) {
  const float expect[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint32_t c = 0; c < 16; ++c) {
    float v = decode_e2m1(uint8_t(c));
    float mag = expect[c & 7];
    EXPECT_EQ(v, (c & 8) ? -mag : mag) << "code " << c;
    EXPECT_EQ(encode_e2m1(v), c) << "code " << c;
  }
}

TEST(E2M1, TiesGoToEvenCode) {
  EXPECT_EQ(encode_e2m1(0.25f), 0x0);  // 0 vs 0.5
  EXPECT_EQ(encode_e2m1(0.75f), 0x2);  // 0.5 vs 1.0 -> 1.0
  EXPECT_EQ(encode_e2m1(1.25f), 0x2);  // 1.0 vs 1.5 -> 1.0
  EXPECT_EQ(encode_e2m1(1.75f), 0x4);  // 1.5 vs 2 -> 2
  EXPECT_EQ(encode_e2m1(2.5f), 0x4);   // 2 vs 3 -> 2
  EXPECT_EQ(encode_e2m1(3.5f), 0x6);   // 3 vs 4 -> 4
  EXPECT_EQ(encode_e2m1(5.0f), 0x6);   // 4 vs 6 -> 4
  EXPECT_EQ(encode_e2m1(-2.5f), 0xC);
  EXPECT_EQ(encode_e2m1(-5.0f), 0xE);
}

TEST(E2M1, NearTiesRoundToNearest) {
  EXPECT_EQ(encode_e2m1(std::nextafter(0.25f, 1.0f)), 0x1);
  EXPECT_EQ(encode_e2m1(std::nextafter(0.75f, 0.0f)), 0x1);
  EXPECT_EQ(encode_e2m1(std::nextafter(5.0f, 9.0f)), 0x7);
  EXPECT_EQ(encode_e2m1(std::nextafter(2.5f, 9.0f)), 0x5);
}

TEST(E2M1, SaturatesAndKeepsZeroSign) {
  EXPECT_EQ(encode_e2m1(6.5f), 0x7);
  EXPECT_EQ(encode_e2m1(1e30f), 0x7);
  EXPECT_EQ(encode_e2m1(kInf), 0x7);
  EXPECT_EQ(encode_e2m1(-kInf), 0xF);
  EXPECT_EQ(encode_e2m1(-0.0f), 0x8);
  EXPECT_EQ(encode_e2m1(0.0f), 0x0);
  EXPECT_EQ(encode_e2m1(bits(0x00000001)), 0x0);  // fp32 subnormal
  EXPECT_EQ(encode_e2m1(bits(0x80000001)), 0x8);
}

TEST(E2M1, NaNEncodesAsPositiveMax) {
  EXPECT_EQ(encode_e2m1(kNaN), 0x7);
  EXPECT_EQ(encode_e2m1(-kNaN), 0x7);
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    float v = decode_e4m3(uint8_t(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(encode_e4m3(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode_e4m3(0x08), std::ldexp(1.0f, -6));
}

TEST(E4M3, TiesGoToEvenCode) {
  // 1.0 (0x38) and 1.125 (0x39): 1.0625 -> 0x38; 1.125 and 1.25: 1.1875 -> 0x3A
  EXPECT_EQ(encode_e4m3(1.0625f), 0x38);
  EXPECT_EQ(encode_e4m3(1.1875f), 0x3A);
  // subnormal ties: 2^-10 between 0 and 2^-9 -> 0; 3 * 2^-10 between codes 1 and 2 -> 2
  EXPECT_EQ(encode_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(encode_e4m3(std::ldexp(3.0f, -10)), 0x02);
  EXPECT_EQ(encode_e4m3(std::ldexp(5.0f, -10)), 0x02);
  // tie between the largest subnormal (7 * 2^-9) and the smallest normal (2^-6)
  EXPECT_EQ(encode_e4m3(std::ldexp(15.0f, -10)), 0x08);
  EXPECT_EQ(encode_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
}

TEST(E4M3, SaturatesInsteadOfNaN) {
  EXPECT_EQ(encode_e4m3(464.0f), 0x7E);  // RNE would give 480, which does not exist
  EXPECT_EQ(encode_e4m3(1e10f), 0x7E);
  EXPECT_EQ(encode_e4m3(kInf), 0x7E);
  EXPECT_EQ(encode_e4m3(-kInf), 0xFE);
  EXPECT_EQ(encode_e4m3(kNaN), 0x7F);
  EXPECT_EQ(encode_e4m3(-0.0f), 0x80);
  EXPECT_EQ(encode_e4m3(bits(0x00000001)), 0x00);
}

TEST(E5M2, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    float v = decode_e5m2(uint8_t(c));
    uint32_t mag = c & 0x7F;
    if (mag == 0x7C) {
      EXPECT_TRUE(std::isinf(v)) << c;
      continue;
    }
    if (mag > 0x7C) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(encode_e5m2(v), c) << "code " << c;
  }
  EXPECT_EQ(decode_e5m2(0x7B), 57344.0f);
  EXPECT_EQ(decode_e5m2(0x01), std::ldexp(1.0f, -16));
}

TEST(E5M2, SaturatesAndNaN) {
  EXPECT_EQ(encode_e5m2(kInf), 0x7B);
  EXPECT_EQ(encode_e5m2(-kInf), 0xFB);
  EXPECT_EQ(encode_e5m2(61440.0f), 0x7B);  // tie with the nonexistent 65536
  EXPECT_EQ(encode_e5m2(kNaN), 0x7F);
  EXPECT_EQ(encode_e5m2(std::ldexp(1.0f, -17)), 0x00);  // tie with 0
  EXPECT_EQ(encode_e5m2(std::ldexp(3.0f, -17)), 0x02);
}

TEST(E8M0, RoundsUpOnTheExponentAndSaturates) {
  EXPECT_EQ(encode_e8m0(0.0f), 0x00);
  EXPECT_EQ(encode_e8m0(std::ldexp(1.0f, -127)), 0x00);
  EXPECT_EQ(encode_e8m0(std::nextafter(std::ldexp(1.0f, -127), 1.0f)), 0x01);
  EXPECT_EQ(encode_e8m0(std::ldexp(1.0f, -126)), 0x01);
  EXPECT_EQ(encode_e8m0(std::nextafter(std::ldexp(1.0f, -126), 1.0f)), 0x02);
  EXPECT_EQ(encode_e8m0(1.0f), 127);
  EXPECT_EQ(encode_e8m0(1.5f), 128);
  EXPECT_EQ(encode_e8m0(std::nextafter(2.0f, 0.0f)), 128);
  EXPECT_EQ(encode_e8m0(std::ldexp(1.0f, 127)), 0xFE);
  EXPECT_EQ(encode_e8m0(std::nextafter(std::ldexp(1.0f, 127), kInf)), 0xFE);
  EXPECT_EQ(encode_e8m0(kInf), 0xFE);
  EXPECT_EQ(encode_e8m0(kNaN), 0xFF);
}

TEST(E8M0, DecodeIsExact) {
  EXPECT_EQ(f32_bits(decode_e8m0(0)), 0x00400000u);  // 2^-127, an fp32 subnormal
  EXPECT_EQ(decode_e8m0(127), 1.0f);
  EXPECT_EQ(decode_e8m0(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(decode_e8m0(0xFF)));
  for (int e = 0; e < 255; ++e) EXPECT_EQ(encode_e8m0(decode_e8m0(uint8_t(e))), e);
}

TEST(MxScale, EncodeFactorIsTheExactInverse) {
  EXPECT_EQ(mx_encode_factor(127), 1.0f);
  EXPECT_EQ(mx_encode_factor(0), std::ldexp(1.0f, 127));
  EXPECT_EQ(f32_bits(mx_encode_factor(254)), 0x00400000u);
  EXPECT_TRUE(std::isnan(mx_encode_factor(255)));
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(bits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(bits(0x3F808001)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(kInf), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(kNaN))));
  EXPECT_EQ(f32_to_bf16(bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds to inf
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float v = bf16_to_f32(uint16_t(h));
    if (!std::isnan(v)) {
      EXPECT_EQ(f32_to_bf16(v), h);
    }
  }
}

TEST(F16, WidensExactly) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_TRUE(std::isinf(f16_to_f32(0xFC00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
}

TEST(F16, NarrowsWithRoundToNearestEven) {
  // Every half round-trips; every midpoint between neighbours goes to the even one, and one fp32
  // ulp either side of it to the nearer one.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float v = f16_to_f32(uint16_t(h));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(v)))) << std::hex << h;
      EXPECT_EQ(f32_to_f16(v) & 0x8000u, h & 0x8000u) << std::hex << h;
      continue;
    }
    EXPECT_EQ(f32_to_f16(v), h) << std::hex << h;
    if ((h & 0x7FFFu) >= 0x7BFFu) continue;  // the next one up is inf
    const float next = f16_to_f32(uint16_t(h + 1));
    const float mid = (v + next) / 2;  // exact: halves have 11 significant bits
    const uint16_t even = (h & 1u) ? uint16_t(h + 1) : uint16_t(h);
    EXPECT_EQ(f32_to_f16(mid), even) << std::hex << h;
    EXPECT_EQ(f32_to_f16(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    EXPECT_EQ(f32_to_f16(std::nextafter(mid, std::copysign(kInf, v))), uint16_t(h + 1))
        << std::hex << h;
  }
  // Overflow is IEEE (inf), not saturating: 65520 is 65504 plus half an ulp, a tie to the even inf.
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-3.4028235e38f), 0xFC00);
  EXPECT_EQ(f32_to_f16(kInf), 0x7C00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  // Below half the smallest subnormal (2^-25, itself a tie to the even 0) everything is zero.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(f32_to_f16(bits(0x00000001)), 0x0000);
}

#if defined(__FLT16_MAX__)
// The compiler's own conversion (_Float16, IEEE RNE) as an independent oracle over a dense sample
// of fp32 bit patterns: every 4099th pattern (all exponents, many mantissas).
TEST(F16, MatchesTheCompilersFloat16Conversion) {
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4099) {
    const float v = bits(uint32_t(b));
    const _Float16 ref = static_cast<_Float16>(v);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(v))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(v), ref_bits) << "fp32 bits 0x" << std::hex << b;
  }
}
#endif

TEST(ExMy, EveryFormatRoundTripsAndMatchesNamedCodecs) {
  for (int e = 1; e <= 5; ++e)
    for (int m = 0; m + e <= 7; ++m) {
      MiniFloat f = exmy_format(e, m);
      for (uint32_t c = 0; c < (2u << (e + m)); ++c) {
        float v = decode_minifloat(f, c);
        ASSERT_EQ(encode_minifloat(f, v), c) << "E" << e << "M" << m << " code " << c;
      }
      // saturation to the largest code
      EXPECT_EQ(encode_minifloat(f, 1e30f), f.max_code);
    }
  MiniFloat e2m1 = exmy_format(2, 1);
  for (uint32_t b = 0; b < 0x7F800000u; b += 0x1357u) {
    float v = bits(b);
    ASSERT_EQ(encode_minifloat(e2m1, v), encode_e2m1(v)) << v;
    ASSERT_EQ(encode_minifloat(e2m1, -v), encode_e2m1(-v)) << v;
  }
  EXPECT_EQ(minifloat_max(exmy_format(4, 1)), 384.0f);
  EXPECT_EQ(minifloat_max(exmy_format(5, 1)), 98304.0f);
  EXPECT_EQ(minifloat_max(exmy_format(2, 3)), 7.5f);
}

TEST(Amax, FollowsFmaxSemantics) {
  float acc = amax_empty();
  EXPECT_TRUE(std::isnan(acc));
  acc = amax_fold(acc, kNaN);
  EXPECT_TRUE(std::isnan(acc));  // only NaN so far: NaN
  acc = amax_fold(acc, -3.0f);
  EXPECT_EQ(acc, 3.0f);
  acc = amax_fold(acc, kNaN);
  EXPECT_EQ(acc, 3.0f);  // NaN ignored
  acc = amax_fold(acc, -kInf);
  EXPECT_TRUE(std::isinf(acc));
}

TEST(Philox, MatchesPublishedKnownAnswers) {
  // Known-answer vectors of Philox4x32-10 (Random123's kat_vectors).
  Philox4x32 a = philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  Philox4x32 b = philox4x32_10({{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  EXPECT_EQ(b.v[0], 0x408f276du);
  EXPECT_EQ(b.v[3], 0x6d5451fdu);
  Philox4x32 c = philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                               0x299f31d0u);
  EXPECT_EQ(c.v[0], 0xd16cfe09u);
  EXPECT_EQ(c.v[1], 0x94fdccebu);
  EXPECT_EQ(c.v[2], 0x5001e420u);
  EXPECT_EQ(c.v[3], 0x24126ea1u);
}

TEST(Philox, ElementWordIsWordIMod4OfTheCallForIDiv4) {
  // Contract 1.1 section 5: key = (seed low, seed high), counter = (i/4 low, i/4 high, stream, 0),
  // element i takes output word i % 4.
  const uint64_t seed = 0x0123456789ABCDEFull;
  const uint64_t index = 0x00000005FFFFFFFEull;  // i / 4 = 0x17FFFFFFF, i % 4 = 2
  Philox4x32 r = philox4x32_10({{0x7FFFFFFFu, 0x1u, 7u, 0u}}, 0x89ABCDEFu, 0x01234567u);
  EXPECT_EQ(philox_element_word(seed, 7, index), r.v[2]);
  // The published known answer for counter 0, key 0 gives elements 0..3 of seed 0, stream 0.
  const uint32_t kat[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(philox_element_word(0, 0, i), kat[i]) << i;
  // Elements 4..7 come from the next counter.
  const Philox4x32 next = philox4x32_10({{1u, 0u, 0u, 0u}}, 0u, 0u);
  for (uint64_t i = 4; i < 8; ++i) EXPECT_EQ(philox_element_word(0, 0, i), next.v[i - 4]) << i;
}

TEST(StochasticRounding, ExactValuesAndSaturationAreDeterministic) {
  for (uint32_t r : {0u, 0x80000000u, 0xFFFFFFFFu}) {
    EXPECT_EQ(encode_minifloat_stochastic(kE2M1, 1.5f, r), 0x3);
    EXPECT_EQ(encode_minifloat_stochastic(kE2M1, -0.0f, r), 0x8);
    EXPECT_EQ(encode_minifloat_stochastic(kE2M1, 7.0f, r), 0x7);
    EXPECT_EQ(encode_minifloat_stochastic(kE2M1, -kInf, r), 0xF);
    EXPECT_EQ(encode_minifloat_stochastic(kE2M1, kNaN, r), 0x7);
    EXPECT_EQ(encode_minifloat_stochastic(kE4M3, 500.0f, r), 0x7E);
  }
}

TEST(StochasticRounding, ThresholdIsTheContractsComparison) {
  // 2.25 lies a quarter of the way from 2 to 3: round up iff (r >> 8) * 2^-24 < 0.25.
  const uint32_t just_below = (uint32_t(0x400000) - 1) << 8;  // u = 0.25 - 2^-24
  const uint32_t at = uint32_t(0x400000) << 8;                // u = 0.25
  EXPECT_EQ(encode_minifloat_stochastic(kE2M1, 2.25f, just_below), 0x5);
  EXPECT_EQ(encode_minifloat_stochastic(kE2M1, 2.25f, at), 0x4);
  EXPECT_EQ(encode_minifloat_stochastic(kE2M1, -2.25f, just_below), 0xD);
  // the low 8 bits of r are not used
  EXPECT_EQ(encode_minifloat_stochastic(kE2M1, 2.25f, at | 0xFF), 0x4);
}

TEST(StochasticRounding, IsUnbiasedOverPhiloxWords) {
  // E[SR(v)] = v: over n draws the mean deviates by about sigma = (hi-lo) sqrt(p(1-p)/n).
  const float v = 0.3f;  // between 0 and 0.5, p(up) = 0.6
  const int n = 200000;
  double sum = 0;
  for (int i = 0; i < n; ++i)
    sum +=
        decode_e2m1(encode_minifloat_stochastic(kE2M1, v, philox_element_word(42, 3, uint64_t(i))));
  const double sigma = 0.5 * std::sqrt(0.6 * 0.4 / n);
  EXPECT_NEAR(sum / n, double(v), 5 * sigma);
}

#if defined(LOCKSTEP_HAVE_CUDA_HEADERS)
#include <cuda_fp4.h>
#include <cuda_fp8.h>

// CUDA's host-callable conversions are an implementation no one here wrote: compare on a dense
// sample of fp32 bit patterns (every 97th pattern plus all patterns near format boundaries).
TEST(CudaOracle, CodecsMatchCudaHostConversions) {
  int64_t checked = 0;
  auto check = [&](uint32_t b) {
    float v = bits(b);
    if (!std::isnan(v)) {
      ASSERT_EQ(encode_e4m3(v), uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)))
          << std::hex << b;
      ASSERT_EQ(encode_e5m2(v), uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2)))
          << std::hex << b;
      ASSERT_EQ(encode_e2m1(v), uint8_t(__nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest)))
          << std::hex << b;
    }
    if (!(b >> 31)) {
      ASSERT_EQ(encode_e8m0(v), uint8_t(__nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundPosInf)))
          << std::hex << b;
    }
    ++checked;
  };
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 97) check(uint32_t(b));
  for (uint32_t e = 0; e < 256; ++e)
    for (int d = -64; d <= 64; ++d) {
      check(uint32_t((e << 23) + uint32_t(d)));
      check(0x80000000u | uint32_t((e << 23) + uint32_t(d)));
    }
  EXPECT_GT(checked, 40000000);
}
#endif

// ---- fast encoders (CUDA kernels) and the portable exp ----------------------------------------
#include "lockstep/numerics/fast_codecs.h"
#include "lockstep/numerics/transcendental.h"

TEST(FastCodecs, E2M1FastEqualsReferenceOnDenseSample) {
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 61) {
    const float v = bits(uint32_t(b));
    ASSERT_EQ(encode_e2m1_fast(v), encode_e2m1(v)) << std::hex << b;
  }
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f})
    for (float v : {t, std::nextafter(t, 0.0f), std::nextafter(t, 10.0f), -t})
      EXPECT_EQ(encode_e2m1_fast(v), encode_e2m1(v)) << v;
  EXPECT_EQ(encode_e2m1x2_fast(1.0f, -6.0f), 0xF2);
}

TEST(PortableExp, IsCloseToExpAndHandlesEdges) {
  for (float x = -100.0f; x < 88.0f; x += 0.01234f) {
    const double want = std::exp(double(x));
    const float got = exp_f32(x);
    if (want < 1.17549435e-38) continue;  // subnormal results: checked only to be finite below
    EXPECT_NEAR(double(got), want, want * 4e-7) << x;  // ~3 ulp
  }
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isinf(exp_f32(kInf)));
  EXPECT_EQ(exp_f32(-kInf), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(kNaN)));
  EXPECT_TRUE(std::isinf(exp_f32(89.0f)));
  EXPECT_GE(exp_f32(-103.0f), 0.0f);
  EXPECT_EQ(silu_f32(0.0f), 0.0f);
  EXPECT_NEAR(silu_f32(1.0f), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

// encode_e2m1_arith (the kernels' branch-free E2M1 encoder) against the reference: a dense stride
// over all 2^32 bit patterns (every sign, exponent and NaN class), then every pattern within 4096
// ulps of each decision boundary, code value, power of two in [2^-3, 2^4], 0, inf and NaN edges.
// (The GPU harness, `lockstep_test_backend --op codec`, checks all 2^32 inputs exhaustively.)
TEST(FastCodecs, E2M1ArithEqualsReference) {
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 37) {
    const float v = bits(uint32_t(b));
    ASSERT_EQ(encode_e2m1_arith(v), encode_e2m1(v)) << std::hex << b;
  }
  std::vector<float> centers = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f,   2.5f,
                                3.0f, 3.5f,  4.0f, 5.0f,  6.0f, 7.0f,  8.0f, 16.0f, 0.125f, kInf};
  for (float c : centers) {
    const uint32_t cb = f32_bits(c);
    for (int64_t d = -4096; d <= 4096; ++d) {
      const int64_t m = int64_t(cb) + d;
      if (m < 0 || m > 0x7FFFFFFF) continue;
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float v = bits(uint32_t(m) | sign);
        ASSERT_EQ(encode_e2m1_arith(v), encode_e2m1(v)) << std::hex << (uint32_t(m) | sign);
      }
    }
  }
  for (uint32_t b :
       {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x00000001u, 0x80000001u, 0x7F7FFFFFu})
    EXPECT_EQ(encode_e2m1_arith(bits(b)), encode_e2m1(bits(b))) << std::hex << b;
  EXPECT_EQ(encode_e2m1_arith(bits(0xFFC00000u)), 0x7u);  // NaN: 0x7 whatever the sign
}
