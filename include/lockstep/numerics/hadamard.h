// The random Hadamard transform of one 16-value chunk (CONTRACT.md section 6), written once for
// the CPU reference and the CUDA kernels: y = x . diag(s) H16 / 4, fp32 sums in ascending i
// starting from the i = 0 term, output rounded to bf16 (docs/contract-notes.md); and its inverse
// (host only), which `lockstep dequantize` applies to a file quantized with --hadamard.
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"

namespace lockstep::num {

constexpr uint32_t kHadamardSigns = 0xD7E8u;  // s_i = -1 where bit i is set

// Parity of the set bits of v (the sign of H16[i][j] is the parity of i & j).
LOCKSTEP_HD inline uint32_t parity_u32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return uint32_t(__popc(v)) & 1u;
#else
  return uint32_t(__builtin_parity(v));
#endif
}

// True when term i of output j is subtracted: s_i * H16[i][j] == -1. Written with integer XOR:
// GCC 12 at -O1/-O2 miscompiled the equivalent `bool != bool` form of this expression.
LOCKSTEP_HD inline bool hadamard16_negative(int i, int j) {
  return ((kHadamardSigns >> uint32_t(i)) ^ parity_u32(uint32_t(i & j))) & 1u;
}

LOCKSTEP_HD inline void hadamard16_chunk(const float in[16], float out[16]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 16; ++j) {
    float acc = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < 16; ++i) {
      const float term = hadamard16_negative(i, j) ? -in[i] : in[i];
      acc = i == 0 ? term : add_rn(acc, term);
    }
    out[j] = bf16_to_f32(f32_to_bf16(mul_rn(acc, 0.25f)));
  }
}

// The inverse of the transform's matrix, for rebuilding values from a quantized file: M =
// diag(s) H16 / 4 is orthogonal (H16 H16^T = 16 I and s_i^2 = 1, so M M^T = I), hence x = y M^T,
// x_i = sum_j s_i H16[i][j] y_j / 4. Summed in float64 in ascending j (exact whenever the 16 fp32
// values span at most 25 binades, as quantized blocks do), scaled by 1/4 (exact) and rounded once
// to fp32. It inverts M exactly; the bf16 rounding of the forward transform and the quantization
// error are not undone (the error keeps its L2 norm through the orthogonal M^T).
inline void inverse_hadamard16_chunk(const float in[16], float out[16]) {
  for (int i = 0; i < 16; ++i) {
    double acc = 0.0;
    for (int j = 0; j < 16; ++j) acc += hadamard16_negative(i, j) ? -double(in[j]) : double(in[j]);
    out[i] = float(acc * 0.25);
  }
}

}  // namespace lockstep::num
