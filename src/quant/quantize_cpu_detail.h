// Building blocks of the CPU reference quantizer shared by its rowwise, columnwise and dequantize
// sources (private to src/quant/).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/quant/layout.h"
#include "quantize_cpu.h"

namespace lockstep::cpu::detail {

// Encodes one scaled element: RNE, or stochastic with the element's Philox word (index = the
// element's row-major index in the copy it belongs to).
uint8_t encode_elem(const num::MiniFloat& f, const QuantConfig& cfg, float v, uint64_t index);
// amax (CONTRACT.md section 0) of n values; of rows [r0, r1) of x (parallel, order-independent).
float amax_of(const float* p, int64_t n);
float amax_rows(const MatrixF32& x, int64_t r0, int64_t r1);
std::string where(std::string_view name, int64_t rows, int64_t cols);
// The outer domain of each row, and the amax of each domain, for a scaling.
std::vector<int64_t> row_domains(int64_t rows, std::span<const int64_t> offsets, Scaling s);
std::vector<float> domain_amax(const MatrixF32& x, std::span<const int64_t> offsets, Scaling s);

Tensor host_u8(std::vector<int64_t> shape);
Tensor host_f32(std::span<const float> v, std::vector<int64_t> shape);
void alloc_scales(QData& q, int64_t srows, int64_t scols, ScaleLayout layout);

// Reads and writes block-scale (r, c) of a copy in its layout (CONTRACT.md section 7).
inline ScaleView scale_access(QData& q, ScaleLayout layout) {
  return scale_view(q.block_scale.ptr<uint8_t>(), q.scale_cols, layout == ScaleLayout::kSwizzled);
}
// The same for reading an existing copy.
inline uint8_t load_scale(const QData& q, ScaleLayout layout, int64_t r, int64_t c) {
  return scale_view(const_cast<uint8_t*>(q.block_scale.ptr<uint8_t>()), q.scale_cols,
                    layout == ScaleLayout::kSwizzled)
      .load(r, c);
}

// Rowwise quantizers of x into one copy. nvfp4_rows: amax per domain and the domain of each row
// given; index_base offsets the stochastic-rounding element index.
void nvfp4_rows(const MatrixF32& x, const QuantConfig& cfg, std::span<const float> amax,
                std::span<const int64_t> dom, uint64_t index_base, QData& q);
void mxfp8_rows(const MatrixF32& x, const QuantConfig& cfg, QData& q);
void mxfp8_cols(const MatrixF32& x, const QuantConfig& cfg, QData& q);
void fp8_rows(const MatrixF32& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
              uint64_t index_base, QData& q);

}  // namespace lockstep::cpu::detail
