// GEMM operands of the nn/ modules: a tensor turned into what one GEMM reads under one recipe
// operand spec (bf16 -> a BF16 tensor, f32 -> the tensor as it is, nvfp4 / mxfp8 / fp8 -> a
// QTensor with the copies asked for), and the multiples the quantized GEMMs need along K (the
// zero padding itself is ops/layout.h). Padding never changes a quantized value: zero rows and
// columns change no amax and form their own (zero) blocks.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lockstep/gemm/packed.h"
#include "lockstep/gemm/qgemm.h"
#include "lockstep/quant/qtensor.h"
#include "lockstep/recipe/recipe.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::nn {

// A dense tensor or a quantized one: what one GEMM side reads.
struct Operand {
  Tensor t;
  QTensor q;
  PackedWeight packed;  // a weight's rowwise copy packed for the CPU GEMM (optional, same bits)
  bool quantized() const { return q.has_rowwise() || q.has_colwise(); }
  bool defined() const { return quantized() || t.defined(); }
  GemmArg arg() const { return quantized() ? GemmArg(q) : GemmArg(t); }
  // Bytes held (every part of every copy of a QTensor; the dense tensor's bytes).
  size_t nbytes() const;
  // The same values as a dense tensor: dequantize (to `dtype`) or the dense tensor itself.
  Tensor dense(DType dtype) const;
};

// Packs the rowwise copy of a weight operand for repeated CPU GEMMs (groups: expert groups);
// a no-op for F64 operands (the float64 path) and for operands on a GPU.
void prepack_weight(Operand& w, int64_t groups);

// Which copies to quantize, and the Philox key of stochastic rounding (gradient operands).
struct OperandRequest {
  bool rowwise = true;
  bool colwise = false;
  uint64_t seed = 0;
  uint32_t stream = 0;
};

// x: [rows, cols] F32 (any spec), F64 (f32 spec only: the float64 gradient-check path) or BF16
// (bf16 spec only: the operand is x itself, written as bf16 by the op that produced it).
// bf16 -> cast(x, BF16) (RNE); f32 -> x; quantized formats -> quantize(x, QuantConfig{spec}).
// offsets non-empty: a grouped buffer (quantize_grouped; per_group = one domain per group).
Operand make_operand(const Tensor& x, const QuantSpec& spec, const OperandRequest& req,
                     std::string_view name, std::span<const int64_t> offsets = {});

// The multiple a GEMM's reduction dimension K must have for both operands of g to be read along
// K: the lcm of the format table's k_multiple (quant/format.h) of each operand.
int64_t k_multiple(const GemmSpec& g);
int64_t round_up(int64_t v, int64_t m);

}  // namespace lockstep::nn
