// The metadata of a quantization (format, scaling, element codec, layout, shape, groups) as every
// backend records it in a QTensor before writing its parts; private to src/quant.
#pragma once

#include <span>

#include "lockstep/quant/quantize.h"

namespace lockstep {

inline QTensor quantized_meta(const QuantConfig& cfg, int64_t rows, int64_t cols,
                              std::span<const int64_t> offsets) {
  QTensor q;
  q.format = cfg.format;
  q.scaling = cfg.scaling;
  q.elem = cfg.format == Format::kNvfp4 ? ElemCodec::kE4M3 : cfg.elem;
  q.block2d = cfg.block2d;
  q.hadamard = cfg.hadamard;
  q.scale_layout = cfg.scale_layout;
  q.rows = rows;
  q.cols = cols;
  q.group_offsets.assign(offsets.begin(), offsets.end());
  return q;
}

}  // namespace lockstep
