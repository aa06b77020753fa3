// The elementwise helpers of ops/tensor_ops.h (scale, add, bf16 rounding, sigmoid, row scaling) and
// the one row reduction among them (row_dot), written once (LOCKSTEP_HD) for the CPU entries and
// the CUDA kernels. Every step is one rounded operation of T.
//   scale:       y = x * s                      add:        y = a + b
//   round_bf16:  y = widen(bf16_rne(x))         sigmoid:    y = 1 / (1 + exp(-x))
//   scale_rows:  y[t, c] = a[t] * x[t, c]
//   row_dot:     y[t] = sum_c a[t, c] * b[t, c] over kRowDotLanes = 32 lanes (row_exec.h)
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops {

inline constexpr int kRowDotLanes = kWarpLanes;

template <class T>
LOCKSTEP_HD T sigmoid(T x) {
  return T(1) / (T(1) + OpMath<T>::exp(-x));
}

LOCKSTEP_HD inline float round_bf16(float x) { return num::bf16_to_f32(num::f32_to_bf16(x)); }

// One row: a, b: [d]; the dot product, returned to every lane of the executor.
template <class X, class T>
LOCKSTEP_HD T row_dot_row(const X& ex, const T* a, const T* b, int64_t d) {
  return ex.template sum<T>(d, [&](int64_t c) { return a[c] * b[c]; });
}

}  // namespace lockstep::ops
