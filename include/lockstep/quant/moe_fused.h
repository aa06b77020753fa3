// The two MoE producer-side fusions, defined as the unfused composition of CPU reference ops;
// the CUDA versions (quantize_cuda.h: permute_quantize_nvfp4_device, swiglu_quantize_nvfp4_device)
// produce exactly these bytes in one pass over the input.
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
#include <vector>

#include "lockstep/quant/quantize.h"

namespace lockstep {

// x: [tokens, cols]; src_rows: [out_rows] token index per output row (-1 = padding row);
// offsets: group offsets over the out_rows output rows. spec: nvfp4, per_row, 1-D blocks.
QTensor permute_quantize_nvfp4_cpu(const MatrixF32& x, std::span<const int32_t> src_rows,
                                   std::span<const int64_t> offsets, const QuantSpec& spec);
// The gathered matrix alone: [src_rows.size(), cols].
std::vector<float> permute_rows_cpu(const MatrixF32& x, std::span<const int32_t> src_rows);

// fc1: [rows, 2H]; prob: [rows]. spec: nvfp4, per_row, 1-D blocks.
QTensor swiglu_quantize_nvfp4_cpu(const MatrixF32& fc1, std::span<const float> prob, const QuantSpec& spec);
// y alone: [rows, H] fp32.
std::vector<float> swiglu_weighted_cpu(const MatrixF32& fc1, std::span<const float> prob);

}  // namespace lockstep
