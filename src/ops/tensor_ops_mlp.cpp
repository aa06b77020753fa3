// Tensor-level entries of the MoE router (ops/tensor_ops.h): checks, outputs on the inputs'
// device, dispatch to the kernels of ops/moe_routing.h. (SwiGLU: tensor_ops_swiglu.cpp.)
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/moe_routing.h"

namespace lockstep::ops {

using namespace detail;

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
