// The bridge between Python arrays and lockstep tensors: an object exporting DLPack (torch, NumPy,
// CuPy, JAX, a DLPack capsule) becomes a lockstep::Tensor over the same memory, and a lockstep
// Tensor leaves as a DLPack array over its own Storage, which it keeps alive. Neither direction
// copies bytes; what cannot be shared without a copy is refused with an error naming the tensor.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "lockstep/tensor/tensor.h"

namespace lockstep::py {

namespace nb = nanobind;

// A caller error in the Python API (raised as lockstep.Error, a ValueError): the message names
// the function, the argument and the rule.
class ArgError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The tensor over `obj`'s memory. `what` names it in errors ("quantize: x"). Rules: a DLPack
// array on the CPU or a CUDA device, row-major contiguous, of a dtype lockstep has; `as_dtype`
// reinterprets the bytes (same element size: a uint16 view of bf16, a uint8 view of FP8 codes).
Tensor tensor_from(nb::handle obj, std::string_view what,
                   std::optional<std::string_view> as_dtype = std::nullopt);

// A DLPack array (nanobind's ndarray object: __dlpack__, __dlpack_device__, the buffer protocol
// on the CPU) over t's bytes, keeping t's storage alive. FP8 / E8M0 dtypes leave as uint8.
nb::object to_array(const Tensor& t);

// The CUDA stream handle the Python layer resolved (0: the legacy default stream). Throws
// ArgError when the stream belongs to another device than `device` (CUDA builds that can ask).
Stream stream_for(uint64_t handle, Device device, std::string_view what);

// lockstep's spelling of a dtype ("f32", "bf16", "f16", "f64", "u8", ... or a safetensors name).
DType dtype_from_string(std::string_view name, std::string_view what);
// "cpu", "cuda", "cuda:N".
Device device_from_string(std::string_view name, std::string_view what);

}  // namespace lockstep::py
