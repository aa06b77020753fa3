// Deterministic non-zero benchmark inputs generated on the device (never time on zeros; a 256 MB
// input is not worth generating on the host): pseudo-normal bf16 tensors and packed operand bytes.
#pragma once

#include <cstdint>

#include "lockstep/tensor/tensor.h"

namespace lockstep::bench {

// [rows, cols] bf16 on `device`: a sum of four Philox uniforms per element, scaled to unit
// variance.
Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed, Device device);

// Fills `bytes` bytes at device address p: kind 0 any byte, 1 bf16 in +-[0.5, 1), 2 E4M3 block
// scales near 1, 3 E8M0 near 2^0, 4 E4M3 elements without NaN.
void fill_bytes_kind(void* p, size_t bytes, uint32_t seed, int kind);

}  // namespace lockstep::bench
