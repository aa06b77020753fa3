// Fast element encoders for the CUDA kernels, equal code for code to the reference encoders of
// codecs.h (RNE, satfinite, NaN codes of CONTRACT.md section 1). The reference encoder costs
// ~50 integer instructions per element, which would make a quantizer ALU-bound on an H200; these
// cost a handful. Equality with codecs.h is checked exhaustively over all 2^32 fp32 inputs by
// `lockstep_test_backend --op codec` (on the GPU) and by the host fallbacks below being the reference.
#pragma once

#include <cstdint>

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
  uint32_t code = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) + uint32_t(a >= 1.75f) +
                  uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.0f);
  return uint8_t(((b >> 31) << 3) | code);
}

// E2M1 by arithmetic on the fp32 bits, branch-free (about 12 instructions, no compare chain); the
// same code as encode_e2m1 for every fp32 input. |v| >= 1: integer RNE of the bit pattern to one
// mantissa bit (adding 0x1FFFFF plus the kept bit carries into the exponent exactly when RNE rounds
// up), so bits >> 22 is 254 for 1.0 .. 259 for 6.0, saturated at code 7 (inf and NaN give >= 7 too).
// |v| < 1: |v| + 2^22 rounds |v| to a multiple of 0.5 with RNE (the fp32 ulp there is 0.5), and the
// low bits are the code 0..2. NaN gives 0x7 whatever its sign, as encode_e2m1.
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
// differ (the GPU returns 0x7FFFFFFF), so callers treat every NaN amax alike (canonical 0x7FC00000).
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
  return uint8_t(encode_e4m3x2_fast(fmin_f32(mul_rn(block_amax, o.s_enc_x_inv_max), kFltMax), 0.0f));
}

}  // namespace lockstep::num
