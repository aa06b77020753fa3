// The CUDA backend of the quantizer entry points (quantize.h, moe_fused.h), private to the quant
// layer: inputs and outputs are device tensors; validation has already run. Each call is ordered
// on cfg.stream and never synchronises the host.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/quant/quantize.h"

namespace lockstep::cuda {

QTensor quantize(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                 std::string_view name);
// NVFP4 per_tensor / per_group rowwise copy with each domain's amax given (F32 [domains] on x's
// device): the amax pass is replaced by turning the given values into the domain keys.
QTensor quantize_with_amax(const Tensor& x, std::span<const int64_t> offsets, const Tensor& amax,
                           const QuantConfig& cfg, std::string_view name);
std::vector<QTensor> quantize_joint(std::span<const Tensor> xs, const QuantConfig& cfg,
                                    std::span<const std::string> names);
Tensor dequantize(const QTensor& q, const DequantConfig& cfg);
Tensor hadamard16_rows(const Tensor& x, Stream stream);
QTensor permute_quantize(const Tensor& x, const Tensor& src_rows, std::span<const int64_t> offsets,
                         const QuantConfig& cfg, std::string_view name);
QTensor swiglu_quantize(const Tensor& fc1, const Tensor& prob, const QuantConfig& cfg,
                        std::string_view name);

}  // namespace lockstep::cuda
