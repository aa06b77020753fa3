// SwiGLU CPU reference (ops/swiglu.h): elementwise over each row's gate and up halves, rows in
// parallel; the router-probability gradient sums a row in ascending column order.
#include "check.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/swiglu.h"

namespace lockstep::ops {

template <class T>
void swiglu_fwd_cpu(const T* x, const T* p, int64_t rows, int64_t inter, T* y) {
  detail::require(rows >= 0 && inter >= 1, "swiglu: x has shape [{}, 2 * {}]; need inter >= 1",
                  rows, inter);
#pragma omp parallel for schedule(static) if (rows * inter * 8 >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = x + r * 2 * inter;
    const T* u = g + inter;
    T* yr = y + r * inter;
    if (p) {
      const T pr = p[r];
      for (int64_t c = 0; c < inter; ++c) yr[c] = (OpMath<T>::silu(g[c]) * u[c]) * pr;
    } else {
      for (int64_t c = 0; c < inter; ++c) yr[c] = OpMath<T>::silu(g[c]) * u[c];
    }
  }
}

template <class T>
void swiglu_bwd_cpu(const T* x, const T* p, const T* dy, int64_t rows, int64_t inter, T* dx,
                    T* dp) {
  detail::require(rows >= 0 && inter >= 1,
                  "swiglu backward: x has shape [{}, 2 * {}]; need inter >= 1", rows, inter);
  detail::require(!p || dp, "swiglu backward: weighted (p given) but dp is null");
#pragma omp parallel for schedule(static) if (rows * inter * 8 >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = x + r * 2 * inter;
    const T* u = g + inter;
    const T* dyr = dy + r * inter;
    T* dg = dx + r * 2 * inter;
    T* du = dg + inter;
    const T pr = p ? p[r] : T(1);
    T dpr = 0;
    for (int64_t c = 0; c < inter; ++c) {
      const T den = T(1) + OpMath<T>::exp(-g[c]);
      const T sig = T(1) / den;
      const T silu = g[c] / den;
      const T dsilu = sig * (T(1) + g[c] * (T(1) - sig));
      const T q = p ? dyr[c] * pr : dyr[c];
      du[c] = q * silu;
      dg[c] = (q * u[c]) * dsilu;
      if (p) dpr += dyr[c] * (silu * u[c]);
    }
    if (p) dp[r] = dpr;
  }
}

template void swiglu_fwd_cpu<float>(const float*, const float*, int64_t, int64_t, float*);
template void swiglu_fwd_cpu<double>(const double*, const double*, int64_t, int64_t, double*);
template void swiglu_bwd_cpu<float>(const float*, const float*, const float*, int64_t, int64_t,
                                    float*, float*);
template void swiglu_bwd_cpu<double>(const double*, const double*, const double*, int64_t, int64_t,
                                     double*, double*);

}  // namespace lockstep::ops
