// The fast CPU rowwise quantizers: row kernels that read bf16 or fp32 rows in place (no fp32 copy
// of the tensor) and are vectorised for the instruction set of the machine they run on, and the
// entry that runs them over a tensor, parallel over rows. They produce exactly the bytes of the
// reference quantizer (quantize_cpu.cpp), which stays the specification and serves every
// configuration these do not cover. Private to src/quant.
#pragma once

#include <cstdint>
#include <span>

#include "lockstep/quant/quantize.h"

namespace lockstep::cpu {

// Whether quantize_rows applies: a contiguous host F32 / BF16 / F16 tensor, the rowwise copy only,
// RNE (no stochastic rounding), no Hadamard transform, and NVFP4 (per_tensor, per_row, per_group,
// 1-D or 2-D blocks), MXFP8, or FP8 per_tensor / per_row / per_group / block_1x128.
bool rows_path_applies(const Tensor& x, const QuantConfig& cfg);

// Quantizes x (validated by validate_quant_input, rows_path_applies true) into the rowwise copy,
// the same bytes as cpu::quantize. `nonfinite` receives the count of NaN and +-inf inputs.
// given_amax (NVFP4 per_tensor / per_group): the amax of each outer domain, used instead of
// reading x for it (quantize_with_amax).
QTensor quantize_rows(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                      int64_t& nonfinite, std::span<const float> given_amax = {});

namespace rows {

// The instruction sets the row kernels are built for (x86-64 with GCC; elsewhere only kBaseline),
// in increasing order. Every one produces the same bytes; the best the CPU supports runs unless a
// test forces another with set_isa (std::invalid_argument for one the CPU lacks).
enum class Isa { kBaseline, kAvx2, kAvx512 };
Isa best_isa();
Isa active_isa();
void set_isa(Isa isa);
const char* isa_name(Isa isa);

// Row kernels over S = uint16_t (bf16 bits) or float. Each returns the count of NaN and +-inf
// values it read; n and cols count elements.

// The largest amax key of n values (0 when n == 0 or all are NaN); see simd16_cpu.h.
template <class S>
uint32_t row_amax_key(const S* x, int64_t n);
// NVFP4 1-D blocks of one row (cols % 16 == 0) with the domain's outer factors: cols/16 compact
// E4M3 scale codes and cols/2 packed E2M1 bytes.
template <class S>
uint64_t nvfp4_row(const S* x, int64_t cols, float s_enc_x_inv_max, float s_dec, uint8_t* scales,
                   uint8_t* data);
// NVFP4 16x16 tiles of 16 rows (row stride cols): cols/16 scale codes shared by the 16 rows, and
// 16 rows of cols/2 packed bytes (row stride cols/2).
template <class S>
uint64_t nvfp4_tile_rows(const S* x, int64_t cols, float s_enc_x_inv_max, float s_dec,
                         uint8_t* scales, uint8_t* data);
// MXFP8 blocks of 32 of one row (cols % 32 == 0): cols/32 E8M0 exponents and cols E4M3 (or E5M2)
// codes; inv_max = RN(1 / element max).
template <class S>
uint64_t mxfp8_row(const S* x, int64_t cols, bool e5m2, float inv_max, uint8_t* scales,
                   uint8_t* data);
// FP8 codes of n values times one scale.
template <class S>
uint64_t fp8_scaled(const S* x, int64_t n, float scale, bool e5m2, uint8_t* data);

}  // namespace rows
}  // namespace lockstep::cpu
