// GEMM operands and their exact decomposition (docs/gemm.md): every operand row r and reduction
// index k has an exact fp32 inner value, an fp32 outer scale per row, and, for FP8 1x128 / 128x128
// blocks only, an fp32 scale per 128-wide k chunk. The CPU paths and a CUDA kernel decode alike.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/quant/qtensor.h"

namespace lockstep {

// A GEMM contract violation by the caller (shapes, offsets, an operand the GEMM cannot read).
// The message names the operands, their shapes and the rule broken.
class GemmError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The operand formats a GEMM pairs (kBf16 = not quantized).
enum class GemmFormat : uint8_t { kBf16, kFp8, kMxfp8, kNvfp4 };

// One GEMM operand [rows, K], K along the row (A is [M, K], W is [N, K]). Either a dense bf16
// matrix (fp32 values, rounded to bf16 RNE when decoded; bf16 values pass unchanged) or a
// quantized tensor whose rowwise copy is read. Views only: the storage must outlive the call.
struct GemmOperand {
  const QTensor* q = nullptr;     // quantized operand, or nullptr for dense bf16
  std::span<const float> dense;   // dense: [rows, cols] row-major
  int64_t rows = 0;               // dense only (a QTensor carries its own shape)
  int64_t cols = 0;
  std::string name = "operand";   // for error messages

  static GemmOperand bf16(std::span<const float> values, int64_t rows, int64_t cols,
                          std::string name) {
    return GemmOperand{nullptr, values, rows, cols, std::move(name)};
  }
  static GemmOperand quantized(const QTensor& q, std::string name) {
    return GemmOperand{&q, {}, q.rows, q.cols, std::move(name)};
  }
  GemmFormat format() const;
  int64_t n_rows() const { return q ? q->rows : rows; }
  int64_t n_cols() const { return q ? q->cols : cols; }
  std::string describe() const;  // "'w' [64, 256] nvfp4 per_row"
};

// FP8 1x128 / 128x128 operands scale each 128-wide k chunk by its own fp32 scale_inv.
constexpr int64_t kGemmChunk = 128;

// The exact decomposition of an operand (docs/gemm.md "Inner and outer values"):
//   bf16:  inner = bf16(x),                 outer = 1
//   nvfp4: inner = E2M1(q) * E4M3(s_b),     outer = S_dec of the row's domain
//   mxfp8: inner = E4M3(q) * 2^(e - 127),   outer = 1
//   fp8 per_tensor / per_row / per_group: inner = E4M3(q), outer = scale_inv of the row's domain
//   fp8 block_1x128 / block_128x128:      inner = E4M3(q), outer = 1,
//                                         chunk_scale[r, c] = scale_inv of (r, k chunk c)
struct DecodedOperand {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> inner;        // [rows, cols]
  std::vector<float> outer;        // [rows]
  bool chunked = false;            // fp8 block scaling: chunk_scale is present
  int64_t chunks = 0;              // cols / kGemmChunk when chunked
  std::vector<float> chunk_scale;  // [rows, chunks]
};

// Validates the operand (sizes of every part, block divisibility of K: nvfp4 16, mxfp8 32,
// fp8 blocks 128; mxfp8 needs its rowwise copy) and decodes rows [row0, row0 + count).
DecodedOperand decode_gemm_operand(const GemmOperand& op, int64_t row0, int64_t count);
inline DecodedOperand decode_gemm_operand(const GemmOperand& op) {
  return decode_gemm_operand(op, 0, op.n_rows());
}

}  // namespace lockstep
