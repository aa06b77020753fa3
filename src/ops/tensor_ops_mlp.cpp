// Tensor-level entries of SwiGLU and the MoE router (ops/tensor_ops.h): checks, outputs on the
// inputs' device, dispatch to the kernels of ops/swiglu.h and ops/moe_routing.h.
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

RouterOut router_topk(const Tensor& logits_in, int64_t k, bool renormalize) {
  const Tensor logits = cpu_operand(logits_in, "router_topk", "logits");
  check(logits.dim() == 2, fmt::format("router_topk: logits {} must be 2-D", logits.describe()));
  const int64_t tokens = logits.rows(), experts = logits.cols();
  RouterOut r{Tensor::empty(logits.dtype(), {tokens, experts}),
              Tensor::empty(DType::kI32, {tokens, k}), Tensor::empty(logits.dtype(), {tokens, k})};
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    moe_router_topk_fwd_cpu<T>(logits.ptr<T>(), tokens, experts, k, renormalize, r.probs.ptr<T>(),
                               r.expert_ids.ptr<int32_t>(), r.weights.ptr<T>());
  });
  return r;
}

Tensor router_topk_backward(const RouterOut& fwd, const Tensor& dweights_in, bool renormalize) {
  const Tensor dw = cpu_operand(dweights_in, "router_topk_backward", "dweights");
  const int64_t tokens = fwd.probs.rows(), experts = fwd.probs.cols(), k = fwd.expert_ids.cols();
  check(dw.numel() == tokens * k,
        fmt::format("router_topk_backward: dweights {} is not [{}, {}]", dw.describe(), tokens, k));
  Tensor dl = Tensor::empty(fwd.probs.dtype(), {tokens, experts});
  by_dtype(dw, [&](auto t) {
    using T = decltype(t);
    moe_router_topk_bwd_cpu<T>(fwd.probs.ptr<T>(), fwd.expert_ids.ptr<int32_t>(), dw.ptr<T>(),
                               tokens, experts, k, renormalize, dl.ptr<T>());
  });
  return dl;
}

}  // namespace lockstep::ops
