// Block-scale rules of CONTRACT.md sections 2-4 and 9: the per-domain and per-block scale
// arithmetic, each written once in the exact operation order the contract fixes.
// Used by the CPU reference and the CUDA kernels alike.
#pragma once

#include <cstdint>

#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/hd.h"

namespace lockstep::num {

// ---- NVFP4-style two-level scaling (E4M3 block scale + fp32 outer scale), section 2 ----------
// For a simulated element format (section 9) `elem_max` replaces 6: 2688 = 6 x 448 becomes
// RN(elem_max x 448) and fl(1/6) becomes RN(1 / elem_max).
struct TwoLevelOuter {
  float s_enc;  // S_enc of the domain
  float s_dec;  // S_dec = RN(1 / S_enc)
  float
      s_enc_x_inv_max;  // RN(S_enc * fl(1/elem_max)), the factor every block amax is multiplied by
};

LOCKSTEP_HD inline TwoLevelOuter two_level_outer(float amax, float elem_max) {
  float numer = mul_rn(elem_max, 448.0f);  // 2688 for E2M1, exact
  float s_enc = fmin_f32(div_rn(numer, amax), kFltMax);
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  float s_dec = div_rn(1.0f, s_enc);
  float inv_max = div_rn(1.0f, elem_max);
  return TwoLevelOuter{s_enc, s_dec, mul_rn(s_enc, inv_max)};
}

// Step 3: the E4M3 block scale code for a block with amax b.
LOCKSTEP_HD inline uint8_t two_level_block_scale(float block_amax, const TwoLevelOuter& o) {
  return encode_e4m3(fmin_f32(mul_rn(block_amax, o.s_enc_x_inv_max), kFltMax));
}

// Step 4: the factor every element of the block is multiplied by before encoding.
LOCKSTEP_HD inline float two_level_encode_factor(uint8_t scale_code, const TwoLevelOuter& o) {
  return fmin_f32(div_rn(1.0f, mul_rn(decode_e4m3(scale_code), o.s_dec)), kFltMax);
}

// Dequantize one element: RN((elem * decode(s_b)) * S_dec); the inner product is exact.
LOCKSTEP_HD inline float two_level_dequant(float elem, uint8_t scale_code, float s_dec) {
  return mul_rn(mul_rn(elem, decode_e4m3(scale_code)), s_dec);
}

constexpr float kE2M1Max = 6.0f;

// ---- MX-style power-of-two block scaling (E8M0 scale), section 3 -----------------------------
// e = E8M0(RN(b * RN(1 / elem_max))): elem_max is 448 (E4M3), 57344 (E5M2) or a simulated max.
LOCKSTEP_HD inline uint8_t mx_block_exponent(float block_amax, float elem_max) {
  return encode_e8m0(mul_rn(block_amax, div_rn(1.0f, elem_max)));
}

// 2^(127 - e) as an exact fp32 (e = 254 gives 2^-127, e = 255 gives NaN).
LOCKSTEP_HD inline float mx_encode_factor(uint8_t e) {
  if (e == 0xFF) return f32_from_bits(0x7FC00000u);
  return decode_e8m0(uint8_t(254 - e));
}

LOCKSTEP_HD inline float mx_dequant(float elem, uint8_t e) { return mul_rn(elem, decode_e8m0(e)); }

// ---- FP8 with fp32 scales (current scaling), section 4 ---------------------------------------
// `type_max` is the largest finite value of the input's type (FLT_MAX for fp32, 0x7F7F for bf16),
// used when 448 / A overflows.
LOCKSTEP_HD inline float fp8_scale(float amax, float elem_max, float eps, float type_max,
                                   bool pow2) {
  float a = amax;
  if (a < eps) a = eps;
  float scale;
  if (a == 0.0f || is_inf(a) || is_nan(a)) {
    scale = 1.0f;
  } else {
    scale = div_rn(elem_max, a);
    if (is_inf(scale)) scale = type_max;
  }
  if (pow2) scale = f32_from_bits(f32_bits(scale) & 0xFF800000u);
  return scale;
}

LOCKSTEP_HD inline float fp8_scale_inv(float scale) { return div_rn(1.0f, scale); }

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
constexpr float kBf16Max = 3.3895313892515355e38f;  // 0x7F7F
constexpr float kF16Max = 65504.0f;

}  // namespace lockstep::num
