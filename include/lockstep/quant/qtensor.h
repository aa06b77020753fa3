// QTensor: a quantized 2-D tensor (packed element codes, block scales compact or swizzled, outer
// amax or fp32 scale_inv, optional MXFP8 columnwise copy, group offsets for MoE buffers).
// Its bytes are exactly what CONTRACT.md sections 2-4, 7, 8 and 11 define.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/quant/format.h"

namespace lockstep {

enum class ScaleLayout : uint8_t { kCompact, kSwizzled };

enum class ElemCodec : uint8_t { kE4M3, kE5M2 };  // FP8 / MXFP8 element choice

struct QTensor {
  Format format = Format::kNvfp4;
  Scaling scaling = Scaling::kPerTensor;
  ElemCodec elem = ElemCodec::kE4M3;  // FP8 / MXFP8 only; NVFP4 is always E2M1
  bool block2d = false;               // NVFP4 16x16 weight blocks
  int64_t rows = 0;                   // logical shape [rows, cols]
  int64_t cols = 0;

  // Row-major element codes: NVFP4 [rows, cols/2] bytes (even column in the low nibble),
  // FP8/MXFP8 [rows, cols].
  std::vector<uint8_t> data;

  // Block scales (NVFP4: E4M3 codes [rows, cols/16]; MXFP8: E8M0 codes [rows, cols/32]).
  // Compact: row-major [scale_rows, scale_cols]. Swizzled: CONTRACT.md section 7, padded to
  // [roundup(scale_rows, 128), roundup(scale_cols, 4)]; scale_rows/cols stay the logical sizes.
  std::vector<uint8_t> block_scale;
  int64_t scale_rows = 0;
  int64_t scale_cols = 0;
  ScaleLayout scale_layout = ScaleLayout::kCompact;

  // NVFP4: the stored outer statistic A, one per domain ([1] per tensor, [rows] per row,
  // [groups] per group).
  std::vector<float> amax;

  // FP8: RN(1 / scale) per domain: [1] per tensor, [rows] per row,
  // [rows, ceil(cols/128)] for 1x128, [ceil(rows/128), ceil(cols/128)] for 128x128.
  std::vector<float> scale_inv;
  int64_t scale_inv_rows = 0;
  int64_t scale_inv_cols = 0;

  // MXFP8 columnwise copy: data [rows, cols] (blocks run down columns), E8M0 scales
  // [rows/32, cols]. Empty when not requested.
  std::vector<uint8_t> data_colwise;
  std::vector<uint8_t> block_scale_colwise;
  bool has_rowwise = true;

  // Grouped (MoE) buffers: offsets[g]..offsets[g+1] are group g's rows (empty when ungrouped).
  std::vector<int64_t> group_offsets;
};

}  // namespace lockstep
