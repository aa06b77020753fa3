// Tensor-level elementwise entries (ops/tensor_ops.h): scale, add, in-place add, bf16 rounding.
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/numerics/hd.h"

namespace lockstep::ops {

using namespace detail;

Tensor scale(const Tensor& x_in, double s) {
  const Tensor x = cpu_operand(x_in, "scale", "x");
  Tensor y = Tensor::empty(x.dtype(), x.shape());
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    const T f = T(s);
    const T* a = x.ptr<T>();
    T* b = y.ptr<T>();
    for (int64_t i = 0; i < x.numel(); ++i) b[i] = a[i] * f;
  });
  return y;
}

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = cpu_operand(a_in, "add", "a"), b = cpu_operand(b_in, "add", "b");
  check(a.numel() == b.numel() && a.dtype() == b.dtype(),
        fmt::format("add: {} + {} needs equal element counts and dtypes", a.describe(),
                    b.describe()));
  Tensor y = Tensor::empty(a.dtype(), a.shape());
  by_dtype(a, [&](auto t) {
    using T = decltype(t);
    const T* x = a.ptr<T>();
    const T* z = b.ptr<T>();
    T* o = y.ptr<T>();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 17))
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + z[i];
  });
  return y;
}

void add_inplace(Tensor& a, const Tensor& b_in) {
  require_cpu(a, "add_inplace", "a");
  const Tensor b = cpu_operand(b_in, "add_inplace", "b");
  check(a.is_contiguous() && a.numel() == b.numel() && a.dtype() == b.dtype(),
        fmt::format("add_inplace: {} += {} needs equal element counts and dtypes", a.describe(),
                    b.describe()));
  by_dtype(a, [&](auto t) {
    using T = decltype(t);
    T* x = a.ptr<T>();
    const T* y = b.ptr<T>();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 17))
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
  });
}

void round_bf16_inplace(Tensor& x) {
  require_cpu(x, "round_bf16", "x");
  if (x.dtype() != DType::kF32) return;
  check(x.is_contiguous(), "round_bf16: x must be contiguous");
  float* p = x.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = num::bf16_to_f32(num::f32_to_bf16(p[i]));
}

}  // namespace lockstep::ops
