// RMSNorm as Qwen3 computes it (hidden states [T, 2048], and q_norm / k_norm over head_dim as
// [T * H, 128]): the row functions, written once (LOCKSTEP_HD) and called by the CPU kernels with
// HostLanes<kRmsNormLanes> and by the CUDA kernels with a warp per row (the forward of a few rows:
// one warp's sum, then the whole block writing y), and the CPU kernels.
//
// Forward, per row r (every step one rounded operation of T):
//   ss = sum_c x[r,c]^2, over kRmsNormLanes = 32 lanes (row_exec.h: lane l sums c = l, l + 32, ...
//        ascending from +0, then the fixed pairwise tree)
//   rstd[r] = 1 / sqrt(ss / d + eps)          (one division by d, add eps, sqrt, one division)
//   y[r,c] = (x[r,c] * rstd[r]) * w[c]
// Hugging Face multiplies by torch.rsqrt; 1 / sqrt is within 1 ulp of it.
// Backward: xhat = x * rstd, g = dy * w, mean = (sum_c g[c] * xhat[c], 32 lanes) / d,
//   dx[r,c] = rstd[r] * (g[c] - xhat[c] * mean).
// Weight gradient dw[c] = sum_r dy[r,c] * xhat[r,c] in a fixed chunked order: rows are cut into
// chunks of kRmsNormDwChunk = 256 (a constant, never the thread or block count); a chunk's partial
// sums its rows in ascending order from +0; dw[c] sums the chunk partials in ascending chunk order
// from +0. Chunks run in parallel on both backends.
// Every y, rstd and dx value depends only on its own row, dw[c] only on its own column.
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops {

inline constexpr int kRmsNormLanes = kWarpLanes;
inline constexpr int64_t kRmsNormDwChunk = 256;

// rstd of one row x: [d].
template <class X, class T>
LOCKSTEP_HD T rmsnorm_rstd(const X& ex, const T* x, int64_t d, T eps) {
  const T ss = ex.template sum<T>(d, [&](int64_t c) { return x[c] * x[c]; });
  return T(1) / OpMath<T>::sqrt(ss / T(d) + eps);
}

// One output element from its input x, the row's rstd and the weight w.
template <class T>
LOCKSTEP_HD T rmsnorm_elem(T x, T rs, T w) {
  return (x * rs) * w;
}

// One row: x, y: [d] (y may alias x); w: [d]; *rstd written by the executor's leader. Y is T, or
// num::Bf16Out for a row stored as bf16 (each element's value of T rounded by f32_to_bf16).
template <class X, class T, class Y>
LOCKSTEP_HD void rmsnorm_row(const X& ex, const T* x, const T* w, int64_t d, T eps, Y* y, T* rstd) {
  const T rs = rmsnorm_rstd(ex, x, d, eps);
  if (ex.leader()) *rstd = rs;
  ex.for_each(d, [&](int64_t c) { y[c] = rmsnorm_elem(x[c], rs, w[c]); });
}

// One row of the input gradient: dy, x, w, dx: [d] (dx must not alias dy or x); rs = rstd[r].
template <class X, class T>
LOCKSTEP_HD void rmsnorm_bwd_row(const X& ex, const T* dy, const T* x, const T* w, T rs, int64_t d,
                                 T* dx) {
  const T dot = ex.template sum<T>(d, [&](int64_t c) { return (dy[c] * w[c]) * (x[c] * rs); });
  const T mean = dot / T(d);
  ex.for_each(d, [&](int64_t c) { dx[c] = rs * ((dy[c] * w[c]) - (x[c] * rs) * mean); });
}

// Chunk partials of the weight gradient for columns [c0, c1): out[c - c0] = sum over rows
// r0 .. r1 - 1 ascending (from +0) of dy[r,c] * (x[r,c] * rstd[r]). dy, x: [rows, d].
template <class T>
LOCKSTEP_HD void rmsnorm_dw_partial(const T* dy, const T* x, const T* rstd, int64_t d, int64_t r0,
                                    int64_t r1, int64_t c0, int64_t c1, T* out) {
  for (int64_t c = c0; c < c1; ++c) out[c - c0] = T(0);
  for (int64_t r = r0; r < r1; ++r) {
    const T rs = rstd[r];
    const T* dyr = dy + r * d;
    const T* xr = x + r * d;
    for (int64_t c = c0; c < c1; ++c) out[c - c0] = out[c - c0] + dyr[c] * (xr[c] * rs);
  }
}

// dw[c] from the partials [chunks, d]: +0, then the chunks in ascending order.
template <class T>
LOCKSTEP_HD T rmsnorm_dw_combine(const T* partial, int64_t chunks, int64_t d, int64_t c) {
  T acc = T(0);
  for (int64_t k = 0; k < chunks; ++k) acc = acc + partial[k * d + c];
  return acc;
}

inline int64_t rmsnorm_dw_chunks(int64_t rows) {
  return (rows + kRmsNormDwChunk - 1) / kRmsNormDwChunk;
}

// x: [rows, d] T, row-major; w: [d]; y: [rows, d] (may alias x); rstd: [rows], saved for backward.
template <class T>
void rmsnorm_fwd_cpu(const T* x, const T* w, int64_t rows, int64_t d, T eps, T* y, T* rstd);

// dy, x: [rows, d]; w: [d]; rstd: [rows] from the forward; dx: [rows, d] (must not alias dy or x);
// dw: [d], overwritten with the sum over all rows (the chunked order above).
template <class T>
void rmsnorm_bwd_cpu(const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t d,
                     T* dx, T* dw);

}  // namespace lockstep::ops
