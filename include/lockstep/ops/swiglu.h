// SwiGLU of the Qwen3 MLP and MoE experts, optionally weighted per row by the router probability:
// CPU reference forward and backward on raw row-major arrays of T in {float, double}.
//
// Input row [gate (I) | up (I)], every step one rounded operation of T:
//   silu(g) = g / (1 + exp(-g))
//   y = silu(g) * u                 (unweighted)
//   y = (silu(g) * u) * p[row]      (weighted; for float bit-identical to
//                                    numerics/transcendental.h swiglu_weighted_f32)
// Backward with e = exp(-g), den = 1 + e, sig = 1 / den, silu = g / den,
// dsilu = sig * (1 + g * (1 - sig)), q = dy (unweighted) or dy * p (weighted):
//   du = q * silu;  dg = (q * u) * dsilu;  dp[row] = sum_c dy_c * (silu_c * u_c), c ascending.
// Elementwise except dp, whose sum runs in ascending column order; rows run in parallel.
#pragma once

#include <cstdint>

namespace lockstep::ops {

// x: [rows, 2 * inter] T, row-major (gate columns [0, inter), up [inter, 2 * inter));
// p: [rows] or nullptr (unweighted); y: [rows, inter].
template <class T>
void swiglu_fwd_cpu(const T* x, const T* p, int64_t rows, int64_t inter, T* y);

// x, p as in the forward; dy: [rows, inter]; dx: [rows, 2 * inter];
// dp: [rows], written when p != nullptr (must then be non-null), ignored otherwise.
template <class T>
void swiglu_bwd_cpu(const T* x, const T* p, const T* dy, int64_t rows, int64_t inter, T* dx, T* dp);

}  // namespace lockstep::ops
