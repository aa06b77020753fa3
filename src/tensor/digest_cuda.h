// The CUDA kernel behind tensor_digests64 (tensor/digest.h), private to src/tensor: the word-term
// sums (numerics/digest64.h) of several device byte ranges, on the thread's current stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "lockstep/tensor/device.h"

namespace lockstep::cuda {

// sums[i] = the sum mod 2^64 of the word terms of the n[i] bytes at p[i] (any alignment, n = 0
// allowed), all on `device`; returns after the sums reached the host (one copy).
void digest_word_sums(std::span<const void* const> p, std::span<const size_t> n, Device device,
                      std::span<uint64_t> sums);

}  // namespace lockstep::cuda
