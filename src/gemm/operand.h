// GEMM operands decoded exactly (docs/gemm.md "Inner and outer values"), private to the gemm
// layer: every operand row r and reduction index k has an exact fp32 inner value, an fp32 outer
// scale per row, and, for FP8 1x128 / 128x128 blocks only, an fp32 scale per 128-wide k chunk.
// The CPU paths and the CUDA kernels decode alike.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/gemm/qgemm.h"

namespace lockstep::gemm {

// FP8 1x128 / 128x128 operands scale each 128-wide k chunk by its own fp32 scale_inv.
constexpr int64_t kChunk = 128;

//   bf16:  inner = x (a BF16 value),           outer = 1
//   f32:   inner = x (unrounded),              outer = 1
//   nvfp4: inner = E2M1(q) * E4M3(s_b),        outer = S_dec of the row's domain
//   mxfp8: inner = E4M3(q) * 2^(e - 127),      outer = 1
//   fp8 per_tensor / per_row / per_group: inner = E4M3(q), outer = scale_inv of the row's domain
//   fp8 block_1x128 / block_128x128:      inner = E4M3(q), outer = 1,
//                                         chunk_scale[r, c] = scale_inv of (r, k chunk c)
struct DecodedOperand {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> inner;        // [rows, cols]
  std::vector<float> outer;        // [rows]
  bool chunked = false;            // fp8 block scaling: chunk_scale is present
  int64_t chunks = 0;              // cols / kChunk when chunked
  std::vector<float> chunk_scale;  // [rows, chunks]
};

// Validates the copy of a quantized operand on any device without reading its bytes: the copy
// exists, the sizes of every part match the matrix it describes, K is a multiple of the block
// (nvfp4 16, mxfp8 32, fp8 blocks 128); a grouped NVFP4 / FP8 columnwise copy is read per group
// (group_view). Throws GemmError naming the operand. Dense operands pass.
void check_operand(const GemmArg& op, Copy copy, std::string_view name);

// check_operand, then decodes rows [row0, row0 + count) of the matrix the copy describes.
DecodedOperand decode_operand(const GemmArg& op, Copy copy, int64_t row0, int64_t count,
                              std::string_view name);

// N of a grouped GEMM with groups along M: W rowwise is [groups * N, K]; W columnwise is the
// grouped [groups * K, N] whose groups' columnwise copies are the [N, K] operands. Throws GemmError
// (prefixed with `what`) when W's shape does not fit.
int64_t grouped_w_rows_per_group(const GemmArg& w, Copy w_copy, int64_t groups, int64_t k,
                                 const std::string& what);

// The float64 values of a dense F64 operand's copy, [rows, cols] row-major.
std::vector<double> dense_f64(const GemmArg& op, Copy copy);

}  // namespace lockstep::gemm
