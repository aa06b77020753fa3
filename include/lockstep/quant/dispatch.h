// One dispatch point per quantizer op: the CPU reference API of quantize.h plus a Device.
// Device::kCuda runs the CUDA backend (quantize_cuda.h), which produces the same bytes; in a build
// without CUDA it throws std::runtime_error saying so.
#pragma once

#include <span>
#include <vector>

#include "lockstep/backend/device.h"
#include "lockstep/quant/quantize.h"

namespace lockstep {

QTensor quantize_on(Device d, const MatrixF32& x, const QuantSpec& spec);
QTensor quantize_grouped_on(Device d, const MatrixF32& x, std::span<const int64_t> offsets, const QuantSpec& spec);
std::vector<QTensor> quantize_nvfp4_joint_on(Device d, std::span<const MatrixF32> xs, const QuantSpec& spec);
std::vector<float> dequantize_on(Device d, const QTensor& q);
std::vector<float> dequantize_colwise_on(Device d, const QTensor& q);
std::vector<float> hadamard16_rows_on(Device d, const MatrixF32& x);

}  // namespace lockstep
