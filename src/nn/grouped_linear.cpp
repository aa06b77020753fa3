// GroupedLinear (nn/grouped_linear.h): the Linear recipe rules applied per expert through
// quantize_grouped and grouped_qgemm. Forward rows of group e meet expert e's weight; dgrad reads
// the grouped weight's columnwise copies (groups along M); wgrad computes D_e = dY_e^T X_e
// (groups along K, each expert's own rows only).
#include "lockstep/nn/grouped_linear.h"

#include <fmt/format.h>

#include <stdexcept>

#include "lockstep/ops/tensor_ops.h"

namespace lockstep::nn {
namespace {

bool quantized_format(const OperandSpec& s) { return to_quant_spec(s).has_value(); }

Tensor offsets_tensor(std::span<const int64_t> offsets) {
  return Tensor::from_vector<int64_t>(offsets, {int64_t(offsets.size())}, DType::kI64);
}

std::vector<int64_t> weight_offsets(int64_t groups, int64_t rows_per_group) {
  std::vector<int64_t> o(size_t(groups + 1));
  for (int64_t e = 0; e <= groups; ++e) o[size_t(e)] = e * rows_per_group;
  return o;
}

}  // namespace

int64_t group_row_multiple(const LinearSpec& spec) { return k_multiple(spec[Gemm::kWgrad]); }

Operand prepare_grouped_fprop_weight(const Tensor& w, int64_t groups, const LinearSpec& spec,
                                     std::string_view name, bool training) {
  const LinearDims d = LinearDims::of(w.rows() / groups, w.cols(), spec);
  const Tensor wp = pad_groups(w, groups, d.out_padded, d.in_padded);
  OperandRequest req;
  req.colwise = training && spec.backward_mode == BackwardMode::kQuantized &&
                spec[Gemm::kDgrad].b == spec[Gemm::kFprop].b &&
                quantized_format(spec[Gemm::kFprop].b);
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
  return g;
}

void GroupedLinear::weights_changed() {
  if (inference_) return;
  w_fprop_ = Operand{};
  w_dgrad_ = Operand{};
}

const Operand& GroupedLinear::fprop_weight() {
  if (!w_fprop_.defined())
    w_fprop_ = prepare_grouped_fprop_weight(weight_, groups_, spec_, name_ + ".weight", true);
  return w_fprop_;
}

const Operand& GroupedLinear::dgrad_weight() {
  if (w_dgrad_.defined()) return w_dgrad_;
  const Operand& wf = fprop_weight();
  switch (spec_.backward_mode) {
    case BackwardMode::kQuantized:
      if (wf.quantized() && wf.q.has_colwise()) {
        w_dgrad_ = wf;
      } else {
        OperandRequest req;
        req.rowwise = false;
        req.colwise = true;
        w_dgrad_ = make_operand(pad_groups(weight_, groups_, dims_.out_padded, dims_.in_padded),
                                spec_[Gemm::kDgrad].b, req, name_ + ".weight",
                                weight_offsets(groups_, dims_.out_padded));
      }
      break;
    case BackwardMode::kHighPrecision:
      w_dgrad_ = make_operand(pad_groups(weight_, groups_, dims_.out_padded, dims_.in_padded),
                              spec_[Gemm::kDgrad].b, {}, name_ + ".weight");
      break;
    case BackwardMode::kDequantized:
      w_dgrad_.t = wf.dense(DType::kBF16);
      break;
    default:
      throw std::logic_error("backward mode");
  }
  return w_dgrad_;
}

Tensor GroupedLinear::forward(const Tensor& x, std::span<const int64_t> offsets, bool save) {
  if (x.dim() != 2 || x.cols() != dims_.in || int64_t(offsets.size()) != groups_ + 1 ||
      offsets.back() != x.rows())
    throw std::invalid_argument(
        fmt::format("{}: input {} with {} offsets is not [rows, {}] grouped into {} experts", name_,
                    x.describe(), offsets.size(), dims_.in, groups_));
  const Tensor xp = pad2d(x, x.rows(), dims_.in_padded);
  const GemmSpec& fp = spec_[Gemm::kFprop];
  const OperandSpec& wx = spec_[Gemm::kWgrad].b;
  const bool shared = save && spec_.backward_mode == BackwardMode::kQuantized && wx == fp.a &&
                      quantized_format(fp.a);
  OperandRequest req;
  req.colwise = shared;
  const Operand xf = make_operand(xp, fp.a, req, name_ + ".input", offsets);
  const GemmResult r = grouped_qgemm(xf.arg(), offsets_tensor(offsets), fprop_weight().arg());
  if (save) {
    offsets_.assign(offsets.begin(), offsets.end());
    has_saved_ = true;
    switch (spec_.backward_mode) {
      case BackwardMode::kQuantized:
        if (shared) {
          x_saved_ = xf;
          x_saved_.q.rowwise = QData{};
        } else {
          OperandRequest cw;
          cw.rowwise = !quantized_format(wx);
          cw.colwise = quantized_format(wx);
          x_saved_ = make_operand(xp, wx, cw, name_ + ".input", offsets);
        }
        break;
      case BackwardMode::kHighPrecision:
        x_saved_ = make_operand(xp, wx, {}, name_ + ".input");
        break;
      case BackwardMode::kDequantized:
        x_saved_ = xf;
        break;
      default:
        throw std::logic_error("backward mode");
    }
  }
  return crop2d(r.d, x.rows(), dims_.out);
}

Tensor GroupedLinear::backward(const Tensor& dy) {
  if (!has_saved_)
    throw std::logic_error(fmt::format("{}: backward without a saved forward", name_));
  const int64_t R = offsets_.back();
  if (dy.dim() != 2 || dy.rows() != R || dy.cols() != dims_.out)
    throw std::invalid_argument(
        fmt::format("{}: dy {} is not [{}, {}]", name_, dy.describe(), R, dims_.out));
  const Tensor dyp = pad2d(dy, R, dims_.out_padded);
  const Tensor off = offsets_tensor(offsets_);
  const OperandSpec& sd = spec_[Gemm::kDgrad].a;
  const OperandSpec& sw = spec_[Gemm::kWgrad].a;
  const bool one = sd == sw && quantized_format(sd);
  const Operand dy_d =
      make_operand(dyp, sd, {true, one, grad_seed_, stream_}, name_ + ".grad_output", offsets_);
  Operand dy_w = dy_d;
  if (!one)
    dy_w = make_operand(
        dyp, sw, {!quantized_format(sw), quantized_format(sw), grad_seed_, stream_ + 0x8000u},
        name_ + ".grad_output", offsets_);
  GemmConfig dg;
  dg.w_copy = Copy::kColwise;
  const GemmResult dx = grouped_qgemm(dy_d.arg(), off, dgrad_weight().arg(), dg);
  Operand xw = x_saved_;
  if (spec_.backward_mode == BackwardMode::kDequantized)
    xw = Operand{x_saved_.dense(DType::kBF16), {}};
  GemmConfig wg;
  wg.a_copy = wg.w_copy = Copy::kColwise;
  const GemmResult dw = grouped_qgemm(dy_w.arg(), off, xw.arg(), wg);
  if (grad_.defined()) ops::add_inplace(grad_, crop_groups(dw.d, groups_, dims_.out, dims_.in));
  clear_saved();
  return crop2d(dx.d, R, dims_.in);
}

size_t GroupedLinear::saved_bytes() const { return has_saved_ ? x_saved_.nbytes() : 0; }

void GroupedLinear::clear_saved() {
  x_saved_ = Operand{};
  offsets_.clear();
  has_saved_ = false;
}

}  // namespace lockstep::nn
