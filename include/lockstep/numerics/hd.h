// Host/device portability for lockstep's scalar numerics: the LOCKSTEP_HD qualifier, bit casts
// and the correctly rounded fp32 operations of CONTRACT.md section 0 (RN(a*b), RN(a/b), ...).
// Everything here compiles as plain C++20 and inside nvcc device code.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOCKSTEP_HD __host__ __device__
#else
#define LOCKSTEP_HD
#endif

// Full unrolling of the fixed-size loops of a row function in device code (register arrays stay
// in registers); nothing on the host compiler.
#if defined(__CUDACC__)
#define LOCKSTEP_UNROLL _Pragma("unroll")
#else
#define LOCKSTEP_UNROLL
#endif

#if !defined(__CUDA_ARCH__)
#include <bit>
#include <cmath>
#endif

namespace lockstep::num {

LOCKSTEP_HD inline uint32_t f32_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  return std::bit_cast<uint32_t>(v);
#endif
}

LOCKSTEP_HD inline float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}

constexpr float kFltMax = 3.4028234663852886e38f;

// One correctly rounded fp32 operation each (RN(.) in CONTRACT.md). Host code is built with
// -ffp-contract=off, so a * b here is never fused into a neighbouring add.
LOCKSTEP_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

LOCKSTEP_HD inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

LOCKSTEP_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

LOCKSTEP_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// IEEE square root, correctly rounded (std::sqrt on the host is the IEEE operation).
LOCKSTEP_HD inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

LOCKSTEP_HD inline bool is_nan(float v) { return (f32_bits(v) & 0x7FFFFFFFu) > 0x7F800000u; }
LOCKSTEP_HD inline bool is_inf(float v) { return (f32_bits(v) & 0x7FFFFFFFu) == 0x7F800000u; }
LOCKSTEP_HD inline bool is_finite(float v) { return (f32_bits(v) & 0x7F800000u) != 0x7F800000u; }
LOCKSTEP_HD inline float abs_f32(float v) { return f32_from_bits(f32_bits(v) & 0x7FFFFFFFu); }

// C fminf / fmaxf semantics: a NaN operand is ignored (NaN only when both are NaN).
LOCKSTEP_HD inline float fmin_f32(float a, float b) {
  if (is_nan(a)) return b;
  if (is_nan(b)) return a;
  return a < b ? a : b;
}
LOCKSTEP_HD inline float fmax_f32(float a, float b) {
  if (is_nan(a)) return b;
  if (is_nan(b)) return a;
  return a > b ? a : b;
}

// Running amax (CONTRACT.md section 0): start from kAmaxEmpty, fold |x| with fmaxf semantics,
// finish with amax_finish. NaN elements are ignored, a set of only NaN gives NaN, the empty set 0.
// The fold is associative and commutative, so any reduction order gives the same bits.
constexpr uint32_t kAmaxEmptyBits = 0x7FC00000u;  // quiet NaN marks "nothing seen yet"
LOCKSTEP_HD inline float amax_empty() { return f32_from_bits(kAmaxEmptyBits); }
LOCKSTEP_HD inline float amax_fold(float acc, float x) { return fmax_f32(acc, abs_f32(x)); }

// Widening and narrowing of 16-bit floats.
LOCKSTEP_HD inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// fp32 -> bf16 round-to-nearest-even; NaN stays a (quiet) NaN with its sign, inf stays inf.
LOCKSTEP_HD inline uint16_t f32_to_bf16(float v) {
  uint32_t b = f32_bits(v);
  if (is_nan(v)) return uint16_t((b >> 16) | 0x0040u);
  uint32_t lsb = (b >> 16) & 1u;
  b += 0x7FFFu + lsb;
  return uint16_t(b >> 16);
}

// A bf16 element written by a row function that computes in fp32: assigning a float stores its
// f32_to_bf16 bits, so `y[c] = v` writes the same bits as an fp32 row followed by cast() to bf16.
struct Bf16Out {
  uint16_t bits;
  LOCKSTEP_HD Bf16Out& operator=(float v) {
    bits = f32_to_bf16(v);
    return *this;
  }
};
static_assert(sizeof(Bf16Out) == 2, "Bf16Out is one bf16 element");

// IEEE binary16 -> fp32, exact.
LOCKSTEP_HD inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return f32_from_bits(sign);
  // subnormal half: man * 2^-24, exactly representable as a normal fp32
  int e = -1;
  do {
    man <<= 1;
    ++e;
  } while ((man & 0x400u) == 0);
  man &= 0x3FFu;
  return f32_from_bits(sign | (uint32_t(112 - e) << 23) | (man << 13));
}

// fp32 -> IEEE binary16, round-to-nearest-even (IEEE semantics, not saturating): |v| >= 65520
// gives +-inf, values below half the smallest subnormal give +-0, NaN stays a quiet NaN with its
// sign.
LOCKSTEP_HD inline uint16_t f32_to_f16(float v) {
  const uint32_t b = f32_bits(v);
  const uint16_t sign = uint16_t((b >> 16) & 0x8000u);
  const uint32_t abs = b & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // 65520 = 65504 + half an ulp
  if (abs >= 0x38800000u) {                                 // normal half: |v| >= 2^-14
    uint32_t m = abs - (112u << 23);                        // exponent bias 127 -> 15
    m += 0x0FFFu + ((m >> 13) & 1u);                        // RNE on the 13 dropped bits
    return uint16_t(sign | (m >> 13));
  }
  const uint32_t e = abs >> 23;
  if (e < 102) return sign;  // |v| < 2^-25, half the smallest subnormal: rounds to 0
  // Subnormal half: k units of 2^-24, k = significand * 2^(e - 126), rounded to nearest even
  // (k = 1024 is the smallest normal, encoded the same way).
  const uint32_t shift = 126u - e;  // 14..24
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  uint32_t k = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (k & 1u) != 0)) ++k;
  return uint16_t(sign | k);
}

}  // namespace lockstep::num
