// The CPU reference quantizer, private to the quant layer: an fp32 matrix view of a host tensor,
// and the functions quantize.cpp dispatches to. These functions are the specification that the
// CUDA kernels are tested against byte for byte.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/quant/quantize.h"

namespace lockstep::cpu {

// A read-only fp32 view of a row-major [rows, cols] matrix, plus the largest finite value of the
// input's original dtype (see source_type_max).
struct MatrixF32 {
  std::span<const float> values;
  int64_t rows = 0;
  int64_t cols = 0;
  float type_max = 3.4028234663852886e38f;
  std::string name = "tensor";  // for error messages
};

// Widens a 2-D host F32 / BF16 / F16 tensor to fp32 (exact) into `storage`.
MatrixF32 as_matrix(const Tensor& t, std::vector<float>& storage, std::string_view name);

// Quantizes x (grouped when offsets is non-empty). joint_amax: NVFP4 joint quantization, the shared
// A of the rowwise copy (and joint_amax_col that of the columnwise copy), nullptr otherwise.
QTensor quantize(const MatrixF32& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                 const float* joint_amax = nullptr, const float* joint_amax_col = nullptr);

// The amax the rowwise / columnwise copy of an NVFP4 per_tensor quantization would use (the amax of
// x, or of its Hadamard-transformed rows / transposed rows), for joint quantization.
float nvfp4_tensor_amax(const MatrixF32& x, std::span<const int64_t> offsets, bool hadamard,
                        Copy copy);

// Reconstruct X [rows, cols] fp32 from one copy of a host QTensor.
std::vector<float> dequantize(const QTensor& q, Copy copy);

// The transform of CONTRACT.md section 6 along each row of x (cols % 16 == 0), bf16-rounded.
std::vector<float> hadamard16_rows(const MatrixF32& x);

// x^T as a row-major [cols, rows] matrix.
std::vector<float> transpose(const MatrixF32& x);

// The element codec and its largest magnitude for a config.
const num::MiniFloat& elem_codec(Format f, ElemCodec e);
float elem_max(Format f, ElemCodec e);

}  // namespace lockstep::cpu
