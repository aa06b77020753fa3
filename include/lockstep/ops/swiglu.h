// SwiGLU of the Qwen3 MLP and MoE experts, optionally weighted per row by the router probability:
// the row functions, written once (LOCKSTEP_HD) and called by the CPU kernels with
// HostLanes<kSwigluLanes> and by the CUDA kernels (the forward's element function swiglu_elem a
// thread per element, the backward a warp per row), and the CPU kernels.
//
// Input row [gate (I) | up (I)], every step one rounded operation of T:
//   silu(g) = g / (1 + exp(-g))
//   y = silu(g) * u                 (unweighted)
//   y = (silu(g) * u) * p[row]      (weighted; for float bit-identical to
//                                    numerics/transcendental.h swiglu_weighted_f32)
// Backward with e = exp(-g), den = 1 + e, sig = 1 / den, silu = g / den,
// dsilu = sig * (1 + g * (1 - sig)), q = dy (unweighted) or dy * p (weighted):
//   du = q * silu;  dg = (q * u) * dsilu;
//   dp[row] = sum_c dy_c * (silu_c * u_c) over kSwigluLanes = 32 lanes (row_exec.h: lane l sums
//   c = l, l + 32, ... ascending from +0, then the fixed pairwise tree).
// Elementwise except dp; rows run in parallel.
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops {

inline constexpr int kSwigluLanes = kWarpLanes;

// One element from its gate g and up u value: silu(g) * u, then times the row's probability
// when the row has one (p: nullptr otherwise).
template <class T>
LOCKSTEP_HD T swiglu_elem(T g, T u, const T* p) {
  const T y = OpMath<T>::silu(g) * u;
  return p ? y * *p : y;
}

// One row: x: [2 * inter] (gate | up); p: this row's probability or nullptr; y: [inter].
template <class X, class T>
LOCKSTEP_HD void swiglu_row(const X& ex, const T* x, const T* p, int64_t inter, T* y) {
  ex.for_each(inter, [&](int64_t c) { y[c] = swiglu_elem(x[c], x[inter + c], p); });
}

// The backward of element c: writes dx[c] (dg) and dx[inter + c] (du); returns silu_c * u_c.
template <class T>
LOCKSTEP_HD T swiglu_bwd_elem(const T* x, const T* dy, bool weighted, T pr, int64_t inter,
                              int64_t c, T* dx) {
  const T g = x[c], u = x[inter + c];
  const T den = T(1) + OpMath<T>::exp(-g);
  const T sig = T(1) / den;
  const T silu = g / den;
  const T dsilu = sig * (T(1) + g * (T(1) - sig));
  const T q = weighted ? dy[c] * pr : dy[c];
  dx[inter + c] = q * silu;
  dx[c] = (q * u) * dsilu;
  return silu * u;
}

// One row of the backward: x: [2 * inter]; p: this row's probability or nullptr; dy: [inter];
// dx: [2 * inter]; *dp written by the executor's leader when p is given. The weighted row writes
// dx inside the dp sum, whose term function the executor calls exactly once per column.
template <class X, class T>
LOCKSTEP_HD void swiglu_bwd_row(const X& ex, const T* x, const T* p, const T* dy, int64_t inter,
                                T* dx, T* dp) {
  if (p) {
    const T pr = *p;
    const T s = ex.template sum<T>(
        inter, [&](int64_t c) { return dy[c] * swiglu_bwd_elem(x, dy, true, pr, inter, c, dx); });
    if (ex.leader()) *dp = s;
  } else {
    ex.for_each(inter, [&](int64_t c) { swiglu_bwd_elem(x, dy, false, T(1), inter, c, dx); });
  }
}

// x: [rows, 2 * inter] T, row-major (gate columns [0, inter), up [inter, 2 * inter));
// p: [rows] or nullptr (unweighted); y: [rows, inter].
template <class T>
void swiglu_fwd_cpu(const T* x, const T* p, int64_t rows, int64_t inter, T* y);

// x, p as in the forward; dy: [rows, inter]; dx: [rows, 2 * inter];
// dp: [rows], written when p != nullptr (must then be non-null), ignored otherwise.
template <class T>
void swiglu_bwd_cpu(const T* x, const T* p, const T* dy, int64_t rows, int64_t inter, T* dx, T* dp);

}  // namespace lockstep::ops
