// Fast element encoders for the CUDA kernels, equal code for code to the reference encoders of
// codecs.h (RNE, satfinite, NaN codes of CONTRACT.md section 1). The reference encoder costs
// ~50 integer instructions per element, which would make a quantizer ALU-bound on an H200; these
// cost a handful. Equality with codecs.h is checked exhaustively over all 2^32 fp32 inputs by
// `lockstep_test_backend --op codec` (on the GPU) and by the host fallbacks below being the
// reference.
#pragma once

#include <cstdint>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/hd.h"

namespace lockstep::num {

// E2M1, RNE with ties to the even code, saturating: the code is the number of decision boundaries
// at or below |v| (0.25 and 2.5 and 5 tie down to the even code, 0.75, 1.75 and 3.5 tie up).
LOCKSTEP_HD inline uint8_t encode_e2m1_fast(float v) {
  const uint32_t b = f32_bits(v);
  const float a = f32_from_bits(b & 0x7FFFFFFFu);
  if (is_nan(v)) return 0x7;
  uint32_t code = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) +
                  uint32_t(a >= 1.75f) + uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) +
                  uint32_t(a > 5.0f);
  return uint8_t(((b >> 31) << 3) | code);
}

// E2M1 by arithmetic on the fp32 bits, branch-free (about 12 instructions, no compare chain); the
// same code as encode_e2m1 for every fp32 input. |v| >= 1: integer RNE of the bit pattern to one
// mantissa bit (adding 0x1FFFFF plus the kept bit carries into the exponent exactly when RNE rounds
// up), so bits >> 22 is 254 for 1.0 .. 259 for 6.0, saturated at code 7 (inf and NaN give >= 7
// too). |v| < 1: |v| + 2^22 rounds |v| to a multiple of 0.5 with RNE (the fp32 ulp there is 0.5),
// and the low bits are the code 0..2. NaN gives 0x7 whatever its sign, as encode_e2m1.
LOCKSTEP_HD inline uint32_t encode_e2m1_arith(float v) {
  const uint32_t b = f32_bits(v);
  const uint32_t m = b & 0x7FFFFFFFu;
  const uint32_t big = (m + 0x1FFFFFu + ((m >> 22) & 1u)) >> 22;  // 254 (1.0) .. 259 (6.0) .. 512
  const uint32_t big_code = (big < 259u ? big : 259u) - 252u;
  const uint32_t small_code = f32_bits(add_rn(f32_from_bits(m), 4194304.0f)) - 0x4A800000u;
  const uint32_t code = m < 0x3F800000u ? small_code : big_code;
  const uint32_t sign = m <= 0x7F800000u ? (b >> 28) & 8u : 0u;
  return code | sign;
}

// One rounding of a * b + c (IEEE fma). Used only where CONTRACT.md asks for the fused value: the
// callers below feed it products that are exact (scaling by powers of two, small integers), so the
// single rounding is the contract's RN of an exact sum.
LOCKSTEP_HD inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The E2M1 magnitude code of v as 0x4B000000 + code (the bits of 2^23 + code): three fp32
// operations on the FMA pipe and an integer min,
//   code(t) = min(RNE(2t), RNE(t) + 2, RNE(t/2) + 4, 7),  t = |v|,
// the concave piecewise-linear E2M1 grid (step 0.5 below 2, 1 below 4, 2 up to 6, saturating at 6).
// Each term is one rounding of an exact value (the products by 2, 1, 1/2 are exact inside the fma)
// plus 2^23, where the fp32 step is 1: RN is RNE to an integer, and the even offsets 2 and 4 keep
// the tie parity (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4). A term past
// 2^24 only loses the min (the bits of a positive float grow with its value); +inf gives 7, NaN 7.
LOCKSTEP_HD inline uint32_t e2m1_code_magic(float v) {
#if defined(__CUDA_ARCH__)
  const float t = fabsf(v);  // an operand modifier of the fmas below, not an instruction
#else
  const float t = abs_f32(v);
#endif
  const uint32_t c1 = f32_bits(fma_rn(t, 2.0f, 0x1p23f));         // 2^23 + RNE(2t)
  const uint32_t c2 = f32_bits(add_rn(t, 0x1p23f + 2.0f));        // 2^23 + RNE(t) + 2
  const uint32_t c3 = f32_bits(fma_rn(t, 0.5f, 0x1p23f + 4.0f));  // 2^23 + RNE(t/2) + 4
  const uint32_t m = c1 < c2 ? c1 : c2, m3 = c3 < 0x4B000007u ? c3 : 0x4B000007u;
  return m < m3 ? m : m3;
}

// Stochastic rounding to E2M1 (CONTRACT.md section 5) of a non-NaN value v with the element's
// random word r, as 0x4B000001 + the magnitude code: eight FMA-pipe operations, an int-to-float
// conversion and three integer mins. With u = (r >> 8) 2^-24 and g the concave piecewise-linear map
// of e2m1_code_magic (g(|v|) = min(2t, t + 2, t/2 + 4), which is lo_code + frac on the bracket [lo,
// hi] of section 5), the section 5 code is ceil(g(t) - u) = min over the three lines of
// ceil(line(t) - u), saturated at 7 (u < frac rounds up; frac = 0 keeps lo). Each term is exact:
// D = RU(t 2^s - k) (s = 25, 24, 23 for the lines 2t, t, t/2; k = r >> 8) has the ceiling of the
// exact D / 2^24 because every multiple of 2^24 is a float, and RU(D 2^-24 + 2^23 + 1 + base) is
// then 2^23 + 1 + base + that ceiling (an integer of [2^23, 2^24), where the fp32 step is 1; the
// + 1 keeps a ceiling of 0 out of the finer binade below 2^23). Too large a t gives +inf or a value
// past 2^24, which the min drops; t >= 6 gives at least 7.
LOCKSTEP_HD inline uint32_t e2m1_sr_code_magic(float v, uint32_t r) {
#if defined(__CUDA_ARCH__)
  const float t = fabsf(v);
  const float k = float(r >> 8);  // exact: 24 bits
  const uint32_t c1 = f32_bits(__fmaf_ru(__fmaf_ru(t, 0x1p25f, -k), 0x1p-24f, 0x1p23f + 1.0f));
  const uint32_t c2 = f32_bits(__fmaf_ru(__fmaf_ru(t, 0x1p24f, -k), 0x1p-24f, 0x1p23f + 3.0f));
  const uint32_t c3 = f32_bits(__fmaf_ru(__fmaf_ru(t, 0x1p23f, -k), 0x1p-24f, 0x1p23f + 5.0f));
  const uint32_t m = c1 < c2 ? c1 : c2, m3 = c3 < 0x4B000008u ? c3 : 0x4B000008u;
  return m < m3 ? m : m3;
#else
  constexpr MiniFloat f = kE2M1;
  return 0x4B000001u + (encode_minifloat_stochastic(f, abs_f32(v), r) & 0x7u);
#endif
}

// encode_minifloat_stochastic(kE2M1, v, r) through e2m1_sr_code_magic (the kernels apply sign and
// NaN to 8 codes at a time instead).
LOCKSTEP_HD inline uint32_t encode_e2m1_sr_fma(float v, uint32_t r) {
  if (is_nan(v)) return 0x7u;
  return (e2m1_sr_code_magic(v, r) - 0x4B000001u) | ((f32_bits(v) >> 28) & 8u);
}

// encode_e2m1 through e2m1_code_magic (the kernels apply sign and NaN to 8 codes at a time
// instead).
LOCKSTEP_HD inline uint32_t encode_e2m1_fma(float v) {
  if (is_nan(v)) return 0x7u;
  return (e2m1_code_magic(v) - 0x4B000000u) | ((f32_bits(v) >> 28) & 8u);
}

// Two E2M1 codes packed in one byte, `lo` in the low nibble (the even column).
LOCKSTEP_HD inline uint8_t encode_e2m1x2_fast(float lo, float hi) {
  return uint8_t(encode_e2m1_fast(lo) | (encode_e2m1_fast(hi) << 4));
}

// E4M3 / E5M2 pairs, returned as (hi << 8) | lo. On sm_89+ one `cvt.rn.satfinite` converts two
// values; NaN inputs are mapped to the contract's 0x7F whatever their sign.
LOCKSTEP_HD inline uint16_t encode_e4m3x2_fast(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  if (is_nan(lo)) r = uint16_t((r & 0xFF00u) | 0x7Fu);
  if (is_nan(hi)) r = uint16_t((r & 0x00FFu) | 0x7F00u);
  return r;
#else
  return uint16_t(encode_e4m3(lo) | (encode_e4m3(hi) << 8));
#endif
}

LOCKSTEP_HD inline uint16_t encode_e5m2x2_fast(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  if (is_nan(lo)) r = uint16_t((r & 0xFF00u) | 0x7Fu);
  if (is_nan(hi)) r = uint16_t((r & 0x00FFu) | 0x7F00u);
  return r;
#else
  return uint16_t(encode_e5m2(lo) | (encode_e5m2(hi) << 8));
#endif
}

// amax_fold (hd.h) as one instruction on the device: fmaxf is IEEE maxNum, the same "NaN operand
// ignored" rule; |x| >= 0 so signed zeros cannot differ. Only the payload of an all-NaN result can
// differ (the GPU returns 0x7FFFFFFF), so callers treat every NaN amax alike (canonical
// 0x7FC00000).
LOCKSTEP_HD inline float amax_fold_fast(float acc, float x) {
#if defined(__CUDA_ARCH__)
  return fmaxf(acc, fabsf(x));
#else
  return amax_fold(acc, x);
#endif
}

// two_level_block_scale (block_rules.h) with the E4M3 encode done by encode_e4m3x2_fast, which is
// the same code as encode_e4m3 for every fp32 input.
LOCKSTEP_HD inline uint8_t two_level_block_scale_fast(float block_amax, const TwoLevelOuter& o) {
  return uint8_t(
      encode_e4m3x2_fast(fmin_f32(mul_rn(block_amax, o.s_enc_x_inv_max), kFltMax), 0.0f));
}

// two_level_block_scale for a block amax that is not NaN (inf allowed), with o from
// two_level_outer: o.s_enc_x_inv_max is finite and > 0, so the product is never NaN, and satfinite
// maps +inf and FLT_MAX alike to 0x7E, which makes the fmin with FLT_MAX redundant. One FMUL and
// one cvt.
LOCKSTEP_HD inline uint8_t two_level_block_scale_nonan(float block_amax, const TwoLevelOuter& o) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
      : "=h"(r)
      : "f"(0.0f), "f"(mul_rn(block_amax, o.s_enc_x_inv_max)));
  return uint8_t(r);
#else
  return two_level_block_scale(block_amax, o);
#endif
}

// decode_e4m3 by the hardware cvt (E4M3 -> f16 is exact, f16 -> f32 too); NaN codes give a NaN.
LOCKSTEP_HD inline float decode_e4m3_fast(uint8_t code) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(code)));
  return __half2float(__ushort_as_half(uint16_t(h2)));
#else
  return decode_e4m3(code);
#endif
}

// two_level_outer(amax, kE2M1Max) with RN(1/6) as a constant (0x3E2AAAAB) instead of a division.
LOCKSTEP_HD inline TwoLevelOuter two_level_outer_e2m1(float amax) {
  float s_enc = fmin_f32(div_rn(2688.0f, amax), kFltMax);
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  return TwoLevelOuter{s_enc, div_rn(1.0f, s_enc), mul_rn(s_enc, 0x1.555556p-3f)};
}

// two_level_encode_factor with decode_e4m3_fast (the same value for every code; a NaN code gives a
// NaN of another payload, which no caller distinguishes).
LOCKSTEP_HD inline float two_level_encode_factor_fast(uint8_t scale_code, const TwoLevelOuter& o) {
  return fmin_f32(div_rn(1.0f, mul_rn(decode_e4m3_fast(scale_code), o.s_dec)), kFltMax);
}

}  // namespace lockstep::num
