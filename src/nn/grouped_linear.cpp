// GroupedLinear (nn/grouped_linear.h): the Linear recipe rules applied per expert through
// quantize_grouped and grouped_qgemm. Forward rows of group e meet expert e's weight; dgrad reads
// the grouped weight's columnwise copies (groups along M); wgrad computes D_e = dY_e^T X_e
// (groups along K, each expert's own rows only).
#include "lockstep/nn/grouped_linear.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "lockstep/ops/layout.h"
#include "lockstep/ops/tensor_ops.h"
#include "module_operands.h"

namespace lockstep::nn {
namespace {

Tensor offsets_tensor(std::span<const int64_t> offsets) {
  return Tensor::from_vector<int64_t>(offsets, {int64_t(offsets.size())}, DType::kI64);
}

std::vector<int64_t> weight_offsets(int64_t groups, int64_t rows_per_group) {
  std::vector<int64_t> o(size_t(groups + 1));
  for (int64_t e = 0; e <= groups; ++e) o[size_t(e)] = e * rows_per_group;
  return o;
}

}  // namespace

int64_t group_row_multiple(const LinearSpec& spec) {
  return std::lcm(k_multiple(spec[Gemm::kWgrad]), kLinearKMultiple);
}

Operand prepare_grouped_fprop_weight(const Tensor& w, int64_t groups, const LinearSpec& spec,
                                     std::string_view name, bool training) {
  const LinearDims d = LinearDims::of(w.rows() / groups, w.cols(), spec);
  const Tensor wp = ops::pad_groups(w, groups, d.out_padded, d.in_padded);
  OperandRequest req;
  req.colwise = detail::fprop_weight_with_colwise(spec, training);
  const std::vector<int64_t> off = weight_offsets(groups, d.out_padded);
  return make_operand(wp, spec[Gemm::kFprop].b, req, name, off);
}

GroupedLinear::GroupedLinear(std::string name, Tensor weight, Tensor grad, int64_t groups,
                             LinearSpec spec, uint32_t rng_stream)
    : name_(std::move(name)),
      spec_(spec),
      dims_(LinearDims::of(weight.rows() / groups, weight.cols(), spec)),
      groups_(groups),
      weight_(std::move(weight)),
      grad_(std::move(grad)),
      stream_(rng_stream) {
  if (groups_ < 1 || weight_.rows() % groups_ != 0)
    throw std::invalid_argument(
        fmt::format("{}: weight {} is not {} groups of rows", name_, weight_.describe(), groups_));
}

GroupedLinear GroupedLinear::from_operand(std::string name, Operand fprop_weight, int64_t groups,
                                          int64_t out, int64_t in, LinearSpec spec) {
  GroupedLinear g;
  g.name_ = std::move(name);
  g.spec_ = spec;
  g.dims_ = LinearDims::of(out, in, spec);
  g.groups_ = groups;
  g.inference_ = true;
  g.w_fprop_ = std::move(fprop_weight);
  if (!g.w_fprop_.packed.defined()) prepack_weight(g.w_fprop_, groups);
  return g;
}

void GroupedLinear::weights_changed() {
  if (inference_) return;
  w_fprop_ = Operand{};
  w_dgrad_ = Operand{};
}

const Operand& GroupedLinear::fprop_weight() {
  if (!w_fprop_.defined()) {
    w_fprop_ = prepare_grouped_fprop_weight(weight_, groups_, spec_, name_ + ".weight", true);
    prepack_weight(w_fprop_, groups_);
  }
  return w_fprop_;
}

const Operand& GroupedLinear::dgrad_weight() {
  if (!w_dgrad_.defined())
    w_dgrad_ = detail::dgrad_weight_operand(
        fprop_weight(), ops::pad_groups(weight_, groups_, dims_.out_padded, dims_.in_padded), spec_,
        name_ + ".weight", weight_offsets(groups_, dims_.out_padded));
  return w_dgrad_;
}

std::optional<DType> GroupedLinear::producer_dtype(bool save) const {
  return detail::bf16_producer(spec_, save);
}

Tensor GroupedLinear::forward(const Tensor& x, const Tensor& offsets, bool save) {
  if (x.dim() != 2 || x.cols() != dims_.in || offsets.dtype() != DType::kI64 ||
      offsets.numel() != groups_ + 1 || (!offsets.is_cpu() && offsets.device() != x.device()))
    throw std::invalid_argument(fmt::format(
        "{}: input {} with offsets {} is not [rows, {}] grouped into {} experts on its device",
        name_, x.describe(), offsets.describe(), dims_.in, groups_));
  // Group sizes on the host: always for host offsets; for device offsets only where the layout of
  // a copy or the GEMM's loop needs them (one small device-to-host copy).
  const QuantSpec& fa = spec_[Gemm::kFprop].a;
  const bool need_host = offsets.is_cpu() || save || fa.scaling == Scaling::kPerGroup;
  std::vector<int64_t> host_off;
  if (need_host) {
    const Tensor h = offsets.to(Device::cpu()).contiguous();
    host_off.assign(h.ptr<int64_t>(), h.ptr<int64_t>() + h.numel());
    if (host_off.back() != x.rows())
      throw std::invalid_argument(fmt::format("{}: offsets end at {}, the input has {} rows", name_,
                                              host_off.back(), x.rows()));
  }
  const Tensor xp = ops::pad2d(x, x.rows(), dims_.in_padded);
  detail::ActivationOperands xo =
      detail::activation_operands(xp, spec_, save, name_ + ".input", host_off);
  const Operand& wf = fprop_weight();
  GemmConfig cfg;
  cfg.order = order_;
  const GemmResult r = wf.packed.defined()
                           ? grouped_qgemm_packed(xo.fprop.arg(), host_off, wf.packed)
                           : grouped_qgemm(xo.fprop.arg(), offsets, wf.arg(), cfg);
  if (save) {
    offsets_ = std::move(host_off);
    offsets_t_ = offsets;
    has_saved_ = true;
    x_saved_ = std::move(xo.saved);
  }
  return ops::crop2d(r.d, x.rows(), dims_.out);
}

Tensor GroupedLinear::backward(const Tensor& dy) {
  if (!has_saved_)
    throw std::logic_error(fmt::format("{}: backward without a saved forward", name_));
  const int64_t R = offsets_.back();
  if (dy.dim() != 2 || dy.rows() != R || dy.cols() != dims_.out)
    throw std::invalid_argument(
        fmt::format("{}: dy {} is not [{}, {}]", name_, dy.describe(), R, dims_.out));
  const Tensor dyp = ops::pad2d(dy, R, dims_.out_padded);
  const Tensor off = offsets_tensor(offsets_);  // the wgrad GEMM loops over groups on the host
  const detail::GradOutputOperands g = detail::grad_output_operands(
      dyp, spec_, grad_seed_, stream_, name_ + ".grad_output", offsets_);
  GemmConfig dg;
  dg.w_copy = Copy::kColwise;
  dg.order = order_;
  const GemmResult dx = grouped_qgemm(g.dgrad.arg(), off, dgrad_weight().arg(), dg);
  GemmConfig wg;
  wg.a_copy = wg.w_copy = Copy::kColwise;
  wg.order = order_;
  const GemmResult dw =
      grouped_qgemm(g.wgrad.arg(), off, detail::wgrad_activation(x_saved_, spec_).arg(), wg);
  if (grad_.defined())
    ops::add_inplace(grad_, ops::crop_groups(dw.d, groups_, dims_.out, dims_.in));
  clear_saved();
  return ops::crop2d(dx.d, R, dims_.in);
}

size_t GroupedLinear::saved_bytes() const { return has_saved_ ? x_saved_.nbytes() : 0; }

void GroupedLinear::clear_saved() {
  x_saved_ = Operand{};
  offsets_.clear();
  offsets_t_ = Tensor();
  has_saved_ = false;
}

}  // namespace lockstep::nn
