// Tensor-level elementwise entries (ops/tensor_ops.h): scale, add, in-place add, bf16 rounding,
// sigmoid, row scaling and the row dot product, dispatching to the expressions of
// ops/elementwise.h on the CPU or the CUDA kernels of elementwise_cuda.h.
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/elementwise.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "elementwise_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

namespace {

// Loops below this many elements run on one thread (the OpenMP `if` changes only the thread
// count, never a value: every element is independent).
constexpr int64_t kElementwiseParallel = int64_t(1) << 17;

}  // namespace

Tensor scale(const Tensor& x_in, double s) {
  const Tensor x = operand(x_in, "scale", "x");
  const Device dev = x.device();
  Tensor y = Tensor::empty(x.dtype(), x.shape(), dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA("scale",
                      scale_cuda(x.ptr<float>(), float(s), x.numel(), y.ptr<float>(), dev));
    return y;
  }
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    const T f = T(s);
    const T* a = x.ptr<T>();
    T* b = y.ptr<T>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kElementwiseParallel)
    for (int64_t i = 0; i < n; ++i) b[i] = a[i] * f;
  });
  return y;
}

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  const Device dev = same_device("add", {{&a_in, "a"}, {&b_in, "b"}});
  const Tensor a = operand(a_in, "add", "a"), b = operand(b_in, "add", "b");
  check(a.numel() == b.numel() && a.dtype() == b.dtype(), [&] {
    return fmt::format("add: {} + {} needs equal element counts and dtypes", a.describe(),
                       b.describe());
  });
  Tensor y = Tensor::empty(a.dtype(), a.shape(), dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA("add",
                      add_cuda(a.ptr<float>(), b.ptr<float>(), a.numel(), y.ptr<float>(), dev));
    return y;
  }
  by_dtype(a, [&](auto t) {
    using T = decltype(t);
    const T* x = a.ptr<T>();
    const T* z = b.ptr<T>();
    T* o = y.ptr<T>();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= kElementwiseParallel)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + z[i];
  });
  return y;
}

void add_inplace(Tensor& a, const Tensor& b_in) {
  const Device dev = same_device("add_inplace", {{&a, "a"}, {&b_in, "b"}});
  inplace_operand(a, "add_inplace", "a");
  const Tensor b = operand(b_in, "add_inplace", "b");
  check(a.numel() == b.numel() && a.dtype() == b.dtype(), [&] {
    return fmt::format("add_inplace: {} += {} needs equal element counts and dtypes", a.describe(),
                       b.describe());
  });
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA("add_inplace",
                      add_cuda(a.ptr<float>(), b.ptr<float>(), a.numel(), a.ptr<float>(), dev));
    return;
  }
  by_dtype(a, [&](auto t) {
    using T = decltype(t);
    T* x = a.ptr<T>();
    const T* y = b.ptr<T>();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= kElementwiseParallel)
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
  });
}

void round_bf16_inplace(Tensor& x) {
  inplace_operand(x, "round_bf16", "x");
  if (x.dtype() != DType::kF32) return;
  const Device dev = x.device();
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA("round_bf16", round_bf16_cuda(x.ptr<float>(), x.numel(), dev));
    return;
  }
  float* p = x.ptr<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= kElementwiseParallel)
  for (int64_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
}

void sigmoid_inplace(Tensor& x) {
  inplace_operand(x, "sigmoid", "x");
  const Device dev = x.device();
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA("sigmoid", sigmoid_cuda(x.ptr<float>(), x.numel(), dev));
    return;
  }
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    T* p = x.ptr<T>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n * 8 >= kElementwiseParallel)
    for (int64_t i = 0; i < n; ++i) p[i] = sigmoid(p[i]);
  });
}

Tensor scale_rows(const Tensor& x_in, const Tensor& a_in) {
  const char* op = "scale_rows";
  const Device dev = same_device(op, {{&x_in, "x"}, {&a_in, "a"}});
  const Tensor x = operand(x_in, op, "x"), a = operand(a_in, op, "a");
  same_dtype(x, a, op);
  check(x.dim() == 2 && a.numel() == x.rows(), [&] {
    return fmt::format("{}: x {} must be [T, d] and a {} [T]", op, x.describe(), a.describe());
  });
  const int64_t rows = x.rows(), d = x.cols();
  Tensor y = Tensor::empty(x.dtype(), x.shape(), dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(
        op, scale_rows_cuda(x.ptr<float>(), a.ptr<float>(), rows, d, y.ptr<float>(), dev));
    return y;
  }
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    const T* xp = x.ptr<T>();
    const T* ap = a.ptr<T>();
    T* yp = y.ptr<T>();
#pragma omp parallel for schedule(static) if (rows * d >= kElementwiseParallel)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) yp[r * d + c] = ap[r] * xp[r * d + c];
  });
  return y;
}

Tensor row_dot(const Tensor& a_in, const Tensor& b_in) {
  const char* op = "row_dot";
  const Device dev = same_device(op, {{&a_in, "a"}, {&b_in, "b"}});
  const Tensor a = operand(a_in, op, "a"), b = operand(b_in, op, "b");
  same_dtype(a, b, op);
  check(a.dim() == 2 && b.shape() == a.shape(), [&] {
    return fmt::format("{}: a {} and b {} must be the same [T, d]", op, a.describe(), b.describe());
  });
  const int64_t rows = a.rows(), d = a.cols();
  Tensor y = Tensor::empty(a.dtype(), {rows}, dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op,
                      row_dot_cuda(a.ptr<float>(), b.ptr<float>(), rows, d, y.ptr<float>(), dev));
    return y;
  }
  by_dtype(a, [&](auto t) {
    using T = decltype(t);
    const T* ap = a.ptr<T>();
    const T* bp = b.ptr<T>();
    T* yp = y.ptr<T>();
#pragma omp parallel for schedule(static) if (rows * d >= kElementwiseParallel)
    for (int64_t r = 0; r < rows; ++r)
      yp[r] = row_dot_row(HostLanes<kRowDotLanes>{}, ap + r * d, bp + r * d, d);
  });
  return y;
}

}  // namespace lockstep::ops
