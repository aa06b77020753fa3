// CUDA kernels of RMSNorm and rotary embedding (private; called by tensor_ops_norm.cpp in CUDA
// builds). Raw device pointers of F32 data on `device`, launched on the thread's current stream;
// no host synchronisation. The row functions are those of ops/rmsnorm.h and ops/rope.h.
#pragma once

#include <cstdint>

#include "lockstep/tensor/device.h"

namespace lockstep::ops {

// x, y: [rows, d] (y may alias x when res is null); w: [d]; rstd: [rows]. A warp per row (a block
// per row up to 1024 rows). With y_bf16 set the rows are stored there as bf16 (f32_to_bf16 of
// each fp32 value) and y is not written. With a residual res [rows, d] (else null; must not alias
// x or y) each row of x first becomes x + res in place, then is normalised: add_inplace and
// rmsnorm in one kernel.
void rmsnorm_fwd_cuda(float* x, const float* res, const float* w, int64_t rows, int64_t d,
                      float eps, float* y, uint16_t* y_bf16, float* rstd, Device device);
// dy, x, dx: [rows, d]; w: [d]; rstd: [rows]; dw: [d]. dx a warp per row; dw as chunk partials
// (a thread per (chunk, column)) in pool scratch, then a thread per column.
void rmsnorm_bwd_cuda(const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t rows, int64_t d, float* dx, float* dw, Device device);
// x: [tokens, heads, head_dim], in place; positions: [tokens] on the device; cos, sin:
// [max_pos, head_dim]. A thread per rotated pair; a position outside [0, max_pos) makes its
// token's rows NaN.
void rope_cuda(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
               const float* cos, const float* sin, int64_t max_pos, bool backward, Device device);

}  // namespace lockstep::ops
