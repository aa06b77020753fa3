// Tensor construction, views, copies between devices, description and dtype conversion.
#include "lockstep/tensor/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/hd.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "cast_cuda.h"
#endif

namespace lockstep {
namespace {

int64_t checked_numel(const std::vector<int64_t>& shape, size_t elem_size) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throw std::invalid_argument(
          fmt::format("negative dimension in shape {}", shape_string(shape)));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw std::invalid_argument(fmt::format("shape {} overflows", shape_string(shape)));
    n *= d;
  }
  if (n > 0 && size_t(n) > std::numeric_limits<size_t>::max() / elem_size / 2)
    throw std::invalid_argument(fmt::format("shape {} overflows", shape_string(shape)));
  return n;
}

// Copies a strided host tensor element by element into packed row-major order.
void gather_strided(const std::byte* src, const std::vector<int64_t>& shape,
                    const std::vector<int64_t>& strides, size_t es, std::byte* dst, int64_t numel) {
  const int64_t nd = int64_t(shape.size());
  std::vector<int64_t> idx(size_t(nd), 0);
  for (int64_t i = 0; i < numel; ++i) {
    int64_t off = 0;
    for (int64_t d = 0; d < nd; ++d) off += idx[size_t(d)] * strides[size_t(d)];
    std::memcpy(dst + size_t(i) * es, src + off * int64_t(es), es);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace

std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = int64_t(shape.size()) - 2; i >= 0; --i)
    s[size_t(i)] = s[size_t(i + 1)] * shape[size_t(i + 1)];
  return s;
}

Tensor Tensor::allocate(DType dtype, std::vector<int64_t> shape, Device device, Stream stream) {
  Tensor t;
  t.numel_ = checked_numel(shape, dtype_size(dtype));
  t.dtype_ = dtype;
  t.device_ = device;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = Storage::allocate(t.nbytes(), device, stream);
  return t;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape, Device device, Stream stream) {
  *this = allocate(dtype, std::move(shape), device, stream);
  lockstep::fill_bytes(raw(), device_, 0, nbytes(), stream);
}

Tensor Tensor::empty(DType dtype, std::vector<int64_t> shape, Device device, Stream stream) {
  return allocate(dtype, std::move(shape), device, stream);
}

Tensor Tensor::wrap(std::shared_ptr<Storage> storage, DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.numel_ = checked_numel(shape, dtype_size(dtype));
  t.dtype_ = dtype;
  if (!storage || storage->size() < t.nbytes())
    throw std::invalid_argument(
        fmt::format("Tensor::wrap: {} {} needs {} bytes, the storage holds {}", shape_string(shape),
                    dtype_name(dtype), t.nbytes(), storage ? storage->size() : 0));
  t.device_ = storage->device();
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = std::move(storage);
  return t;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  if (d < 0) d += nd;
  if (d < 0 || d >= nd)
    throw std::invalid_argument(fmt::format("dimension {} out of range for {}", d, describe()));
  return shape_[size_t(d)];
}

int64_t Tensor::rows() const {
  if (shape_.size() != 2)
    throw std::invalid_argument(fmt::format("expected a 2-D tensor, got {}", describe()));
  return shape_[0];
}
int64_t Tensor::cols() const {
  if (shape_.size() != 2)
    throw std::invalid_argument(fmt::format("expected a 2-D tensor, got {}", describe()));
  return shape_[1];
}

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape_[size_t(d)] != 1 && strides_[size_t(d)] != expect) return false;
    expect *= shape_[size_t(d)];
  }
  return true;
}

void* Tensor::base() const {
  if (!storage_ || !storage_->data()) return nullptr;
  return static_cast<std::byte*>(const_cast<void*>(storage_->data())) +
         offset_ * int64_t(dtype_size(dtype_));
}

void Tensor::check_elem_size(size_t size) const {
  if (size != dtype_size(dtype_))
    throw std::invalid_argument(
        fmt::format("typed view of element size {} on a {} tensor", size, dtype_name(dtype_)));
}

void Tensor::check_host_contiguous() const {
  if (!is_cpu())
    throw std::invalid_argument(
        fmt::format("host view of {}: copy it to the cpu first (to(Device::cpu()))", describe()));
  if (!is_contiguous())
    throw std::invalid_argument(
        fmt::format("host view of the strided tensor {}: call contiguous() first", describe()));
}

std::span<std::byte> Tensor::bytes() {
  check_host_contiguous();
  return {static_cast<std::byte*>(raw()), nbytes()};
}
std::span<const std::byte> Tensor::bytes() const {
  check_host_contiguous();
  return {static_cast<const std::byte*>(raw()), nbytes()};
}

Tensor Tensor::slice_rows(int64_t r0, int64_t r1) const {
  if (dim() < 1)
    throw std::invalid_argument(fmt::format("slice_rows of a 0-D tensor {}", describe()));
  if (r0 < 0 || r1 < r0 || r1 > shape_[0])
    throw std::invalid_argument(
        fmt::format("rows [{}, {}) out of range for {}", r0, r1, describe()));
  Tensor t = *this;
  t.shape_[0] = r1 - r0;
  t.offset_ = offset_ + r0 * strides_[0];
  t.numel_ = r1 - r0;
  for (size_t d = 1; d < shape_.size(); ++d) t.numel_ *= shape_[d];
  return t;
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  if (!is_contiguous())
    throw std::invalid_argument(
        fmt::format("view {} of the strided tensor {}: call contiguous() first",
                    shape_string(shape), describe()));
  if (checked_numel(shape, dtype_size(dtype_)) != numel_)
    throw std::invalid_argument(fmt::format("view {} does not have the {} elements of {}",
                                            shape_string(shape), numel_, describe()));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::transpose() const {
  if (dim() != 2)
    throw std::invalid_argument(fmt::format("transpose of a non-2-D tensor {}", describe()));
  Tensor t = *this;
  std::swap(t.shape_[0], t.shape_[1]);
  std::swap(t.strides_[0], t.strides_[1]);
  return t;
}

void Tensor::copy_from(const Tensor& src, Stream stream) {
  if (src.dtype_ != dtype_ || src.shape_ != shape_)
    throw std::invalid_argument(fmt::format("copy_from: {} into {}", src.describe(), describe()));
  if (!is_contiguous())
    throw std::invalid_argument(fmt::format("copy_from into the strided tensor {}", describe()));
  if (numel_ == 0) return;
  if (src.is_contiguous()) {
    copy_bytes(raw(), device_, src.raw(), src.device_, nbytes(), stream);
    return;
  }
  if (src.is_cpu()) {
    if (is_cpu()) {
      gather_strided(static_cast<const std::byte*>(src.raw()), src.shape_, src.strides_,
                     dtype_size(dtype_), static_cast<std::byte*>(raw()), numel_);
      return;
    }
    copy_from(src.contiguous(), stream);
    return;
  }
  // A strided device tensor: a 2-D view whose rows are contiguous (a column block) is a 2-D block
  // copy; anything else needs a device kernel, which copies do not have.
  if (dim() == 2 && src.strides_[1] == 1 && src.device_ == device_) {
    const size_t es = dtype_size(dtype_);
    copy_2d(raw(), size_t(shape_[1]) * es, src.raw(), size_t(src.strides_[0]) * es,
            size_t(shape_[1]) * es, size_t(shape_[0]), device_, stream);
    return;
  }
  throw std::invalid_argument(
      fmt::format("copy of the strided device tensor {}: not supported", src.describe()));
}

Tensor Tensor::contiguous(Stream stream) const {
  if (is_contiguous()) return *this;
  return clone(stream);
}

Tensor Tensor::clone(Stream stream) const {
  Tensor t = empty(dtype_, shape_, device_, stream);
  t.copy_from(*this, stream);
  return t;
}

Tensor Tensor::to(Device device, Stream stream) const {
  if (device == device_) return *this;
  Tensor t = empty(dtype_, shape_, device, stream);
  t.copy_from(*this, stream);
  return t;
}

void Tensor::fill_bytes(uint8_t value, Stream stream) {
  if (!is_contiguous())
    throw std::invalid_argument(fmt::format("fill_bytes of the strided tensor {}", describe()));
  lockstep::fill_bytes(raw(), device_, value, nbytes(), stream);
}

std::string Tensor::describe() const {
  std::string s = fmt::format("{} {}", shape_string(shape_), dtype_name(dtype_));
  if (!device_.is_cpu()) s += fmt::format(" {}", device_.str());
  return s;
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

std::vector<float> to_f32(const Tensor& t_in) {
  const Tensor t = t_in.contiguous();
  std::vector<float> out(size_t(t.numel()));
  auto b = t.bytes();
  auto load16 = [&](size_t i) {
    return uint16_t(uint16_t(b[2 * i]) | uint16_t(b[2 * i + 1]) << 8);
  };
  switch (t.dtype()) {
    case DType::kF32: {
      auto d = t.data<float>();
      std::copy(d.begin(), d.end(), out.begin());
      break;
    }
    case DType::kBF16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = num::bf16_to_f32(load16(i));
      break;
    case DType::kF16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = num::f16_to_f32(load16(i));
      break;
    case DType::kF64: {
      auto d = t.data<double>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = float(d[i]);
      break;
    }
    case DType::kF8E4M3:
      for (size_t i = 0; i < out.size(); ++i) out[i] = num::decode_e4m3(uint8_t(b[i]));
      break;
    case DType::kF8E5M2:
      for (size_t i = 0; i < out.size(); ++i) out[i] = num::decode_e5m2(uint8_t(b[i]));
      break;
    case DType::kF8E8M0:
      for (size_t i = 0; i < out.size(); ++i) out[i] = num::decode_e8m0(uint8_t(b[i]));
      break;
    default:
      throw std::invalid_argument(
          fmt::format("cannot read a {} tensor as floating point", dtype_name(t.dtype())));
  }
  return out;
}

Tensor from_f32(std::span<const float> values, std::vector<int64_t> shape, DType dtype) {
  Tensor t = Tensor::empty(dtype, std::move(shape));
  if (size_t(t.numel()) != values.size())
    throw std::invalid_argument(
        fmt::format("{} values do not fill shape {}", values.size(), shape_string(t.shape())));
  if (dtype == DType::kF32) {
    auto d = t.data<float>();
    std::copy(values.begin(), values.end(), d.begin());
  } else if (dtype == DType::kBF16) {
    auto d = t.data<uint16_t>();
    for (size_t i = 0; i < values.size(); ++i) d[i] = num::f32_to_bf16(values[i]);
  } else if (dtype == DType::kF64) {
    auto d = t.data<double>();
    for (size_t i = 0; i < values.size(); ++i) d[i] = double(values[i]);
  } else if (dtype == DType::kF16) {
    auto d = t.data<uint16_t>();
    for (size_t i = 0; i < values.size(); ++i) d[i] = num::f32_to_f16(values[i]);
  } else {
    throw std::invalid_argument(
        fmt::format("from_f32 writes F32, F64, BF16 or F16, not {}", dtype_name(dtype)));
  }
  return t;
}

namespace {
bool is_16_or_32(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }
}  // namespace

Tensor cast(const Tensor& t_in, DType dtype) {
  if (t_in.dtype() == dtype) return t_in;
  if (!t_in.is_cpu()) {
    // Device tensors: F32, BF16 and F16 to one another on the device, with the host's rules.
    if (!is_16_or_32(t_in.dtype()) || !is_16_or_32(dtype))
      throw std::invalid_argument(fmt::format("cast {} to {}: on {} only F32, BF16 and F16 convert",
                                              t_in.describe(), dtype_name(dtype),
                                              t_in.device().str()));
#if defined(LOCKSTEP_HAVE_CUDA)
    const Tensor t = t_in.contiguous();
    Tensor out = Tensor::empty(dtype, t.shape(), t.device());
    cuda::cast_cuda(t.raw(), t.dtype(), out.raw(), dtype, t.numel(), t.device());
    return out;
#else
    throw std::invalid_argument(
        fmt::format("cast of {}: this build has no CUDA backend", t_in.describe()));
#endif
  }
  const Tensor t = t_in.contiguous();
  if (dtype == DType::kF64) {
    Tensor out = Tensor::empty(dtype, t.shape());
    auto d = out.data<double>();
    if (t.dtype() == DType::kF32) {
      auto s = t.data<float>();
      std::copy(s.begin(), s.end(), d.begin());
    } else {
      const std::vector<float> f = to_f32(t);
      std::copy(f.begin(), f.end(), d.begin());
    }
    return out;
  }
  if (dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) {
    if (t.dtype() == DType::kF64 && dtype != DType::kF32) {
      // double -> bf16 in one rounding would need its own rule; the two-step path rounds twice,
      // so refuse rather than silently double-round.
      throw std::invalid_argument(
          fmt::format("cast {} to {}: cast to F32 first", t.describe(), dtype_name(dtype)));
    }
    return from_f32(to_f32(t), t.shape(), dtype);
  }
  throw std::invalid_argument(
      fmt::format("cast {} to {}: not supported", t.describe(), dtype_name(dtype)));
}

}  // namespace lockstep
