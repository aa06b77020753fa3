// CUDA kernels of the elementwise helpers of ops/tensor_ops.h (private; called by
// tensor_ops_elementwise.cpp in CUDA builds): the expressions of ops/elementwise.h, F32 device
// pointers, the thread's current stream, no host synchronisation.
#pragma once

#include <cstdint>

#include "lockstep/tensor/device.h"

namespace lockstep::ops {

// y[i] = x[i] * s (y may alias x).
void scale_cuda(const float* x, float s, int64_t n, float* y, Device device);
// y[i] = a[i] + b[i] (y may alias a).
void add_cuda(const float* a, const float* b, int64_t n, float* y, Device device);
// x[i] = round_bf16(x[i]).
void round_bf16_cuda(float* x, int64_t n, Device device);
// x[i] = sigmoid(x[i]).
void sigmoid_cuda(float* x, int64_t n, Device device);
// x: [rows, d]; a: [rows]; y[r, c] = a[r] * x[r, c]. A block per row.
void scale_rows_cuda(const float* x, const float* a, int64_t rows, int64_t d, float* y,
                     Device device);
// a, b: [rows, d]; y: [rows]. A warp per row (row_dot_row).
void row_dot_cuda(const float* a, const float* b, int64_t rows, int64_t d, float* y, Device device);

}  // namespace lockstep::ops
