// Scalar codecs of CONTRACT.md section 1 (E2M1, E4M3, E5M2, E8M0) and the simulated ExMy formats
// of section 9, written once for the CPU reference and the CUDA kernels alike.
// All encoders are round-to-nearest-even and saturating (satfinite); decoding is exact.
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"

namespace lockstep::num {

// A sign-magnitude minifloat: e_bits exponent bits (bias 2^(e_bits-1) - 1), m_bits mantissa bits,
// subnormals, max_code = largest finite magnitude code, nan_code = code written for NaN input.
struct MiniFloat {
  int e_bits;
  int m_bits;
  uint32_t max_code;  // magnitude code (without sign) of the largest finite value
  uint32_t nan_code;  // full code written for a NaN input (sign bit ignored)
  bool has_nan;       // decode: codes (max_code+1 .. all ones) are NaN / inf rather than values
  bool has_inf;       // decode: code max_code+1 with zero low bits is inf (E5M2)
};

constexpr MiniFloat kE2M1{2, 1, 0x7u, 0x7u, false, false};
constexpr MiniFloat kE4M3{4, 3, 0x7Eu, 0x7Fu, true, false};
constexpr MiniFloat kE5M2{5, 2, 0x7Bu, 0x7Fu, true, true};

// Simulated format with every code finite (CONTRACT.md section 9).
constexpr MiniFloat exmy_format(int e_bits, int m_bits) {
  uint32_t all = (1u << (e_bits + m_bits)) - 1u;
  return MiniFloat{e_bits, m_bits, all, all, false, false};
}

LOCKSTEP_HD inline uint32_t sign_shift(const MiniFloat& f) { return uint32_t(f.e_bits + f.m_bits); }

// Magnitude code of |v| (|v| finite, not NaN), rounded as asked: nearest-even or toward zero.
// Not saturated: the caller clamps to max_code.
LOCKSTEP_HD inline uint32_t minifloat_magnitude_code(const MiniFloat& f, uint32_t abs_bits,
                                                     bool round_nearest_even) {
  const int bias = (1 << (f.e_bits - 1)) - 1;
  const int emin = 1 - bias;  // exponent of the smallest normal
  uint32_t e32 = abs_bits >> 23;
  uint32_t man = abs_bits & 0x7FFFFFu;
  if (e32 == 0 && man == 0) return 0;
  int e = e32 == 0 ? -126 : int(e32) - 127;
  uint64_t sig = e32 == 0 ? man : (man | 0x800000u);  // value = sig * 2^(e - 23)
  // Express the value in units of the format's ulp at exponent max(e, emin):
  // code = (biased exponent << m_bits) + mantissa, which for subnormals is just the unit count.
  int unit_exp = (e < emin ? emin : e) - f.m_bits;  // value of one unit = 2^unit_exp
  int shift = unit_exp - (e - 23);                  // sig >> shift = units (shift >= 0 here)
  uint64_t units;
  if (shift >= 40) {
    units = 0;
    if (round_nearest_even) return 0;  // below half a unit
  } else {
    units = sig >> shift;
    if (round_nearest_even && shift > 0) {
      uint64_t rem = sig & ((uint64_t(1) << shift) - 1);
      uint64_t half = uint64_t(1) << (shift - 1);
      if (rem > half || (rem == half && (units & 1))) ++units;
    }
  }
  if (e < emin) return uint32_t(units);  // subnormal (a carry into the min normal is correct)
  // Normal: units holds 1.mantissa in m_bits+1 bits (possibly 2^(m_bits+1) after a carry).
  uint64_t code = (uint64_t(e + bias) << f.m_bits) + (units - (uint64_t(1) << f.m_bits));
  return code > 0xFFFFu ? 0xFFFFu : uint32_t(code);
}

// RNE, satfinite encode (CONTRACT.md section 1): +-inf and |v| above max give +-max, the sign of
// zero is kept, NaN gives f.nan_code.
LOCKSTEP_HD inline uint8_t encode_minifloat(const MiniFloat& f, float v) {
  uint32_t b = f32_bits(v);
  if (is_nan(v)) return uint8_t(f.nan_code);
  uint32_t sign = (b >> 31) << sign_shift(f);
  uint32_t abs_bits = b & 0x7FFFFFFFu;
  uint32_t mag = abs_bits == 0x7F800000u ? f.max_code : minifloat_magnitude_code(f, abs_bits, true);
  if (mag > f.max_code) mag = f.max_code;
  return uint8_t(sign | mag);
}

// Exact decode of a code of format f.
LOCKSTEP_HD inline float decode_minifloat(const MiniFloat& f, uint32_t code) {
  const int bias = (1 << (f.e_bits - 1)) - 1;
  uint32_t sign = (code >> sign_shift(f)) & 1u;
  uint32_t mag = code & ((1u << sign_shift(f)) - 1u);
  uint32_t sbit = sign << 31;
  if (mag > f.max_code) {
    if (f.has_inf && mag == f.max_code + 1) return f32_from_bits(sbit | 0x7F800000u);
    return f32_from_bits(sbit | 0x7FC00000u);
  }
  uint32_t exp_field = mag >> f.m_bits;
  uint32_t man = mag & ((1u << f.m_bits) - 1u);
  if (exp_field == 0) {
    if (man == 0) return f32_from_bits(sbit);
    // subnormal: man * 2^(1 - bias - m_bits); normalize into fp32
    int e = 1 - bias;
    while ((man & (1u << f.m_bits)) == 0) {
      man <<= 1;
      --e;
    }
    man &= (1u << f.m_bits) - 1u;
    return f32_from_bits(sbit | (uint32_t(e + 127) << 23) | (man << (23 - f.m_bits)));
  }
  int e = int(exp_field) - bias;
  return f32_from_bits(sbit | (uint32_t(e + 127) << 23) | (man << (23 - f.m_bits)));
}

// Largest finite magnitude of f, as fp32 (exact).
LOCKSTEP_HD inline float minifloat_max(const MiniFloat& f) {
  return decode_minifloat(f, f.max_code);
}

// The two representable magnitudes around |v| (lo <= |v| <= hi, lo == hi when exact), for
// stochastic rounding (CONTRACT.md section 5). |v| must be finite and below max.
struct Bracket {
  uint32_t lo_code;
  float lo;
  float hi;
};
LOCKSTEP_HD inline Bracket minifloat_bracket(const MiniFloat& f, float v) {
  uint32_t abs_bits = f32_bits(v) & 0x7FFFFFFFu;
  uint32_t lo_code = minifloat_magnitude_code(f, abs_bits, false);
  float lo = decode_minifloat(f, lo_code);
  float hi = lo == f32_from_bits(abs_bits) ? lo : decode_minifloat(f, lo_code + 1);
  return Bracket{lo_code, lo, hi};
}

// Stochastic rounding encode (CONTRACT.md section 5) with the element's 32-bit random word r.
LOCKSTEP_HD inline uint8_t encode_minifloat_stochastic(const MiniFloat& f, float v, uint32_t r) {
  if (is_nan(v)) return uint8_t(f.nan_code);
  uint32_t b = f32_bits(v);
  uint32_t sign = (b >> 31) << sign_shift(f);
  float a = abs_f32(v);
  float maxv = minifloat_max(f);
  if (!(a < maxv)) return uint8_t(sign | f.max_code);  // saturation as in RNE (incl. inf)
  Bracket br = minifloat_bracket(f, a);
  if (br.lo == a) return uint8_t(sign | br.lo_code);
  float frac = div_rn(sub_rn(a, br.lo), sub_rn(br.hi, br.lo));
  float u = float(r >> 8) * 5.9604644775390625e-08f;  // (r >> 8) * 2^-24, exact
  uint32_t mag = u < frac ? br.lo_code + 1 : br.lo_code;
  return uint8_t(sign | mag);
}

// Named codecs. Each copies its format into a local constexpr: device code may not bind a
// reference to a host namespace-scope object (kE2M1 ...), but may use a constant-folded copy.
LOCKSTEP_HD inline uint8_t encode_e2m1(float v) {
  constexpr MiniFloat f = kE2M1;
  return encode_minifloat(f, v);
}
LOCKSTEP_HD inline uint8_t encode_e4m3(float v) {
  constexpr MiniFloat f = kE4M3;
  return encode_minifloat(f, v);
}
LOCKSTEP_HD inline uint8_t encode_e5m2(float v) {
  constexpr MiniFloat f = kE5M2;
  return encode_minifloat(f, v);
}
LOCKSTEP_HD inline float decode_e2m1(uint8_t c) {
  constexpr MiniFloat f = kE2M1;
  return decode_minifloat(f, c & 0xFu);
}
LOCKSTEP_HD inline float decode_e4m3(uint8_t c) {
  constexpr MiniFloat f = kE4M3;
  return decode_minifloat(f, c);
}
LOCKSTEP_HD inline float decode_e5m2(uint8_t c) {
  constexpr MiniFloat f = kE5M2;
  return decode_minifloat(f, c);
}

// E8M0 (CONTRACT.md section 1): round toward +inf on the exponent, saturating.
// 0 or v <= 2^-127 -> 0x00; powers of two exact; v > 2^127 or +inf -> 0xFE; NaN -> 0xFF.
LOCKSTEP_HD inline uint8_t encode_e8m0(float v) {
  if (is_nan(v)) return 0xFF;
  uint32_t b = f32_bits(v);
  if ((b >> 31) != 0 || b <= 0x00400000u) return 0x00;  // <= 2^-127 (incl. -0 and negatives)
  if (b > 0x7F000000u) return 0xFE;                     // > 2^127, incl. +inf
  uint32_t e32 = b >> 23;
  uint32_t man = b & 0x7FFFFFu;
  if (e32 == 0) return 0x01;  // subnormal above 2^-127: next power up is 2^-126
  return uint8_t(e32 + (man != 0 ? 1u : 0u));
}

// 2^(e - 127) exactly (e = 0 gives the subnormal 2^-127); 0xFF decodes to NaN.
LOCKSTEP_HD inline float decode_e8m0(uint8_t e) {
  if (e == 0xFF) return f32_from_bits(0x7FC00000u);
  if (e == 0) return f32_from_bits(0x00400000u);
  return f32_from_bits(uint32_t(e) << 23);
}

}  // namespace lockstep::num
