// The MoE block (nn/moe.h), written with the ops of ops/moe.h and ops/tensor_ops.h only, so it
// runs wherever its tensors live. Rows of the grouped buffer: expert e owns
// [offsets[e], offsets[e+1]), its tokens in ascending order, then zero padding rows up to a
// multiple of the recipe's group row multiple (training only). Every combine sums a token's slots
// in slot order from +0, so no value depends on the batch or the device.
#include "lockstep/nn/moe.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

namespace lockstep::nn {

MoeBlock::MoeBlock(Linear router, GroupedLinear fc1, GroupedLinear fc2, MoeOptions opt,
                   std::optional<SharedExpert> shared)
    : router_(std::move(router)),
      fc1_(std::move(fc1)),
      fc2_(std::move(fc2)),
      opt_(opt),
      shared_(std::move(shared)) {}

Tensor MoeBlock::forward(const Tensor& xn, bool save, const Tensor& replay, Tensor* expert_ids) {
  const int64_t E = fc1_.groups(), k = opt_.top_k;
  const Tensor logits = router_.forward(xn, save);
  if (replay.defined() && !(replay.dim() == 2 && replay.size(1) == k))
    throw std::invalid_argument(
        fmt::format("moe block: routing replay expert ids {} are not [tokens, top_k = {}]",
                    replay.describe(), k));
  ops::RouterOut route = replay.defined() ? ops::router_replay(logits, replay, opt_.norm_topk_prob)
                                          : ops::router_topk(logits, k, opt_.norm_topk_prob);
  if (expert_ids) *expert_ids = route.expert_ids;
  // Each expert's rows are padded to the wgrad GEMMs' multiple when training.
  const int64_t P =
      save ? std::lcm(group_row_multiple(fc1_.spec()), group_row_multiple(fc2_.spec())) : 1;
  ops::MoeRoute grouped = ops::moe_route(route.expert_ids, E, P);
  const Tensor prob = ops::moe_scatter_slots(route.weights, grouped);
  const Tensor xp = ops::moe_gather(xn, grouped);
  const Tensor fc1 = fc1_.forward(xp, grouped.offsets, save);
  const Tensor h = ops::swiglu(fc1, prob, fc2_.producer_dtype(save));
  const Tensor o = fc2_.forward(h, grouped.offsets, save);
  Tensor out = ops::moe_combine(o, grouped);
  if (shared_) {
    const Tensor s1 = shared_->gate_up.forward(xn, save);
    const Tensor sh =
        shared_->down.forward(ops::swiglu(s1, Tensor(), shared_->down.producer_dtype(save)), save);
    Tensor g = shared_->gate.forward(xn, save);  // [T, 1]
    ops::sigmoid_inplace(g);
    ops::add_inplace(out, ops::scale_rows(sh, g));
    if (save) {
      sh_fc1_ = s1;
      sh_out_ = sh;
      sh_gate_ = g;
    }
  }
  if (save) {
    route_ = std::move(route);
    grouped_ = std::move(grouped);
    prob_row_ = prob;
    fc1_out_ = fc1;
    has_saved_ = true;
  }
  return out;
}

std::optional<DType> MoeBlock::producer_dtype(bool save) const {
  const std::optional<DType> d = router_.producer_dtype(save);
  const bool all = d && fc1_.producer_dtype(save) == d &&
                   (!shared_ || (shared_->gate_up.producer_dtype(save) == d &&
                                 shared_->gate.producer_dtype(save) == d));
  return all ? d : std::nullopt;
}

Tensor MoeBlock::backward(const Tensor& dout) {
  if (!has_saved_) throw std::logic_error("moe block: backward without a saved forward");
  const Tensor d_o = ops::moe_scatter(dout, grouped_);
  const Tensor dh = fc2_.backward(d_o);
  const ops::SwigluGrads sg = ops::swiglu_backward(fc1_out_, prob_row_, dh);
  const Tensor dxp = fc1_.backward(sg.dx);
  Tensor dx = ops::moe_combine(dxp, grouped_);
  const Tensor dweights = ops::moe_gather_slots(sg.dp, grouped_);
  const Tensor dlogits = ops::router_topk_backward(route_, dweights, opt_.norm_topk_prob);
  ops::add_inplace(dx, router_.backward(dlogits));
  if (shared_) {
    // out += g * sh: d sh = g * dout; dg = sum_c dout * sh; dz = dg * (g * (1 - g)).
    const Tensor dz = ops::sigmoid_backward(ops::row_dot(dout, sh_out_), sh_gate_);
    const Tensor dsh = ops::scale_rows(dout, sh_gate_);
    const Tensor ds1 = ops::swiglu_backward(sh_fc1_, Tensor(), shared_->down.backward(dsh)).dx;
    ops::add_inplace(dx, shared_->gate_up.backward(ds1));
    ops::add_inplace(dx, shared_->gate.backward(dz.view({dz.numel(), 1})));
  }
  clear_saved();
  return dx;
}

void MoeBlock::weights_changed() {
  router_.weights_changed();
  fc1_.weights_changed();
  fc2_.weights_changed();
  if (shared_) {
    shared_->gate_up.weights_changed();
    shared_->down.weights_changed();
    shared_->gate.weights_changed();
  }
}

void MoeBlock::set_grad_seed(uint64_t seed) {
  router_.set_grad_seed(seed);
  fc1_.set_grad_seed(seed);
  fc2_.set_grad_seed(seed);
  if (shared_) {
    shared_->gate_up.set_grad_seed(seed);
    shared_->down.set_grad_seed(seed);
    shared_->gate.set_grad_seed(seed);
  }
}

void MoeBlock::set_gemm_order(GemmOrder order) {
  router_.set_gemm_order(order);
  fc1_.set_gemm_order(order);
  fc2_.set_gemm_order(order);
  if (shared_) {
    shared_->gate_up.set_gemm_order(order);
    shared_->down.set_gemm_order(order);
    shared_->gate.set_gemm_order(order);
  }
}

size_t MoeBlock::saved_bytes() const {
  size_t n = router_.saved_bytes() + fc1_.saved_bytes() + fc2_.saved_bytes();
  for (const Tensor* t :
       {&prob_row_, &fc1_out_, &sh_fc1_, &sh_out_, &sh_gate_, &route_.probs, &route_.expert_ids,
        &route_.weights, &grouped_.offsets, &grouped_.src_rows, &grouped_.slot_row})
    if (t->defined()) n += t->nbytes();
  if (shared_)
    n += shared_->gate_up.saved_bytes() + shared_->down.saved_bytes() + shared_->gate.saved_bytes();
  return n;
}

void MoeBlock::clear_saved() {
  router_.clear_saved();
  fc1_.clear_saved();
  fc2_.clear_saved();
  if (shared_) {
    shared_->gate_up.clear_saved();
    shared_->down.clear_saved();
    shared_->gate.clear_saved();
  }
  route_ = ops::RouterOut{};
  grouped_ = ops::MoeRoute{};
  prob_row_ = fc1_out_ = sh_fc1_ = sh_out_ = sh_gate_ = Tensor();
  has_saved_ = false;
}

}  // namespace lockstep::nn
