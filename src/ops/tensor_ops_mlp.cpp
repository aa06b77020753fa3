// Tensor-level entries of SwiGLU (ops/tensor_ops.h): checks, outputs on the inputs' device,
// dispatch to the kernels of ops/swiglu.h (the MoE router: tensor_ops_softmax.cpp).
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/moe_routing.h"
#include "lockstep/ops/swiglu.h"

namespace lockstep::ops {

using namespace detail;

Tensor swiglu(const Tensor& x_in, const Tensor& p_in) {
  const Tensor x = cpu_operand(x_in, "swiglu", "x");
  check(x.dim() == 2 && x.cols() % 2 == 0,
        fmt::format("swiglu: x {} must be [rows, 2I]", x.describe()));
  const int64_t rows = x.rows(), inter = x.cols() / 2;
  Tensor p;
  if (p_in.defined()) {
    p = cpu_operand(p_in, "swiglu", "p");
    same_dtype(x, p, "swiglu");
    check(p.numel() == rows, fmt::format("swiglu: p {} is not [{}]", p.describe(), rows));
  }
  Tensor y = Tensor::empty(x.dtype(), {rows, inter});
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    swiglu_fwd_cpu<T>(x.ptr<T>(), p.defined() ? p.ptr<T>() : nullptr, rows, inter, y.ptr<T>());
  });
  return y;
}

SwigluGrads swiglu_backward(const Tensor& x_in, const Tensor& p_in, const Tensor& dy_in) {
  const Tensor x = cpu_operand(x_in, "swiglu_backward", "x"),
               dy = cpu_operand(dy_in, "swiglu_backward", "dy");
  const int64_t rows = x.rows(), inter = x.cols() / 2;
  check(dy.numel() == rows * inter,
        fmt::format("swiglu_backward: dy {} is not [{}, {}]", dy.describe(), rows, inter));
  Tensor p = p_in.defined() ? cpu_operand(p_in, "swiglu_backward", "p") : Tensor();
  SwigluGrads g{Tensor::empty(x.dtype(), x.shape()),
                p.defined() ? Tensor::empty(x.dtype(), {rows}) : Tensor()};
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    swiglu_bwd_cpu<T>(x.ptr<T>(), p.defined() ? p.ptr<T>() : nullptr, dy.ptr<T>(), rows, inter,
                      g.dx.ptr<T>(), p.defined() ? g.dp.ptr<T>() : nullptr);
  });
  return g;
}

}  // namespace lockstep::ops
