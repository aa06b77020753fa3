// Private helpers of the Tensor-level op entries (tensor_ops_*.cpp): argument checks that name the
// op and the tensor, the device every operand of one call must share, the dtype dispatch, and the
// guard that routes a CUDA tensor to its kernel (or to a clear error in a build without CUDA).
#pragma once

#include <fmt/format.h>

#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "lockstep/ops/tensor_ops.h"

namespace lockstep::ops::detail {

inline void check(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}
// The message built only when the check fails: every op entry checks its arguments on every call
// (a training step calls thousands), and formatting tensor descriptions costs more than a small
// op's work.
template <class F>
requires std::is_invocable_r_v<std::string, F&>
inline void check(bool ok, F&& msg) {
  if (!ok) throw std::invalid_argument(msg());
}

inline bool is_f64(const Tensor& t) { return t.dtype() == DType::kF64; }

// A floating operand: F32 or F64 on the CPU, F32 on CUDA (F64 is the CPU's gradient-check path);
// contiguous (a packed copy on the same device otherwise).
inline Tensor operand(const Tensor& t, std::string_view op, std::string_view name) {
  check(t.defined(), [&] { return fmt::format("{}: tensor '{}' is undefined", op, name); });
  check(t.dtype() == DType::kF32 || t.dtype() == DType::kF64, [&] {
    return fmt::format("{}: tensor '{}' {} must be F32 or F64", op, name, t.describe());
  });
  if (t.is_cuda() && t.dtype() == DType::kF64)
    throw DeviceNotSupported(fmt::format(
        "{}: tensor '{}' {} is F64 on {}; float64 runs on the CPU only (gradient checks)", op, name,
        t.describe(), t.device().str()));
  return t.contiguous();
}

// An in-place operand: defined, F32 / F64 (F32 on CUDA), contiguous.
inline void inplace_operand(const Tensor& x, std::string_view op, std::string_view name) {
  operand(x, op, name);
  check(x.is_contiguous(), [&] {
    return fmt::format("{}: tensor '{}' {} must be contiguous (it is written in place)", op, name,
                       x.describe());
  });
}

// An I32 index operand (token ids, targets, positions), contiguous.
inline Tensor index_operand(const Tensor& t, std::string_view op, std::string_view name) {
  check(t.defined(), [&] { return fmt::format("{}: tensor '{}' is undefined", op, name); });
  check(t.dtype() == DType::kI32,
        [&] { return fmt::format("{}: tensor '{}' {} must be I32", op, name, t.describe()); });
  return t.contiguous();
}

// The same, for entries without a CUDA kernel: DeviceNotSupported for a tensor off the CPU.
inline Tensor cpu_operand(const Tensor& t, std::string_view op, std::string_view name) {
  require_cpu(t, op, name);
  return operand(t, op, name);
}
inline Tensor cpu_index_operand(const Tensor& t, std::string_view op, std::string_view name) {
  require_cpu(t, op, name);
  return index_operand(t, op, name);
}

// The output dtype an op was asked for: x's own (nullopt), or BF16 from an F32 x (the input of a
// bf16 GEMM operand written by its producer: CUDA kernels store bf16, the CPU casts its F32
// output, the same bits).
inline DType output_dtype(const Tensor& x, std::optional<DType> out, std::string_view op) {
  const DType y = out.value_or(x.dtype());
  check(y == x.dtype() || (y == DType::kBF16 && x.dtype() == DType::kF32), [&] {
    return fmt::format("{}: an output of {} from {} (its dtype, or BF16 from F32)", op,
                       dtype_name(y), x.describe());
  });
  return y;
}

inline void same_dtype(const Tensor& a, const Tensor& b, std::string_view op) {
  check(a.dtype() == b.dtype(), [&] {
    return fmt::format("{}: dtypes differ ({} and {})", op, a.describe(), b.describe());
  });
}

// The one device of a call's tensors (undefined ones are skipped); std::invalid_argument naming
// the first tensor on another device. Outputs are allocated there.
inline Device same_device(std::string_view op,
                          std::initializer_list<std::pair<const Tensor*, std::string_view>> ts) {
  const Tensor* first = nullptr;
  std::string_view first_name;
  for (const auto& [t, name] : ts) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      first_name = name;
    } else if (t->device() != first->device()) {
      throw std::invalid_argument(fmt::format(
          "{}: tensor '{}' {} is on {} but '{}' is on {}; an op runs where all of its tensors "
          "live (move one with to())",
          op, name, t->describe(), t->device().str(), first_name, first->device().str()));
    }
  }
  return first ? first->device() : Device::cpu();
}

// Calls f(T{}) with T = float or double as `t`'s dtype says.
template <class F>
decltype(auto) by_dtype(const Tensor& t, F&& f) {
  if (is_f64(t)) return f(double{});
  return f(float{});
}

inline int64_t rows_of(const Tensor& t, int64_t d) { return d == 0 ? 0 : t.numel() / d; }

}  // namespace lockstep::ops::detail

// In an entry: `if (dev.is_cuda()) { LOCKSTEP_OPS_CUDA(op, kernel call); return ...; }` runs the
// kernel call in CUDA builds and throws DeviceNotSupported naming the op otherwise (a CUDA tensor
// cannot exist in such a build, so that branch is for completeness).
#if defined(LOCKSTEP_HAVE_CUDA)
#define LOCKSTEP_OPS_CUDA(op, ...) __VA_ARGS__
#else
#define LOCKSTEP_OPS_CUDA(op, ...) \
  throw ::lockstep::ops::DeviceNotSupported(std::string(op) + ": this build has no CUDA backend")
#endif
