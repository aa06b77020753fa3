// The operand choices of the linear modules by backward mode (module_operands.h).
#include "module_operands.h"

#include <stdexcept>

namespace lockstep::nn::detail {

bool fprop_weight_with_colwise(const LinearSpec& spec, bool training) {
  return training && spec.backward_mode == BackwardMode::kQuantized &&
         spec[Gemm::kDgrad].b == spec[Gemm::kFprop].b && is_quantized(spec[Gemm::kFprop].b.format);
}

Operand dgrad_weight_operand(const Operand& w_fprop, const Tensor& wp, const LinearSpec& spec,
                             const std::string& name, std::span<const int64_t> w_offsets) {
  switch (spec.backward_mode) {
    case BackwardMode::kQuantized: {
      if (w_fprop.quantized() && w_fprop.q.has_colwise()) return w_fprop;
      OperandRequest req;
      req.rowwise = false;
      req.colwise = true;
      return make_operand(wp, spec[Gemm::kDgrad].b, req, name, w_offsets);
    }
    case BackwardMode::kHighPrecision:
      return make_operand(wp, spec[Gemm::kDgrad].b, {}, name);
    case BackwardMode::kDequantized: {
      Operand op;
      op.t = w_fprop.dense(DType::kBF16);
      return op;
    }
    default:
      throw std::logic_error("backward mode");
  }
}

ActivationOperands activation_operands(const Tensor& xp, const LinearSpec& spec, bool save,
                                       const std::string& name, std::span<const int64_t> offsets) {
  const QuantSpec& fa = spec[Gemm::kFprop].a;
  const QuantSpec& wx = spec[Gemm::kWgrad].b;
  const bool shared =
      save && spec.backward_mode == BackwardMode::kQuantized && wx == fa && is_quantized(fa.format);
  OperandRequest req;
  req.colwise = shared;
  ActivationOperands out;
  out.fprop = make_operand(xp, fa, req, name, offsets);
  if (!save) return out;
  switch (spec.backward_mode) {
    case BackwardMode::kQuantized:
      if (shared) {
        out.saved = out.fprop;
        out.saved.q.rowwise = QData{};  // the backward reads the columnwise copy only
      } else {
        OperandRequest cw;
        cw.rowwise = !is_quantized(wx.format);
        cw.colwise = is_quantized(wx.format);
        out.saved = make_operand(xp, wx, cw, name, offsets);
      }
      break;
    case BackwardMode::kHighPrecision:
      out.saved = make_operand(xp, wx, {}, name);
      break;
    case BackwardMode::kDequantized:
      out.saved = out.fprop;
      break;
    default:
      throw std::logic_error("backward mode");
  }
  return out;
}

std::optional<DType> bf16_producer(const LinearSpec& spec, bool save) {
  if (save || spec[Gemm::kFprop].a.format != Format::kBf16) return std::nullopt;
  return DType::kBF16;
}

Operand wgrad_activation(const Operand& saved, const LinearSpec& spec) {
  if (spec.backward_mode != BackwardMode::kDequantized) return saved;
  Operand op;
  op.t = saved.dense(DType::kBF16);
  return op;
}

GradOutputOperands grad_output_operands(const Tensor& dyp, const LinearSpec& spec, uint64_t seed,
                                        uint32_t stream, const std::string& name,
                                        std::span<const int64_t> offsets) {
  const QuantSpec& sd = spec[Gemm::kDgrad].a;
  const QuantSpec& sw = spec[Gemm::kWgrad].a;
  const bool one = sd == sw && is_quantized(sd.format);
  GradOutputOperands g;
  g.dgrad = make_operand(dyp, sd, {true, one, seed, stream}, name, offsets);
  g.wgrad = one ? g.dgrad
                : make_operand(
                      dyp, sw,
                      {!is_quantized(sw.format), is_quantized(sw.format), seed, stream + 0x8000u},
                      name, offsets);
  return g;
}

}  // namespace lockstep::nn::detail
