// NVFP4 quantization with the outer amax supplied by the caller: the optimizer step that writes a
// weight can fold |w| into each domain's amax on the way, so the converter reads the weight once
// (block scales and codes) instead of twice (amax, then codes). One call that runs on the device
// the input lives on, like quantize().
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "lockstep/quant/quantize.h"

namespace lockstep {

// x: 2-D F32 / BF16 (/ F16 on the CPU) tensor; offsets: group offsets (empty when ungrouped);
// amax: F32 [domains] on x's device, the A of each outer domain (CONTRACT.md section 0: >= 0, or
// NaN for a domain of only NaN). cfg: nvfp4, per_tensor (one domain) or per_group (one per group),
// rowwise copy only, round to nearest, no Hadamard transform.
// The bytes are those of quantize_grouped(x, offsets, cfg) computed with these A values: equal to
// it when each value is the domain's amax of x, and the stored amax is the given one. A value
// that is not the domain's true amax gives other bytes (a larger A is a joint quantization's).
// Throws QuantError naming the tensor for another configuration, a count of amax values other
// than the domain count, or (host amax) a negative value.
QTensor quantize_with_amax(const Tensor& x, std::span<const int64_t> offsets, const Tensor& amax,
                           const QuantConfig& cfg, std::string_view name = "tensor");

// The number of outer domains of an NVFP4 per_tensor / per_group quantization of a tensor with
// these group offsets (1, or the number of groups).
int64_t nvfp4_outer_domains(std::span<const int64_t> offsets, Scaling scaling);

}  // namespace lockstep
