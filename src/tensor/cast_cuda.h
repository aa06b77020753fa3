// The CUDA kernel behind cast() (tensor/tensor.h) for device tensors (private to src/tensor):
// F32, BF16 and F16 to one another elementwise, with the host's conversions (numerics/hd.h:
// exact widening, RNE narrowing), on the thread's current stream.
#pragma once

#include <cstdint>

#include "lockstep/tensor/device.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::cuda {

// src: n elements of `from`, dst: n elements of `to` (both in {F32, BF16, F16}, distinct), on
// `device`.
void cast_cuda(const void* src, DType from, void* dst, DType to, int64_t n, Device device);

}  // namespace lockstep::cuda
