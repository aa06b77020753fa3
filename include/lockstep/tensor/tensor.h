// Tensor: the one n-dimensional array type of lockstep. It carries its device (cpu, cuda:N), dtype,
// shape and strides (in elements), and shares its bytes (a Storage) with every view made of it:
// row ranges of packed batches and expert slices, reshapes, transposes. Copying a Tensor copies
// the view, not the bytes; clone() and to() copy bytes. Moving between devices is always explicit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/tensor/device.h"
#include "lockstep/tensor/dtype.h"
#include "lockstep/tensor/storage.h"

namespace lockstep {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled contiguous tensor on `device`. Throws std::invalid_argument on a negative
  // dimension or a byte count that overflows.
  Tensor(DType dtype, std::vector<int64_t> shape, Device device = Device::cpu(),
         Stream stream = {});
  // Uninitialised contiguous tensor (for outputs every element of which an op writes).
  static Tensor empty(DType dtype, std::vector<int64_t> shape, Device device = Device::cpu(),
                      Stream stream = {});
  // A contiguous tensor of `dtype` x `shape` over the first bytes of `storage` (no copy; the
  // storage is shared, e.g. a memory-mapped file region). Throws std::invalid_argument when the
  // storage holds fewer bytes than the shape needs.
  static Tensor wrap(std::shared_ptr<Storage> storage, DType dtype, std::vector<int64_t> shape);
  // A host tensor holding a copy of `values` (element type T must match dtype's size).
  template <class T>
  static Tensor from_vector(std::span<const T> values, std::vector<int64_t> shape, DType dtype) {
    Tensor t(dtype, std::move(shape));
    t.check_elem_size(sizeof(T));
    if (size_t(t.numel()) != values.size())
      throw std::invalid_argument("from_vector: " + std::to_string(values.size()) +
                                  " values do not fill " + t.describe());
    std::copy(values.begin(), values.end(), t.data<T>().begin());
    return t;
  }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cpu() const { return device_.is_cpu(); }
  bool is_cuda() const { return device_.is_cuda(); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }  // in elements
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
  // Rows and columns of a 2-D tensor (throws if the tensor is not 2-D).
  int64_t rows() const;
  int64_t cols() const;
  bool is_contiguous() const;

  // Address of the first element, on the tensor's device.
  void* raw() { return base(); }
  const void* raw() const { return base(); }
  // Typed pointer on the tensor's device; T's size must equal the dtype's element size.
  template <class T>
  T* ptr() {
    check_elem_size(sizeof(T));
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* ptr() const {
    check_elem_size(sizeof(T));
    return static_cast<const T*>(raw());
  }

  // Host views of a contiguous CPU tensor (throw otherwise).
  std::span<std::byte> bytes();
  std::span<const std::byte> bytes() const;
  template <class T>
  std::span<T> data() {
    check_host_contiguous();
    return {ptr<T>(), size_t(numel_)};
  }
  template <class T>
  std::span<const T> data() const {
    check_host_contiguous();
    return {ptr<T>(), size_t(numel_)};
  }

  // Views (no copy). slice_rows: rows [r0, r1) along dimension 0. view: a new shape with the same
  // element count (contiguous tensors only). transpose: a 2-D tensor with its two strides swapped.
  Tensor slice_rows(int64_t r0, int64_t r1) const;
  Tensor view(std::vector<int64_t> shape) const;
  Tensor transpose() const;

  // Copies. contiguous(): this tensor if already contiguous, else a packed copy on the same
  // device. clone(): always a packed copy. to(): this tensor if it is on `device` already, else a
  // packed copy there, ordered on `stream` (a copy to the host waits for its bytes).
  Tensor contiguous(Stream stream = {}) const;
  Tensor clone(Stream stream = {}) const;
  Tensor to(Device device, Stream stream = {}) const;
  // Copies the bytes of `src` (same dtype and shape, any devices, any strides on the CPU) into
  // this tensor.
  void copy_from(const Tensor& src, Stream stream = {});
  // Sets every byte of a contiguous tensor to `value`.
  void fill_bytes(uint8_t value, Stream stream = {});

  // "[4, 16] BF16" (plus " cuda:0" off the CPU).
  std::string describe() const;

  void check_elem_size(size_t size) const;

 private:
  void* base() const;
  void check_host_contiguous() const;
  static Tensor allocate(DType dtype, std::vector<int64_t> shape, Device device, Stream stream);

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements from the storage's start
  DType dtype_ = DType::kF32;
  Device device_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  int64_t numel_ = 0;
};

// Shape as text: "[4, 16]".
std::string shape_string(std::span<const int64_t> shape);
// Contiguous row-major strides of `shape`, in elements.
std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape);

// The elements of a floating host tensor (F32, BF16, F16, F64, F8 types) widened to fp32
// (F64 rounds to nearest; every other widening is exact), in row-major order.
std::vector<float> to_f32(const Tensor& t);
// A new host tensor of dtype F32, F64, BF16 or F16 (both RNE; F16 overflows to +-inf beyond
// 65504) holding `values` with the given shape.
Tensor from_f32(std::span<const float> values, std::vector<int64_t> shape,
                DType dtype = DType::kF32);
// A tensor converted to another floating dtype, rounding to nearest even where the target is
// narrower, on the tensor's device: host tensors among F32, F64, BF16, F16 (and from the F8 types),
// CUDA tensors among F32, BF16, F16 (a kernel ordered on the thread's current stream, the same
// bits as the host). Returns `t` itself when the dtype already matches.
Tensor cast(const Tensor& t, DType dtype);

}  // namespace lockstep
