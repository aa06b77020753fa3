// RMSNorm CPU reference (ops/rmsnorm.h): the shared row functions on HostLanes<32>, rows in
// parallel; the weight gradient as (row chunk, column block) partials in parallel, then combined
// per column in chunk order.
#include <algorithm>
#include <vector>

#include "check.h"
#include "lockstep/ops/rmsnorm.h"

namespace lockstep::ops {

namespace {
// Columns per task of the dw partials (any constant: a column's sums never cross tasks).
constexpr int64_t kDwColumnBlock = 64;
using Lanes = HostLanes<kRmsNormLanes>;
}  // namespace

template <class T>
void rmsnorm_fwd_cpu(const T* x, const T* w, int64_t rows, int64_t d, T eps, T* y, T* rstd) {
  detail::require(rows >= 0 && d >= 1, "rmsnorm: x has shape [{}, {}]; need rows >= 0, d >= 1",
                  rows, d);
#pragma omp parallel for schedule(static) if (rows * d >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r)
    rmsnorm_row(Lanes{}, x + r * d, w, d, eps, y + r * d, rstd + r);
}

template <class T>
void rmsnorm_bwd_cpu(const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t d,
                     T* dx, T* dw) {
  detail::require(rows >= 0 && d >= 1, "rmsnorm backward: x has shape [{}, {}]; need d >= 1", rows,
                  d);
  const bool parallel = rows * d >= detail::kParallelMinWork;
  const int64_t chunks = rmsnorm_dw_chunks(rows);
  const int64_t blocks = (d + kDwColumnBlock - 1) / kDwColumnBlock;
  std::vector<T> partial(size_t(chunks * d));
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int64_t k = 0; k < chunks; ++k)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kDwColumnBlock, c1 = std::min(d, c0 + kDwColumnBlock);
      const int64_t r0 = k * kRmsNormDwChunk, r1 = std::min(rows, r0 + kRmsNormDwChunk);
      rmsnorm_dw_partial(dy, x, rstd, d, r0, r1, c0, c1, partial.data() + k * d + c0);
    }
#pragma omp parallel for schedule(static) if (chunks * d >= detail::kParallelMinWork)
  for (int64_t c = 0; c < d; ++c) dw[c] = rmsnorm_dw_combine(partial.data(), chunks, d, c);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r)
    rmsnorm_bwd_row(Lanes{}, dy + r * d, x + r * d, w, rstd[r], d, dx + r * d);
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
