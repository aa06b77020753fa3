// Linear and NormLinear (nn/linear.h). Forward: y = Q_fprop(x) Q_fprop(W)^T. Backward by mode
// (straight-through: the quantizers are identity for the gradient):
//   quantized:      dX = Q_dgrad(dY) Q_dgrad(W)      (W's columnwise copy)
//                   dW = Q_wgrad(dY)^T Q_wgrad(X)    (columnwise copies of dY and the saved X)
//   high_precision: the same GEMMs on bf16 dY, bf16 W and the saved bf16 X
//   dequantized:    the same GEMMs on bf16 dY and the fprop's quantized X and W dequantized
// Dimensions are zero-padded where a format needs it (K to the block multiple, tokens for wgrad).
#include "lockstep/nn/linear.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "lockstep/ops/layout.h"
#include "lockstep/ops/tensor_ops.h"
#include "module_operands.h"

namespace lockstep::nn {
namespace {

const GemmSpec& gemm_of(const LinearSpec& s, Gemm g) { return s[g]; }

GemmConfig colwise_w(GemmOrder order) {
  GemmConfig c;
  c.w_copy = Copy::kColwise;
  c.order = order;
  return c;
}
GemmConfig colwise_both(GemmOrder order) {
  GemmConfig c;
  c.a_copy = c.w_copy = Copy::kColwise;
  c.order = order;
  return c;
}

// Tokens the wgrad GEMM reduces over must be a multiple of this (zero rows are added).
int64_t token_multiple(const LinearSpec& s) {
  return std::lcm(k_multiple(gemm_of(s, Gemm::kWgrad)), kLinearKMultiple);
}

}  // namespace

LinearDims LinearDims::of(int64_t out, int64_t in, const LinearSpec& spec) {
  LinearDims d;
  d.out = out;
  d.in = in;
  d.in_padded = round_up(in, std::lcm(k_multiple(spec[Gemm::kFprop]), kLinearKMultiple));
  int64_t om = kLinearKMultiple;
  if (spec.backward_mode == BackwardMode::kQuantized)
    om = std::lcm(om, k_multiple(spec[Gemm::kDgrad]));
  if (spec[Gemm::kFprop].b.block2d) om = std::lcm(om, int64_t(16));
  d.out_padded = round_up(out, om);
  return d;
}

Operand prepare_fprop_weight(const Tensor& w, const LinearSpec& spec, std::string_view name,
                             bool training) {
  const LinearDims d = LinearDims::of(w.rows(), w.cols(), spec);
  const Tensor wp = ops::pad2d(w, d.out_padded, d.in_padded);
  OperandRequest req;
  req.colwise = detail::fprop_weight_with_colwise(spec, training);
  return make_operand(wp, spec[Gemm::kFprop].b, req, name);
}

Linear::Linear(std::string name, Tensor weight, Tensor grad, LinearSpec spec, uint32_t rng_stream)
    : name_(std::move(name)),
      spec_(spec),
      dims_(LinearDims::of(weight.rows(), weight.cols(), spec)),
      weight_(std::move(weight)),
      grad_(std::move(grad)),
      stream_(rng_stream) {}

Linear Linear::from_operand(std::string name, Operand fprop_weight, int64_t out, int64_t in,
                            LinearSpec spec) {
  Linear l;
  l.name_ = std::move(name);
  l.spec_ = spec;
  l.dims_ = LinearDims::of(out, in, spec);
  l.inference_ = true;
  l.w_fprop_ = std::move(fprop_weight);
  if (!l.w_fprop_.packed.defined()) prepack_weight(l.w_fprop_, 1);
  return l;
}

void Linear::weights_changed() {
  if (inference_) return;
  w_fprop_ = Operand{};
  w_dgrad_ = Operand{};
}

const Operand& Linear::fprop_weight() {
  if (!w_fprop_.defined()) {
    w_fprop_ = prepare_fprop_weight(weight_, spec_, name_ + ".weight", true);
    prepack_weight(w_fprop_, 1);
  }
  return w_fprop_;
}

const Operand& Linear::dgrad_weight() {
  if (!w_dgrad_.defined())
    w_dgrad_ = detail::dgrad_weight_operand(fprop_weight(),
                                            ops::pad2d(weight_, dims_.out_padded, dims_.in_padded),
                                            spec_, name_ + ".weight", {});
  return w_dgrad_;
}

std::optional<DType> Linear::producer_dtype(bool save) const {
  return detail::bf16_producer(spec_, save);
}

Tensor Linear::forward(const Tensor& x, bool save) {
  if (x.dim() != 2 || x.cols() != dims_.in)
    throw std::invalid_argument(
        fmt::format("{}: input {} is not [tokens, {}]", name_, x.describe(), dims_.in));
  if (save && inference_)
    throw std::logic_error(
        fmt::format("{}: an inference module keeps nothing for a backward", name_));
  const int64_t T = x.rows();
  const int64_t Tp = save ? round_up(T, token_multiple(spec_)) : T;
  const Tensor xp = ops::pad2d(x, Tp, dims_.in_padded);
  detail::ActivationOperands xo =
      detail::activation_operands(xp, spec_, save, name_ + ".input", {});
  const Operand& wf = fprop_weight();
  GemmConfig cfg;
  cfg.order = order_;
  const GemmResult r = wf.packed.defined() ? qgemm_packed(xo.fprop.arg(), wf.packed)
                                           : qgemm(xo.fprop.arg(), wf.arg(), cfg);
  if (save) {
    tokens_ = T;
    has_saved_ = true;
    x_saved_ = std::move(xo.saved);
  }
  return ops::crop2d(r.d, T, dims_.out);
}

Tensor Linear::backward(const Tensor& dy) {
  if (!has_saved_)
    throw std::logic_error(fmt::format("{}: backward without a saved forward", name_));
  if (dy.dim() != 2 || dy.rows() != tokens_ || dy.cols() != dims_.out)
    throw std::invalid_argument(
        fmt::format("{}: dy {} is not [{}, {}]", name_, dy.describe(), tokens_, dims_.out));
  const Tensor dyp = ops::pad2d(dy, round_up(tokens_, token_multiple(spec_)), dims_.out_padded);
  const detail::GradOutputOperands g =
      detail::grad_output_operands(dyp, spec_, grad_seed_, stream_, name_ + ".grad_output", {});
  // dgrad: dX [Tp, K_p] = dY [Tp, N_p] W [N_p, K_p]; wgrad: dW [N_p, K_p] = dY^T X.
  const GemmResult dx = qgemm(g.dgrad.arg(), dgrad_weight().arg(), colwise_w(order_));
  const GemmResult dw =
      qgemm(g.wgrad.arg(), detail::wgrad_activation(x_saved_, spec_).arg(), colwise_both(order_));
  if (grad_.defined()) {
    const Tensor dwc = ops::crop2d(dw.d, dims_.out, dims_.in);
    ops::add_inplace(grad_, dwc);
  }
  clear_saved();
  return ops::crop2d(dx.d, dy.rows(), dims_.in);
}

size_t Linear::saved_bytes() const { return has_saved_ ? x_saved_.nbytes() : 0; }

void Linear::clear_saved() {
  x_saved_ = Operand{};
  has_saved_ = false;
}

NormLinear::NormLinear(Tensor norm_weight, Tensor norm_grad, double eps, Linear linear)
    : norm_w_(std::move(norm_weight)),
      norm_g_(std::move(norm_grad)),
      eps_(eps),
      linear_(std::move(linear)) {}

Tensor NormLinear::forward(const Tensor& x, bool save) {
  Tensor rstd;
  const Tensor xn = ops::rmsnorm(x, norm_w_, eps_, &rstd, linear_.producer_dtype(save));
  if (save) {
    x_ = x;
    rstd_ = rstd;
  }
  return linear_.forward(xn, save);
}

Tensor NormLinear::forward_add(Tensor& x, const Tensor& residual) {
  Tensor rstd;
  return linear_.forward(
      ops::add_rmsnorm(x, residual, norm_w_, eps_, &rstd, linear_.producer_dtype(false)), false);
}

Tensor NormLinear::backward(const Tensor& dy) {
  const Tensor dxn = linear_.backward(dy);
  Tensor dw;
  const Tensor dx = ops::rmsnorm_backward(dxn, x_, norm_w_, rstd_, &dw);
  if (norm_g_.defined()) ops::add_inplace(norm_g_, dw);
  clear_saved();
  return dx;
}

size_t NormLinear::saved_bytes() const {
  return linear_.saved_bytes() + (x_.defined() ? x_.nbytes() + rstd_.nbytes() : 0);
}

void NormLinear::clear_saved() {
  x_ = Tensor();
  rstd_ = Tensor();
  linear_.clear_saved();
}

}  // namespace lockstep::nn
