// The two MoE producer-side fusions, each one entry dispatched on the device of its input and
// defined as the unfused composition of reference ops; the CUDA versions produce exactly these
// bytes in one pass over the input.
//  1. permute + row amax + quantize: out row i = x row src_rows[i] (src_rows[i] == -1: a zero
//     padding row), then NVFP4 per-row quantization (quantize_grouped with `offsets`).
//  2. weighted SwiGLU + row amax + quantize: fc1 is [rows, 2H] with gate in columns [0, H) and up
//     in [H, 2H); y[r, c] = RN(RN(silu(gate) * up) * prob[r]) in fp32 (not rounded to bf16), with
//     silu(g) = RN(g / RN(1 + exp_f32(-g))) and exp_f32 of numerics/transcendental.h (a portable
//     exp built from correctly rounded + - * / only, so host and device agree bit for bit); then
//     NVFP4 per-row quantization of y. The row amax is over y, the values that get quantized.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "lockstep/quant/quantize.h"

namespace lockstep {

// x: [tokens, cols] F32 / BF16; src_rows: [out_rows] I32 token index per output row (-1 =
// padding row), on x's device; offsets: group offsets over the out_rows output rows.
// cfg: nvfp4, per_row, 1-D blocks, rowwise copy.
QTensor permute_quantize(const Tensor& x, const Tensor& src_rows, std::span<const int64_t> offsets,
                         const QuantConfig& cfg, std::string_view name = "tensor");
// The gathered matrix alone: [out_rows, cols] F32 on x's device (CPU only).
Tensor permute_rows(const Tensor& x, const Tensor& src_rows);

// fc1: [rows, 2H] F32 / BF16; prob: [rows] F32 on fc1's device. cfg as above.
QTensor swiglu_quantize(const Tensor& fc1, const Tensor& prob, const QuantConfig& cfg,
                        std::string_view name = "tensor");
// y alone: [rows, H] F32 (CPU only).
Tensor swiglu_weighted(const Tensor& fc1, const Tensor& prob);

}  // namespace lockstep
