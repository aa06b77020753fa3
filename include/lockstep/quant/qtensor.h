// QTensor: a quantized 2-D tensor on any device, the one quantized type of lockstep. It holds a
// rowwise copy (blocks along rows) and an optional columnwise copy (for the backward GEMMs,
// CONTRACT.md section 12), each with its element codes, block scales and outer statistics, plus the
// metadata that says how to read them. Its bytes are exactly what CONTRACT.md sections 2-4, 7, 8,
// 11 and 12 define; every part is a Tensor on the QTensor's device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/quant/format.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

enum class ScaleLayout : uint8_t { kCompact, kSwizzled };

// Which copy of a quantized tensor an op reads: the rowwise copy (the tensor X [rows, cols], blocks
// along its rows) or the columnwise copy (X^T as a GEMM operand: blocks along X's columns).
enum class Copy : uint8_t { kRowwise, kColwise };

// One copy of a quantized tensor. The copy describes a matrix [mrows, mcols]: the rowwise copy of
// X [rows, cols] is [rows, cols]; an NVFP4 / FP8 columnwise copy is the quantization of X^T, so
// [cols, rows]; the MXFP8 columnwise copy keeps X's layout [rows, cols] with blocks of 32 running
// down each column (CONTRACT.md section 3). For grouped buffers, an NVFP4 / FP8 columnwise copy is
// the concatenation over groups of each group's X_g^T copy (group g's codes start at element
// cols * offsets[g]; its block scales, amax and scale_inv follow in group order), and its parts
// are 1-D.
struct QData {
  Tensor data;  // U8 codes: NVFP4 [m, k/2] (even column in the low nibble); FP8, MXFP8 [m, k]
  Tensor block_scale;  // U8 codes (NVFP4 E4M3, MXFP8 E8M0). Compact: [scale_rows, scale_cols];
                       // swizzled (section 7): 1-D, padded to roundup(rows,128) x roundup(cols,4)
  Tensor amax;         // F32, NVFP4: the outer statistic A of each domain [domains]
  Tensor scale_inv;    // F32, FP8: RN(1 / scale) of each domain or block [scale_rows, scale_cols]
  int64_t scale_rows = 0;  // logical block-scale grid (NVFP4, MXFP8) or scale_inv grid (FP8)
  int64_t scale_cols = 0;
  bool defined() const { return data.defined(); }
};

struct QTensor {
  Format format = Format::kNvfp4;
  Scaling scaling = Scaling::kPerTensor;
  ElemCodec elem = ElemCodec::kE4M3;  // FP8 / MXFP8 only; NVFP4 is always E2M1
  bool block2d = false;               // NVFP4 16x16 weight blocks
  bool hadamard = false;              // NVFP4: values were Hadamard-transformed (section 6)
  ScaleLayout scale_layout = ScaleLayout::kCompact;
  int64_t rows = 0;  // logical shape [rows, cols] of the source tensor X
  int64_t cols = 0;
  DType source_dtype = DType::kF32;  // the dtype X was quantized from

  QData rowwise;  // empty when only the columnwise copy was asked for
  QData colwise;  // empty unless asked for

  // Grouped (MoE) buffers: offsets[g]..offsets[g+1] are group g's rows (empty when ungrouped).
  // Host metadata; device kernels receive them through their own launch arguments.
  std::vector<int64_t> group_offsets;

  bool has_rowwise() const { return rowwise.defined(); }
  bool has_colwise() const { return colwise.defined(); }
  const QData& copy(Copy c) const { return c == Copy::kRowwise ? rowwise : colwise; }
  // The device of the copies (the CPU for an empty QTensor).
  Device device() const;
  // A copy of every part on `device` (this QTensor's parts are shared when already there).
  QTensor to(Device device, Stream stream = {}) const;
  // "[64, 256] nvfp4 per_row" (plus " colwise" / " cuda:0").
  std::string describe() const;
};

// The quantization choice q records (format, scaling, elem, block2d, hadamard); pow2, eps and
// stochastic rounding leave no mark in the bytes' layout and read as their defaults.
QuantSpec quant_spec(const QTensor& q);

// Group g of a grouped QTensor as an ungrouped QTensor [rows_g, cols] of views (no copy): rowwise
// rows of the group, the group's columnwise piece reshaped to its 2-D shape; per_group scaling
// becomes the group's single per_tensor domain. Needs compact scales. Throws QuantError otherwise.
QTensor group_view(const QTensor& q, int64_t g);

// Number of outer domains (NVFP4 amax / FP8 per-tensor, per-row, per-group scale_inv entries) of
// the rowwise copy: 1 per tensor, rows per row, groups per group.
int64_t rowwise_domains(const QTensor& q);
// The outer domain of row r of the rowwise copy (per tensor 0, per row r, per group its group).
int64_t rowwise_domain_of(const QTensor& q, int64_t r);

}  // namespace lockstep
