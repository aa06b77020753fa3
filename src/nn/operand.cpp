// GEMM operands of the nn/ modules (nn/operand.h): one recipe operand spec applied to a tensor.
#include "lockstep/nn/operand.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "lockstep/quant/quantize.h"

namespace lockstep::nn {

size_t Operand::nbytes() const {
  if (!quantized()) return t.defined() ? t.nbytes() : 0;
  size_t n = 0;
  for (const QData* d : {&q.rowwise, &q.colwise})
    for (const Tensor* p : {&d->data, &d->block_scale, &d->amax, &d->scale_inv})
      if (p->defined()) n += p->nbytes();
  return n;
}

Tensor Operand::dense(DType dtype) const {
  if (!quantized()) return t;
  DequantConfig c;
  c.copy = q.has_rowwise() ? Copy::kRowwise : Copy::kColwise;
  c.dtype = dtype;
  return dequantize(q, c);
}

void prepack_weight(Operand& w, int64_t groups) {
  if (!w.quantized() && (!w.t.defined() || w.t.dtype() == DType::kF64)) return;
  if (!w.arg().device().is_cpu()) return;
  w.packed = pack_weight(w.arg(), groups);
}

Operand make_operand(const Tensor& x, const QuantSpec& spec, const OperandRequest& req,
                     std::string_view name, std::span<const int64_t> offsets) {
  Operand op;
  if (x.dtype() == DType::kF64) {
    if (spec.format != Format::kF32)
      throw std::invalid_argument(fmt::format(
          "operand '{}' {}: float64 tensors run with the f32 pass-through format only (the "
          "gradient-check path), not {}",
          name, x.describe(), format_name(spec.format)));
    op.t = x;
    return op;
  }
  if (x.dtype() == DType::kBF16) {
    if (spec.format != Format::kBf16)
      throw std::invalid_argument(fmt::format(
          "operand '{}' {}: a BF16 tensor is an operand of the bf16 format only, not {}", name,
          x.describe(), format_name(spec.format)));
    op.t = x;
    return op;
  }
  if (x.dtype() != DType::kF32)
    throw std::invalid_argument(fmt::format(
        "operand '{}' {}: modules take F32 (or F64, or BF16 for a bf16 operand) tensors", name,
        x.describe()));
  if (!is_quantized(spec.format)) {
    op.t = spec.format == Format::kF32 ? x : cast(x, DType::kBF16);
    return op;
  }
  QuantConfig c{spec};
  c.rowwise = req.rowwise;
  c.colwise = req.colwise;
  c.seed = req.seed;
  c.rng_stream = req.stream;
  if (offsets.empty() && c.scaling == Scaling::kPerGroup) {
    // A dense tensor is one group (docs/recipes.md).
    const std::vector<int64_t> one{0, x.rows()};
    op.q = group_view(quantize_grouped(x, one, c, name), 0);
  } else {
    op.q = offsets.empty() ? quantize(x, c, name) : quantize_grouped(x, offsets, c, name);
  }
  return op;
}

int64_t k_multiple(const GemmSpec& g) {
  return std::lcm(lockstep::k_multiple(g.a.format, g.a.scaling),
                  lockstep::k_multiple(g.b.format, g.b.scaling));
}

int64_t round_up(int64_t v, int64_t m) { return m <= 1 ? v : (v + m - 1) / m * m; }

}  // namespace lockstep::nn
