// Fast element encoders for the CUDA kernels, equal code for code to the reference encoders of
// codecs.h (RNE, satfinite, NaN codes of CONTRACT.md section 1). The reference encoder costs
// ~50 integer instructions per element, which would make a quantizer ALU-bound on an H200; these
// cost a handful. Equality with codecs.h is checked exhaustively over all 2^32 fp32 inputs by
// `lockstep_test_backend --op codec` (on the GPU) and by the host fallbacks below being the reference.
#pragma once

#include <cstdint>

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

}  // namespace lockstep::num
