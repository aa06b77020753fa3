// Rotary position embedding in the rotate_half form of Qwen3 / Llama: the cos/sin table and the
// CPU reference kernels applying it (forward) and its inverse rotation (backward).
//
// Table (host, float64, then one rounding to T): inv_freq[i] = 1 / theta^(2i / head_dim) for
// i < head_dim/2, angle = pos * inv_freq[i], cos[pos, i] = cos[pos, i + head_dim/2] = cos(angle),
// likewise sin (Hugging Face's cat(freqs, freqs)). Hugging Face computes inv_freq and the angle
// in fp32; computing them in float64 and rounding once differs by less than bf16 rounding
// (to be checked against transformers on the GPU machine).
// Forward, h = head_dim/2, i < h, with c = cos[pos], s = sin[pos] (x * cos + rotate_half(x) * sin):
//   y[i]     = x[i] * c[i] - x[i+h] * s[i]
//   y[i + h] = x[i+h] * c[i+h] + x[i] * s[i+h]
// Backward (the transposed rotation, exact transpose of the table entries used):
//   dx[i]     = dy[i] * c[i] + dy[i+h] * s[i+h]
//   dx[i + h] = dy[i+h] * c[i+h] - dy[i] * s[i]
// Each output element depends only on its own pair: rope_pair below is the one definition, called
// by the CPU kernels (tokens in parallel) and the CUDA kernel (a thread per pair).
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"

namespace lockstep::ops {

// Pair i < h = head_dim / 2 of one (token, head) row: in, out: [head_dim] (out may alias in);
// c, s: the table rows [head_dim] of the token's position. kBackward applies the transpose.
template <class T, bool kBackward>
LOCKSTEP_HD void rope_pair(const T* in, const T* c, const T* s, int64_t h, int64_t i, T* out) {
  const T lo = in[i], hi = in[i + h];
  if constexpr (!kBackward) {
    out[i] = lo * c[i] - hi * s[i];
    out[i + h] = hi * c[i + h] + lo * s[i + h];
  } else {
    out[i] = lo * c[i] + hi * s[i + h];
    out[i + h] = hi * c[i + h] - lo * s[i];
  }
}

// cos, sin: [max_pos, head_dim] T, row-major. head_dim even and >= 2; theta > 0.
template <class T>
void rope_table_cpu(int64_t max_pos, int64_t head_dim, double theta, T* cos, T* sin);

// x, y: [tokens, heads, head_dim] T, row-major (y may alias x); positions: [tokens] int32 in
// [0, max_pos) (std::out_of_range otherwise, before anything is written); cos, sin:
// [max_pos, head_dim] from rope_table_cpu.
template <class T>
void rope_fwd_cpu(const T* x, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, const T* cos, const T* sin, int64_t max_pos, T* y);

// dy, dx: [tokens, heads, head_dim] (dx may alias dy); the other arguments as in the forward.
template <class T>
void rope_bwd_cpu(const T* dy, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, const T* cos, const T* sin, int64_t max_pos, T* dx);

}  // namespace lockstep::ops
