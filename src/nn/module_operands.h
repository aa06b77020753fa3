// The operand choices Linear and GroupedLinear share (private to nn/): what the forward multiplies
// and keeps, and what dgrad and wgrad read, by backward mode (docs/model.md "nn modules").
// `offsets` are the group offsets of a grouped buffer (empty for a dense module); operands of a
// dense format ignore them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "lockstep/nn/operand.h"
#include "lockstep/recipe/recipe.h"

namespace lockstep::nn::detail {

// Whether the fprop weight operand also carries the columnwise copy dgrad reads (quantized mode,
// equal fprop and dgrad weight specs): one quantize call serves both GEMMs.
bool fprop_weight_with_colwise(const LinearSpec& spec, bool training);

// The dgrad weight operand. wp: W padded as the fprop weight; w_offsets: its expert groups.
Operand dgrad_weight_operand(const Operand& w_fprop, const Tensor& wp, const LinearSpec& spec,
                             const std::string& name, std::span<const int64_t> w_offsets);

// The fprop activation operand of xp, and (save) what the backward keeps for wgrad.
struct ActivationOperands {
  Operand fprop, saved;
};
ActivationOperands activation_operands(const Tensor& xp, const LinearSpec& spec, bool save,
                                       const std::string& name, std::span<const int64_t> offsets);
// BF16 when an inference forward (save = false) multiplies a bf16 fprop activation operand, whose
// producer may then write the input as bf16 (Linear::producer_dtype); nullopt otherwise.
std::optional<DType> bf16_producer(const LinearSpec& spec, bool save);
// The wgrad activation operand rebuilt from what the forward kept.
Operand wgrad_activation(const Operand& saved, const LinearSpec& spec);

// dY as the dgrad (rowwise) and wgrad (columnwise) operands; one quantize call when the specs
// are equal. Stochastic rounding keys: (seed, stream) and (seed, stream + 0x8000).
struct GradOutputOperands {
  Operand dgrad, wgrad;
};
GradOutputOperands grad_output_operands(const Tensor& dyp, const LinearSpec& spec, uint64_t seed,
                                        uint32_t stream, const std::string& name,
                                        std::span<const int64_t> offsets);

}  // namespace lockstep::nn::detail
