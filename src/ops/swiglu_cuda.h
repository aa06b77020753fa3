// CUDA kernels of SwiGLU (private; called by tensor_ops_swiglu.cpp in CUDA builds): the row
// functions of ops/swiglu.h on a warp per row, F32 device pointers, the thread's current stream.
#pragma once

#include <cstdint>

#include "lockstep/tensor/device.h"

namespace lockstep::ops {

// x: [rows, 2 * inter]; p: [rows] or nullptr; y: [rows, inter]. With y_bf16 set the output is
// stored there as bf16 (f32_to_bf16 of each fp32 value) and y is not written.
void swiglu_fwd_cuda(const float* x, const float* p, int64_t rows, int64_t inter, float* y,
                     uint16_t* y_bf16, Device device);
// dy: [rows, inter]; dx: [rows, 2 * inter]; dp: [rows] when p is given.
void swiglu_bwd_cuda(const float* x, const float* p, const float* dy, int64_t rows, int64_t inter,
                     float* dx, float* dp, Device device);

}  // namespace lockstep::ops
