// Tensor-level entries of SwiGLU (ops/tensor_ops.h): checks, outputs on the inputs' device,
// dispatch to the CPU kernels of ops/swiglu.h or the CUDA kernels of swiglu_cuda.h.
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/swiglu.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "swiglu_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

Tensor swiglu(const Tensor& x_in, const Tensor& p_in, std::optional<DType> out) {
  const char* op = "swiglu";
  const Device dev = same_device(op, {{&x_in, "x"}, {&p_in, "p"}});
  const Tensor x = operand(x_in, op, "x");
  check(x.dim() == 2 && x.cols() % 2 == 0 && x.cols() >= 2,
        [&] { return fmt::format("swiglu: x {} must be [rows, 2I] with I >= 1", x.describe()); });
  const DType yt = output_dtype(x, out, op);
  const int64_t rows = x.rows(), inter = x.cols() / 2;
  Tensor p;
  if (p_in.defined()) {
    p = operand(p_in, op, "p");
    same_dtype(x, p, op);
    check(p.numel() == rows,
          [&] { return fmt::format("swiglu: p {} is not [{}]", p.describe(), rows); });
  }
  if (dev.is_cuda()) {
    Tensor y = Tensor::empty(yt, {rows, inter}, dev);
    [[maybe_unused]] const bool bf16 = yt == DType::kBF16;  // read by the CUDA call only
    LOCKSTEP_OPS_CUDA(op, swiglu_fwd_cuda(x.ptr<float>(), p.defined() ? p.ptr<float>() : nullptr,
                                          rows, inter, bf16 ? nullptr : y.ptr<float>(),
                                          bf16 ? static_cast<uint16_t*>(y.raw()) : nullptr, dev));
    return y;
  }
  Tensor y = Tensor::empty(x.dtype(), {rows, inter}, dev);
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    swiglu_fwd_cpu<T>(x.ptr<T>(), p.defined() ? p.ptr<T>() : nullptr, rows, inter, y.ptr<T>());
  });
  return yt == y.dtype() ? y : cast(y, yt);
}

SwigluGrads swiglu_backward(const Tensor& x_in, const Tensor& p_in, const Tensor& dy_in) {
  const char* op = "swiglu_backward";
  const Device dev = same_device(op, {{&x_in, "x"}, {&p_in, "p"}, {&dy_in, "dy"}});
  const Tensor x = operand(x_in, op, "x"), dy = operand(dy_in, op, "dy");
  check(x.dim() == 2 && x.cols() % 2 == 0 && x.cols() >= 2,
        [&] { return fmt::format("{}: x {} must be [rows, 2I] with I >= 1", op, x.describe()); });
  same_dtype(x, dy, op);
  const int64_t rows = x.rows(), inter = x.cols() / 2;
  check(dy.numel() == rows * inter,
        [&] { return fmt::format("{}: dy {} is not [{}, {}]", op, dy.describe(), rows, inter); });
  Tensor p;
  if (p_in.defined()) {
    p = operand(p_in, op, "p");
    same_dtype(x, p, op);
    check(p.numel() == rows,
          [&] { return fmt::format("{}: p {} is not [{}]", op, p.describe(), rows); });
  }
  SwigluGrads g{Tensor::empty(x.dtype(), x.shape(), dev),
                p.defined() ? Tensor::empty(x.dtype(), {rows}, dev) : Tensor()};
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, swiglu_bwd_cuda(x.ptr<float>(), p.defined() ? p.ptr<float>() : nullptr,
                                          dy.ptr<float>(), rows, inter, g.dx.ptr<float>(),
                                          p.defined() ? g.dp.ptr<float>() : nullptr, dev));
    return g;
  }
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    swiglu_bwd_cpu<T>(x.ptr<T>(), p.defined() ? p.ptr<T>() : nullptr, dy.ptr<T>(), rows, inter,
                      g.dx.ptr<T>(), p.defined() ? g.dp.ptr<T>() : nullptr);
  });
  return g;
}

}  // namespace lockstep::ops
