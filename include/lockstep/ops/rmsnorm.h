// RMSNorm as Qwen3 computes it (hidden states, and q_norm / k_norm over head_dim): CPU reference
// kernels, forward and backward, on raw row-major arrays of T in {float, double}.
//
// Forward, per row r (every step one rounded operation of T):
//   ss = sum_c x[r,c]^2   (acc = 0, then acc += x*x for c ascending)
//   rstd[r] = 1 / sqrt(ss / d + eps)          (one division by d, add eps, sqrt, one division)
//   y[r,c] = (x[r,c] * rstd[r]) * w[c]
// Hugging Face multiplies by torch.rsqrt; 1 / sqrt is within 1 ulp of it.
// Backward: xhat = x * rstd, g = dy * w, mean = (sum_c g[c] * xhat[c], c ascending) / d,
//   dx[r,c] = rstd[r] * (g[c] - xhat[c] * mean);  dw[c] = sum_r dy[r,c] * xhat[r,c], r ascending.
// Every value depends only on its own row (dw: on its own column over the rows in ascending
// order), never on the thread count: rows run in parallel for y and dx, column blocks for dw.
#pragma once

#include <cstdint>

namespace lockstep::ops {

// x: [rows, d] T, row-major; w: [d]; y: [rows, d] (may alias x); rstd: [rows], saved for backward.
template <class T>
void rmsnorm_fwd_cpu(const T* x, const T* w, int64_t rows, int64_t d, T eps, T* y, T* rstd);

// dy, x: [rows, d]; w: [d]; rstd: [rows] from the forward; dx: [rows, d] (must not alias dy or x);
// dw: [d], overwritten with the sum over all rows.
template <class T>
void rmsnorm_bwd_cpu(const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t d,
                     T* dx, T* dw);

}  // namespace lockstep::ops
