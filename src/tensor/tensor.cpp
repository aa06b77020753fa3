// Tensor construction, description and fp32 widening.
#include "lockstep/tensor/tensor.h"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/hd.h"

namespace lockstep {

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  int64_t n = 1;
  for (int64_t d : shape_) {
    if (d < 0) throw std::invalid_argument(fmt::format("negative dimension in shape {}", shape_string(shape_)));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw std::invalid_argument(fmt::format("shape {} overflows", shape_string(shape_)));
    n *= d;
  }
  size_t es = dtype_size(dtype_);
  if (n > 0 && size_t(n) > std::numeric_limits<size_t>::max() / es / 2)
    throw std::invalid_argument(fmt::format("shape {} overflows", shape_string(shape_)));
  numel_ = n;
  strides_.assign(shape_.size(), 1);
  for (int64_t i = int64_t(shape_.size()) - 2; i >= 0; --i) strides_[i] = strides_[i + 1] * shape_[i + 1];
  bytes_.assign(size_t(n) * es, std::byte{0});
}

int64_t Tensor::rows() const {
  if (shape_.size() != 2) throw std::invalid_argument(fmt::format("expected a 2-D tensor, got {}", describe()));
  return shape_[0];
}
int64_t Tensor::cols() const {
  if (shape_.size() != 2) throw std::invalid_argument(fmt::format("expected a 2-D tensor, got {}", describe()));
  return shape_[1];
}

void Tensor::check_elem_size(size_t size) const {
  if (size != dtype_size(dtype_))
    throw std::invalid_argument(fmt::format("typed view of element size {} on a {} tensor", size, dtype_name(dtype_)));
}

std::string Tensor::describe() const { return fmt::format("{} {}", shape_string(shape_), dtype_name(dtype_)); }

std::string shape_string(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  auto b = t.bytes();
  auto load16 = [&](size_t i) { return uint16_t(uint16_t(b[2 * i]) | uint16_t(b[2 * i + 1]) << 8); };
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
      throw std::invalid_argument(fmt::format("cannot read a {} tensor as floating point", dtype_name(t.dtype())));
  }
  return out;
}

Tensor from_f32(std::span<const float> values, std::vector<int64_t> shape, DType dtype) {
  Tensor t(dtype, std::move(shape));
  if (size_t(t.numel()) != values.size())
    throw std::invalid_argument(fmt::format("{} values do not fill shape {}", values.size(), shape_string(t.shape())));
  if (dtype == DType::kF32) {
    auto d = t.data<float>();
    std::copy(values.begin(), values.end(), d.begin());
  } else if (dtype == DType::kBF16) {
    auto d = t.data<uint16_t>();
    for (size_t i = 0; i < values.size(); ++i) d[i] = num::f32_to_bf16(values[i]);
  } else if (dtype == DType::kF16) {
    auto d = t.data<uint16_t>();
    for (size_t i = 0; i < values.size(); ++i) d[i] = num::f32_to_f16(values[i]);
  } else {
    throw std::invalid_argument(
        fmt::format("from_f32 writes F32, BF16 or F16, not {}", dtype_name(dtype)));
  }
  return t;
}

}  // namespace lockstep
