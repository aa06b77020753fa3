// SwiGLU CPU reference (ops/swiglu.h): the shared row functions on HostLanes<32>, rows in
// parallel.
#include "check.h"
#include "lockstep/ops/swiglu.h"

namespace lockstep::ops {

namespace {
using Lanes = HostLanes<kSwigluLanes>;
}  // namespace

template <class T>
void swiglu_fwd_cpu(const T* x, const T* p, int64_t rows, int64_t inter, T* y) {
  detail::require(rows >= 0 && inter >= 1, "swiglu: x has shape [{}, 2 * {}]; need inter >= 1",
                  rows, inter);
#pragma omp parallel for schedule(static) if (rows * inter * 8 >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r)
    swiglu_row(Lanes{}, x + r * 2 * inter, p ? p + r : nullptr, inter, y + r * inter);
}

template <class T>
void swiglu_bwd_cpu(const T* x, const T* p, const T* dy, int64_t rows, int64_t inter, T* dx,
                    T* dp) {
  detail::require(rows >= 0 && inter >= 1,
                  "swiglu backward: x has shape [{}, 2 * {}]; need inter >= 1", rows, inter);
  detail::require(!p || dp, "swiglu backward: weighted (p given) but dp is null");
#pragma omp parallel for schedule(static) if (rows * inter * 8 >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r)
    swiglu_bwd_row(Lanes{}, x + r * 2 * inter, p ? p + r : nullptr, dy + r * inter, inter,
                   dx + r * 2 * inter, p ? dp + r : nullptr);
}

template void swiglu_fwd_cpu<float>(const float*, const float*, int64_t, int64_t, float*);
template void swiglu_fwd_cpu<double>(const double*, const double*, int64_t, int64_t, double*);
template void swiglu_bwd_cpu<float>(const float*, const float*, const float*, int64_t, int64_t,
                                    float*, float*);
template void swiglu_bwd_cpu<double>(const double*, const double*, const double*, int64_t, int64_t,
                                     double*, double*);

}  // namespace lockstep::ops
