// Portable fp32 exp and SiLU written only with correctly rounded +, -, *, / and bit operations,
// so the host and every GPU compute the same bits (std::exp and CUDA's expf are not guaranteed to
// agree). Used by the weighted-SwiGLU producer fusion (quant/moe_fused.h). Accuracy: exp_f32 is
// within 2 ulp of exp over the normal range; what matters here is that it is one fixed function.
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"

namespace lockstep::num {

// exp(x): x = k ln2 + r with k = nearest integer of x / ln2, ln2 split in two (Cody-Waite), so
// |r| <= ln2/2; exp(r) by a degree-7 Taylor polynomial in Horner form; then times 2^k built in two
// exact power-of-two steps (so gradual underflow rounds once). NaN -> NaN, +inf -> +inf, -inf -> 0.
LOCKSTEP_HD inline float exp_f32(float x) {
  if (is_nan(x)) return f32_from_bits(0x7FC00000u);
  if (x > 88.8f) return f32_from_bits(0x7F800000u);
  if (x < -104.0f) return 0.0f;
  const float kInvLn2 = 1.44269502162933349609375f;
  const float kLn2Hi = 0.693145751953125f;          // 12 significant bits: k * kLn2Hi is exact
  const float kLn2Lo = 1.428606765330187045e-06f;   // ln2 - kLn2Hi
  float t = mul_rn(x, kInvLn2);
  // round to nearest integer (|t| < 2^23): add and subtract 1.5 * 2^23
  float kf = sub_rn(add_rn(t, 12582912.0f), 12582912.0f);
  int k = int(kf);
  float r = sub_rn(sub_rn(x, mul_rn(kf, kLn2Hi)), mul_rn(kf, kLn2Lo));
  float p = 1.98412698e-4f;                           // 1/5040
  p = add_rn(mul_rn(p, r), 1.38888889e-3f);           // 1/720
  p = add_rn(mul_rn(p, r), 8.33333333e-3f);           // 1/120
  p = add_rn(mul_rn(p, r), 4.16666667e-2f);           // 1/24
  p = add_rn(mul_rn(p, r), 1.66666667e-1f);           // 1/6
  p = add_rn(mul_rn(p, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  // 2^k = 2^k1 * 2^k2 with both factors normal (k in [-151, 128]).
  int k1 = k / 2, k2 = k - k / 2;
  float s1 = f32_from_bits(uint32_t(k1 + 127) << 23);
  float s2 = f32_from_bits(uint32_t(k2 + 127) << 23);
  return mul_rn(mul_rn(p, s1), s2);
}

// silu(g) = RN(g / RN(1 + exp_f32(-g))). For g -> -inf the quotient is -0 or a tiny negative.
LOCKSTEP_HD inline float silu_f32(float g) { return div_rn(g, add_rn(1.0f, exp_f32(-g))); }

// Weighted SwiGLU element of an MoE FC1 output: RN(RN(silu(gate) * up) * prob), kept in fp32.
LOCKSTEP_HD inline float swiglu_weighted_f32(float gate, float up, float prob) {
  return mul_rn(mul_rn(silu_f32(gate), up), prob);
}

}  // namespace lockstep::num
