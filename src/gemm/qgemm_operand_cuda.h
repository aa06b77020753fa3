// Device GEMM operands from Tensors and QTensors, private to src/gemm: every copy made K-major
// with compact scales, per-row outer scales and (FP8 blocks) per-row chunk scales, by small
// device kernels into pool scratch, without waiting for the device (qgemm_operand_cuda.cu).
#pragma once

#include <string_view>

#include "qgemm_cuda_types.h"

namespace lockstep::cuda {

// The matrix that copy `copy` of `op` describes ([rows(copy), cols(copy)], docs/gemm.md), as a
// kernel operand. k_pad > K: K padded with zero elements to k_pad (zero products; the grouped-K
// pieces of grouped_qgemm). Dense operands are BF16 (F32 and F64 run on the CPU only); a
// columnwise dense copy or an MXFP8 blocks-down-columns copy is transposed into scratch; swizzled
// scales are unswizzled; a grouped NVFP4 / FP8 columnwise copy is refused (see
// prepare_grouped_w_colwise). Throws GemmError naming the operand.
GemmOperandView prepare_operand(const GemmArg& op, Copy copy, std::string_view name, Scratch& s,
                                int64_t k_pad = 0);

// The W operand of grouped_qgemm with w_copy = colwise: W [groups * K, N] in groups of K rows,
// each group's columnwise copy an [N, K] operand, concatenated into [groups * N, K].
GemmOperandView prepare_grouped_w_colwise(const GemmArg& w, int64_t groups, int64_t K,
                                          std::string_view name, Scratch& s);

}  // namespace lockstep::cuda
