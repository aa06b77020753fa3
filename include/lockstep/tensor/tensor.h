// Tensor: a dense, contiguous, row-major host tensor that owns its bytes (dtype, shape, strides).
// It is the unit of safetensors I/O and the input/output of the CPU reference ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/tensor/dtype.h"

namespace lockstep {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled contiguous tensor. Throws std::invalid_argument on a negative dimension or a
  // byte count that overflows.
  Tensor(DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  // Strides in elements; always the contiguous row-major strides for now.
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return bytes_.size(); }
  // Rows and columns of a 2-D tensor (throws if the tensor is not 2-D).
  int64_t rows() const;
  int64_t cols() const;

  std::span<std::byte> bytes() { return bytes_; }
  std::span<const std::byte> bytes() const { return bytes_; }

  // Typed view; T's size must equal the dtype's element size.
  template <class T>
  std::span<T> data() {
    check_elem_size(sizeof(T));
    return {reinterpret_cast<T*>(bytes_.data()), size_t(numel_)};
  }
  template <class T>
  std::span<const T> data() const {
    check_elem_size(sizeof(T));
    return {reinterpret_cast<const T*>(bytes_.data()), size_t(numel_)};
  }

  // "[4, 16] BF16"
  std::string describe() const;

 private:
  void check_elem_size(size_t size) const;

  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  int64_t numel_ = 0;
  std::vector<std::byte> bytes_;
};

// Shape as text: "[4, 16]".
std::string shape_string(std::span<const int64_t> shape);

// Element i of a floating tensor widened exactly to fp32 (F32, BF16, F16, F8 types).
// F64 is rounded to nearest. Throws for non-floating dtypes.
std::vector<float> to_f32(const Tensor& t);
// A new tensor of dtype F32, BF16 or F16 (both RNE; F16 overflows to +-inf beyond 65504)
// holding `values` with the given shape.
Tensor from_f32(std::span<const float> values, std::vector<int64_t> shape, DType dtype = DType::kF32);

}  // namespace lockstep
