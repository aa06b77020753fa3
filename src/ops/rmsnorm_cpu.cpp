// RMSNorm CPU reference (ops/rmsnorm.h): rows in parallel, sums in ascending column order; the
// weight gradient by column blocks, each summing the rows in ascending order.
#include <algorithm>

#include "check.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/rmsnorm.h"

namespace lockstep::ops {

namespace {
// Columns per task of the dw reduction (a constant: the blocks never depend on the thread count).
constexpr int64_t kDwColumnBlock = 64;
}  // namespace

template <class T>
void rmsnorm_fwd_cpu(const T* x, const T* w, int64_t rows, int64_t d, T eps, T* y, T* rstd) {
  detail::require(rows >= 0 && d >= 1, "rmsnorm: x has shape [{}, {}]; need rows >= 0, d >= 1",
                  rows, d);
  const T d_count = T(d);
#pragma omp parallel for schedule(static) if (rows * d >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    T ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += xr[c] * xr[c];
    const T rs = T(1) / OpMath<T>::sqrt(ss / d_count + eps);
    rstd[r] = rs;
    for (int64_t c = 0; c < d; ++c) yr[c] = (xr[c] * rs) * w[c];
  }
}

template <class T>
void rmsnorm_bwd_cpu(const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t d,
                     T* dx, T* dw) {
  detail::require(rows >= 0 && d >= 1, "rmsnorm backward: x has shape [{}, {}]; need d >= 1", rows,
                  d);
  const bool parallel = rows * d >= detail::kParallelMinWork;
  // dw[c] = sum over rows r ascending of dy[r,c] * (x[r,c] * rstd[r]); blocks of columns run in
  // parallel, the inner loop over the block's columns vectorises without reordering any sum.
  const int64_t blocks = (d + kDwColumnBlock - 1) / kDwColumnBlock;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kDwColumnBlock, c1 = std::min(d, c0 + kDwColumnBlock);
    for (int64_t c = c0; c < c1; ++c) dw[c] = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T rs = rstd[r];
      const T* xr = x + r * d;
      const T* dyr = dy + r * d;
      for (int64_t c = c0; c < c1; ++c) dw[c] += dyr[c] * (xr[c] * rs);
    }
  }
  const T d_count = T(d);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const T rs = rstd[r];
    const T* xr = x + r * d;
    const T* dyr = dy + r * d;
    T* dxr = dx + r * d;
    T dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += (dyr[c] * w[c]) * (xr[c] * rs);
    const T mean = dot / d_count;
    for (int64_t c = 0; c < d; ++c) dxr[c] = rs * ((dyr[c] * w[c]) - (xr[c] * rs) * mean);
  }
}

template void rmsnorm_fwd_cpu<float>(const float*, const float*, int64_t, int64_t, float, float*,
                                     float*);
template void rmsnorm_fwd_cpu<double>(const double*, const double*, int64_t, int64_t, double,
                                      double*, double*);
template void rmsnorm_bwd_cpu<float>(const float*, const float*, const float*, const float*,
                                     int64_t, int64_t, float*, float*);
template void rmsnorm_bwd_cpu<double>(const double*, const double*, const double*, const double*,
                                      int64_t, int64_t, double*, double*);

}  // namespace lockstep::ops
