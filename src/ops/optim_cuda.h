// CUDA kernels of the optimizer (private; called by tensor_ops_optim.cpp in CUDA builds): the
// AdamW element update of ops/optim.h with the updated weight's amax, and the global gradient norm
// in the order of ops/optim.h. F32 device pointers, the thread's current stream.
#pragma once

#include <cstdint>
#include <span>

#include "lockstep/ops/optim.h"
#include "lockstep/tensor/device.h"

namespace lockstep::ops {

// param, grad, m, v: [n]; amax: F32 [amax_domains] on the device or nullptr (amax_domains
// divides n; value d covers the d-th equal part). No host synchronisation.
void adamw_step_cuda(float* param, const float* grad, float* m, float* v, int64_t n,
                     const AdamWScalars<float>& s, float* amax, int64_t amax_domains,
                     Device device);
// ptrs[i]: sizes[i] F32 elements each. Chunk sums (a thread per chunk, elements staged through
// shared memory), then a thread per tensor and one for the total; returns sqrt(total) after one
// 8-byte device-to-host copy.
double grad_norm_cuda(std::span<const float* const> ptrs, std::span<const int64_t> sizes,
                      Device device);

}  // namespace lockstep::ops
