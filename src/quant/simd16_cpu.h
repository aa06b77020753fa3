// Sixteen-lane helpers of the CPU row quantizers (quantize_rows_cpu.cpp), written with the GCC /
// Clang vector extensions so that each instruction-set version of a kernel compiles them to its own
// instruction set (one AVX-512 register, two AVX2 or four SSE2 ones) with no intrinsics. Every
// helper computes, lane by lane, exactly the value of the scalar codec or block rule it names in
// numerics/ (codecs.h, block_rules.h, fast_codecs.h); tests/test_quant_rows.cpp checks them.
// Private to src/quant.
#pragma once

#include <cstdint>
#include <cstring>

#include "lockstep/numerics/hd.h"

// The helpers below pass 64-byte vectors by value; they are always inlined, so the note that such
// a signature's ABI differs between instruction sets concerns no real call.
#pragma GCC diagnostic ignored "-Wpsabi"

// Helpers are forced inline so that each kernel version gets them in its own instruction set (an
// out-of-line copy would be compiled once, for the baseline, and pass vectors by memory).
#define LOCKSTEP_V16 static inline __attribute__((always_inline))

namespace lockstep::cpu::v16 {

typedef float F __attribute__((vector_size(64)));
typedef uint32_t U __attribute__((vector_size(64)));
typedef int32_t I __attribute__((vector_size(64)));
typedef uint16_t H __attribute__((vector_size(32)));
typedef uint8_t B __attribute__((vector_size(16)));

LOCKSTEP_V16 U bits(F v) {
  U r;
  std::memcpy(&r, &v, sizeof(r));
  return r;
}
LOCKSTEP_V16 F flt(U v) {
  F r;
  std::memcpy(&r, &v, sizeof(r));
  return r;
}
LOCKSTEP_V16 U splat(uint32_t v) { return U{} + v; }
LOCKSTEP_V16 F splatf(float v) { return F{} + v; }
LOCKSTEP_V16 U min_u(U a, U b) { return a < b ? a : b; }
LOCKSTEP_V16 U max_u(U a, U b) { return a > b ? a : b; }
LOCKSTEP_V16 U sel(U mask, U a, U b) { return (mask & a) | (~mask & b); }  // mask lanes 0 / ~0

// 16 fp32 bit patterns from 16 bf16 (exact widening) or 16 fp32 values.
LOCKSTEP_V16 U load(const uint16_t* p) {
  H h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, U) << 16;
}
LOCKSTEP_V16 U load(const float* p) {
  U u;
  std::memcpy(&u, p, sizeof(u));
  return u;
}
// The low byte of each lane.
LOCKSTEP_V16 void store_bytes(uint8_t* p, U v) {
  const B b = __builtin_convertvector(v, B);
  std::memcpy(p, &b, sizeof(b));
}

// Amax key of each lane: |x| bits + 1, or 0 for NaN. The key is monotone in |x|, so the largest
// key of a set gives its amax (CONTRACT.md section 0: NaN ignored) and 0 says "only NaN".
LOCKSTEP_V16 U amax_key(U x) {
  const U m = x & 0x7FFFFFFFu;
  return sel(m > 0x7F800000u, U{}, m + 1u);
}
// 1 in each lane holding NaN or +-inf.
LOCKSTEP_V16 U nonfinite(U x) { return ((x & 0x7FFFFFFFu) >= 0x7F800000u) & 1u; }

LOCKSTEP_V16 uint32_t hmax(U a) {
  a = max_u(a, __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  a = max_u(a, __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  a = max_u(a, __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  a = max_u(a, __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return a[0];
}
LOCKSTEP_V16 uint32_t hsum(U a) {
  uint32_t s = 0;
  for (int i = 0; i < 16; ++i) s += a[i];
  return s;
}

// Lane b of the result is the largest lane of k[b]: 16 horizontal maxima as one vector, in 15
// two-vector steps (each step halves the lanes every input still spreads over).
LOCKSTEP_V16 U max_of_each(const U* k) {
  U l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; ++i)
    l1[i] = max_u(__builtin_shufflevector(k[2 * i], k[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17,
                                          18, 19, 20, 21, 22, 23),
                  __builtin_shufflevector(k[2 * i], k[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24,
                                          25, 26, 27, 28, 29, 30, 31));
  for (int i = 0; i < 4; ++i)
    l2[i] = max_u(__builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16,
                                          17, 18, 19, 24, 25, 26, 27),
                  __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20,
                                          21, 22, 23, 28, 29, 30, 31));
  for (int i = 0; i < 2; ++i)
    l3[i] = max_u(__builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16,
                                          17, 20, 21, 24, 25, 28, 29),
                  __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18,
                                          19, 22, 23, 26, 27, 30, 31));
  return max_u(__builtin_shufflevector(l3[0], l3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                       26, 28, 30),
               __builtin_shufflevector(l3[0], l3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                                       27, 29, 31));
}

// The amax a key stands for: NaN (0x7FC00000) for key 0, else the |x| bits.
LOCKSTEP_V16 F amax_of_key(U key) { return flt(sel(key == 0u, splat(0x7FC00000u), key - 1u)); }

// fminf(v, FLT_MAX) for v >= 0 or NaN: +inf and NaN give FLT_MAX.
LOCKSTEP_V16 F min_flt_max(F v) {
  return flt(sel(v <= num::kFltMax, bits(v), splat(num::f32_bits(num::kFltMax))));
}

// E2M1 codes of v (num::encode_e2m1_arith lane by lane: RNE, satfinite, sign kept, NaN -> 0x7).
LOCKSTEP_V16 U e2m1(F v) {
  const U b = bits(v);
  const U m = b & 0x7FFFFFFFu;
  const U big = (m + 0x1FFFFFu + ((m >> 22) & 1u)) >> 22;
  const U big_code = min_u(big, splat(259u)) - 252u;
  const U small_code = bits(flt(m) + 4194304.0f) - 0x4A800000u;
  const U code = sel(m < 0x3F800000u, small_code, big_code);
  return code | sel(m <= 0x7F800000u, (b >> 28) & 8u, U{});
}

// Two E2M1 code vectors (columns c .. c+15 and c+16 .. c+31) packed as 16 bytes, the even column
// in the low nibble.
LOCKSTEP_V16 void store_e2m1x32(uint8_t* p, U lo16, U hi16) {
  const U even = __builtin_shufflevector(lo16, hi16, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                         26, 28, 30);
  const U odd = __builtin_shufflevector(lo16, hi16, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                                        27, 29, 31);
  store_bytes(p, even | (odd << 4));
}

// Codes of an E4M3 (kEMax 0x7E, 3 mantissa bits, bias 7) or E5M2 (0x7B, 2, 15) encoding of v:
// num::encode_e4m3 / encode_e5m2 lane by lane (RNE, satfinite, sign kept, NaN -> 0x7F). Normal
// range: integer RNE of the fp32 pattern to the format's mantissa bits, the exponent rebiased.
// Below the smallest normal: |v| + 2^(unit + 23) rounds |v| to a multiple of the subnormal unit
// (RNE, the fp32 ulp there is that unit) and the low bits count the units.
template <int kMBits, int kBias>
LOCKSTEP_V16 U fp8_magnitude(U m) {
  constexpr uint32_t kDrop = 23 - kMBits;
  constexpr uint32_t kRebias = uint32_t(127 - kBias) << kMBits;
  constexpr uint32_t kMinNormal = uint32_t(127 + 1 - kBias) << 23;
  constexpr uint32_t kMagic = uint32_t(127 + 1 - kBias - kMBits + 23) << 23;  // 2^(unit + 23)
  const U big = ((m + ((1u << (kDrop - 1)) - 1u) + ((m >> kDrop) & 1u)) >> kDrop) - kRebias;
  const U small = bits(flt(m) + num::f32_from_bits(kMagic)) - kMagic;
  return sel(m < kMinNormal, small, big);
}
template <int kMBits, int kBias, uint32_t kMaxCode>
LOCKSTEP_V16 U fp8(F v) {
  const U b = bits(v);
  const U m = b & 0x7FFFFFFFu;
  const U mag = min_u(fp8_magnitude<kMBits, kBias>(m), splat(kMaxCode));
  return sel(m > 0x7F800000u, splat(0x7Fu), mag | ((b >> 24) & 0x80u));
}
LOCKSTEP_V16 U e4m3(F v) { return fp8<3, 7, 0x7Eu>(v); }
LOCKSTEP_V16 U e5m2(F v) { return fp8<2, 15, 0x7Bu>(v); }

// E4M3 codes of non-negative, non-NaN v (num::encode_e4m3 for such v), and their exact values.
LOCKSTEP_V16 U e4m3_positive(F v) { return min_u(fp8_magnitude<3, 7>(bits(v)), splat(0x7Eu)); }
LOCKSTEP_V16 F decode_e4m3_positive(U code) {
  const U normal = (((code >> 3) + 120u) << 23) | ((code & 7u) << 20);
  // Subnormal code k: k x 2^-9, exact through 1 + k/8 - 1 (exact) times 2^-6.
  const F sub = (flt(0x3F800000u | ((code & 7u) << 20)) - 1.0f) * 0x1p-6f;
  return flt(sel((code >> 3) == 0u, bits(sub), normal));
}

// NVFP4 block scales and element factors of 16 blocks (CONTRACT.md section 2, steps 3 and 4:
// num::two_level_block_scale and two_level_encode_factor) from their amax keys.
struct Nvfp4Blocks {
  U scale;  // E4M3 codes
  F enc;    // element encode factors
};
LOCKSTEP_V16 Nvfp4Blocks nvfp4_blocks(U keys, float s_enc_x_inv_max, float s_dec) {
  const U code = e4m3_positive(min_flt_max(amax_of_key(keys) * s_enc_x_inv_max));
  const F enc = min_flt_max(1.0f / (decode_e4m3_positive(code) * s_dec));
  return {code, enc};
}

// MXFP8 block exponents and element factors of 16 blocks (section 3: num::mx_block_exponent, the
// E8M0 rule of section 1, and num::mx_encode_factor) from their amax keys; inv_max = RN(1/max).
struct MxBlocks {
  U exponent;  // E8M0 codes
  F factor;    // 2^(127 - e), NaN for e = 0xFF
};
LOCKSTEP_V16 MxBlocks mx_blocks(U keys, float inv_max) {
  const U u = bits(amax_of_key(keys) * inv_max);  // >= 0 or NaN
  const U e32 = u >> 23;
  U e = e32 + sel((u & 0x7FFFFFu) != 0u, splat(1u), U{});
  e = sel(e32 == 0u, splat(1u), e);
  e = sel(u <= 0x00400000u, U{}, e);
  e = sel(u > 0x7F000000u, splat(0xFEu), e);
  e = sel(u > 0x7F800000u, splat(0xFFu), e);
  const U k = 254u - e;  // 2^(k - 127); k = 0 is the subnormal 2^-127
  const U factor = sel(e == 0xFFu, splat(0x7FC00000u), sel(k == 0u, splat(0x00400000u), k << 23));
  return {e, flt(factor)};
}

}  // namespace lockstep::cpu::v16
