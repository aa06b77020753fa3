// Portable fp32 exp, log and SiLU written only with correctly rounded +, -, *, / and bit
// operations, so the host and every GPU compute the same bits (std::exp and CUDA's expf are not
// guaranteed to agree). Used by the weighted-SwiGLU producer fusion (quant/moe_fused.h) and the
// transformer ops (ops/). Accuracy: exp_f32 is within 2 ulp of exp over the normal range, log_f32
// within 1 ulp of log over all positive floats; what matters is that each is one fixed function.
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
  const float kLn2Hi = 0.693145751953125f;         // 12 significant bits: k * kLn2Hi is exact
  const float kLn2Lo = 1.428606765330187045e-06f;  // ln2 - kLn2Hi
  float t = mul_rn(x, kInvLn2);
  // round to nearest integer (|t| < 2^23): add and subtract 1.5 * 2^23
  float kf = sub_rn(add_rn(t, 12582912.0f), 12582912.0f);
  int k = int(kf);
  float r = sub_rn(sub_rn(x, mul_rn(kf, kLn2Hi)), mul_rn(kf, kLn2Lo));
  float p = 1.98412698e-4f;                  // 1/5040
  p = add_rn(mul_rn(p, r), 1.38888889e-3f);  // 1/720
  p = add_rn(mul_rn(p, r), 8.33333333e-3f);  // 1/120
  p = add_rn(mul_rn(p, r), 4.16666667e-2f);  // 1/24
  p = add_rn(mul_rn(p, r), 1.66666667e-1f);  // 1/6
  p = add_rn(mul_rn(p, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  // 2^k = 2^k1 * 2^k2 with both factors normal (k in [-151, 128]).
  int k1 = k / 2, k2 = k - k / 2;
  float s1 = f32_from_bits(uint32_t(k1 + 127) << 23);
  float s2 = f32_from_bits(uint32_t(k2 + 127) << 23);
  return mul_rn(mul_rn(p, s1), s2);
}

// log(x): x = 2^e * m with m in [0.7071, 1.4142] (a subnormal x is first scaled by 2^23, exactly),
// f = m - 1 (exact by Sterbenz), s = f / (2 + f), |s| < 0.1716. log(m) = 2 atanh(s) = 2s + s Q(z)
// with z = s^2 and Q(z) = 2z/3 + 2z^2/5 + 2z^3/7 + 2z^4/9 + 2z^5/11 (Taylor series of atanh; the
// first omitted term is below 2^-34 relative). Since s (2 + f) = f, 2s = f - s f, so
// log(m) = f - s (f - Q): f is exact and the rounded part is a correction under 18% of f. Then
// log(x) = e ln2_hi + (e ln2_lo + log(m)), ln2 split as in exp_f32 so that e ln2_hi is exact.
// Edges: NaN and x < 0 -> NaN, +-0 -> -inf, +inf -> +inf.
LOCKSTEP_HD inline float log_f32(float x) {
  uint32_t b = f32_bits(x);
  if (is_nan(x) || (b > 0x80000000u)) return f32_from_bits(0x7FC00000u);
  if ((b & 0x7FFFFFFFu) == 0) return f32_from_bits(0xFF800000u);
  if (b == 0x7F800000u) return x;
  int e = 0;
  if (b < 0x00800000u) {  // subnormal: scale into the normal range
    b = f32_bits(mul_rn(x, 8388608.0f));
    e = -23;
  }
  e += int(b >> 23) - 127;
  float m = f32_from_bits((b & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = mul_rn(m, 0.5f);
    e += 1;
  }
  const float kLn2Hi = 0.693145751953125f;         // 12 significant bits: e * kLn2Hi is exact
  const float kLn2Lo = 1.428606765330187045e-06f;  // ln2 - kLn2Hi
  const float f = sub_rn(m, 1.0f);
  const float s = div_rn(f, add_rn(2.0f, f));
  const float z = mul_rn(s, s);
  float q = 0.181818182f;                  // 2/11
  q = add_rn(mul_rn(q, z), 0.222222222f);  // 2/9
  q = add_rn(mul_rn(q, z), 0.285714286f);  // 2/7
  q = add_rn(mul_rn(q, z), 0.4f);          // 2/5
  q = add_rn(mul_rn(q, z), 0.666666667f);  // 2/3
  q = mul_rn(q, z);
  const float log_m = sub_rn(f, mul_rn(s, sub_rn(f, q)));
  const float ef = float(e);
  return add_rn(mul_rn(ef, kLn2Hi), add_rn(mul_rn(ef, kLn2Lo), log_m));
}

// silu(g) = RN(g / RN(1 + exp_f32(-g))). For g -> -inf the quotient is -0 or a tiny negative.
LOCKSTEP_HD inline float silu_f32(float g) { return div_rn(g, add_rn(1.0f, exp_f32(-g))); }

// Weighted SwiGLU element of an MoE FC1 output: RN(RN(silu(gate) * up) * prob), kept in fp32.
LOCKSTEP_HD inline float swiglu_weighted_f32(float gate, float up, float prob) {
  return mul_rn(mul_rn(silu_f32(gate), up), prob);
}

}  // namespace lockstep::num
