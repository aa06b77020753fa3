// Content digests of byte strings and tensors (numerics/digest64.h defines the value), computed
// where the bytes live: a host loop for CPU tensors, a CUDA kernel for device tensors that returns
// only the 8-byte word sums, so checking a device tensor never copies its bytes to the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lockstep/tensor/tensor.h"

namespace lockstep {

// digest(B) of n host bytes at p (numerics/digest64.h): word terms summed, then digest_finish.
uint64_t bytes_digest64(const void* p, size_t n);
inline uint64_t bytes_digest64(std::string_view s) { return bytes_digest64(s.data(), s.size()); }

// digest(B) of each tensor's bytes in row-major order (a non-contiguous tensor is read through a
// contiguous copy on its device). CUDA tensors are hashed on their device, ordered on the
// thread's current stream: one kernel per tensor adds its word terms into a device slot, and one
// device-to-host copy of 8 bytes per tensor brings the sums back. An undefined tensor is an error.
std::vector<uint64_t> tensor_digests64(std::span<const Tensor> tensors);
inline uint64_t tensor_digest64(const Tensor& t) { return tensor_digests64({&t, 1}).front(); }

}  // namespace lockstep
