// The byte comparison of `lockstep verify`, private to src/convert: one quantized module's files
// against the contract's quantization of its bf16 weight, every differing value given a cause.
#pragma once

#include "lockstep/convert/verify.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::convert {

// A module's tensors as the quantized directory holds them.
struct ModuleFiles {
  Tensor data;         // NVFP4 U8 [N, K/2]; MXFP8 / FP8 F8_E4M3 [N, K]
  Tensor block_scale;  // NVFP4 F8_E4M3 [N, K/16]; MXFP8 U8 [N, K/32]
  Tensor scale_inv;    // FP8 block: F32 [ceil(N/128), ceil(K/128)]
  float outer = 0;  // NVFP4: weight_scale_2 (ModelOpt) or weight_global_scale (compressed-tensors)
  float contract_amax = 0;  // NVFP4: the A of the contract's domain
};

// The amax (CONTRACT.md section 0) of a host tensor.
float tensor_amax(const Tensor& w);

// Fills v (its module, rows, cols and domain already set) from w (the bf16 weight [N, K]).
void compare_module(HfFormat f, const Tensor& w, const ModuleFiles& files, ModuleVerdict& v);

}  // namespace lockstep::convert
