// DLPack arrays <-> lockstep tensors without copies (bridge.h).
#include "bridge.h"

#include <fmt/format.h>

#include <memory>
#include <vector>

#include "lockstep/tensor/storage.h"

#if defined(LOCKSTEP_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace lockstep::py {
namespace {

using Code = nb::dlpack::dtype_code;
using In = nb::ndarray<nb::ro>;

std::optional<DType> dtype_of(nb::dlpack::dtype d) {
  if (d.lanes != 1) return std::nullopt;
  const auto code = Code(d.code);
  switch (code) {
    case Code::Float:
      if (d.bits == 16) return DType::kF16;
      if (d.bits == 32) return DType::kF32;
      if (d.bits == 64) return DType::kF64;
      break;
    case Code::Bfloat:
      if (d.bits == 16) return DType::kBF16;
      break;
    case Code::Int:
      if (d.bits == 8) return DType::kI8;
      if (d.bits == 16) return DType::kI16;
      if (d.bits == 32) return DType::kI32;
      if (d.bits == 64) return DType::kI64;
      break;
    case Code::UInt:
      if (d.bits == 8) return DType::kU8;
      if (d.bits == 16) return DType::kU16;
      if (d.bits == 32) return DType::kU32;
      if (d.bits == 64) return DType::kU64;
      break;
    case Code::Bool:
      if (d.bits == 8) return DType::kBool;
      break;
    case Code::Float8_E4M3FN:
      return DType::kF8E4M3;
    case Code::Float8_E5M2:
      return DType::kF8E5M2;
    case Code::Float8_E8M0FNU:
      return DType::kF8E8M0;
    default:
      break;
  }
  return std::nullopt;
}

nb::dlpack::dtype dlpack_of(DType t) {
  auto make = [](Code c, int bits) { return nb::dlpack::dtype{uint8_t(c), uint8_t(bits), 1}; };
  switch (t) {
    case DType::kBool:
      return make(Code::Bool, 8);
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return make(Code::UInt, 8);
    case DType::kI8:
      return make(Code::Int, 8);
    case DType::kU16:
      return make(Code::UInt, 16);
    case DType::kI16:
      return make(Code::Int, 16);
    case DType::kF16:
      return make(Code::Float, 16);
    case DType::kBF16:
      return make(Code::Bfloat, 16);
    case DType::kU32:
      return make(Code::UInt, 32);
    case DType::kI32:
      return make(Code::Int, 32);
    case DType::kF32:
      return make(Code::Float, 32);
    case DType::kU64:
      return make(Code::UInt, 64);
    case DType::kI64:
      return make(Code::Int, 64);
    case DType::kF64:
      return make(Code::Float, 64);
    default:
      break;
  }
  throw std::logic_error("dlpack_of: dtype");
}

std::string dlpack_name(nb::dlpack::dtype d) {
  return fmt::format("DLPack dtype code {} with {} bits x {} lanes", int(d.code), int(d.bits),
                     int(d.lanes));
}

std::string shape_of(const In& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = int64_t(a.shape(i));
  return shape_string(s);
}

}  // namespace

Tensor tensor_from(nb::handle obj, std::string_view what,
                   std::optional<std::string_view> as_dtype) {
  In a;
  if (!nb::try_cast<In>(obj, a, /*convert=*/false))
    throw ArgError(fmt::format(
        "{}: a {} is not an array; pass a torch.Tensor, numpy.ndarray or another object with "
        "__dlpack__",
        what, nb::inst_name(obj).c_str()));
  Device device;
  if (a.device_type() == nb::device::cpu::value) {
    device = Device::cpu();
  } else if (a.device_type() == nb::device::cuda::value) {
    device = Device::cuda(a.device_id());
  } else {
    throw ArgError(
        fmt::format("{}: arrays on DLPack device type {} are not supported (cpu or "
                    "cuda only; copy it to one of them first)",
                    what, a.device_type()));
  }
  std::optional<DType> dt = dtype_of(a.dtype());
  if (!dt)
    throw ArgError(
        fmt::format("{}: {} has no lockstep dtype (float32, bfloat16, float16, "
                    "float64, integers, bool, float8)",
                    what, dlpack_name(a.dtype())));
  if (as_dtype) {
    const DType to = dtype_from_string(*as_dtype, what);
    if (dtype_size(to) != dtype_size(*dt))
      throw ArgError(fmt::format("{}: cannot view {} elements of {} byte(s) as {} ({} bytes)", what,
                                 dtype_name(*dt), dtype_size(*dt), dtype_name(to), dtype_size(to)));
    dt = to;
  }
  std::vector<int64_t> shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = int64_t(a.shape(i));
  // Row-major contiguous (dimensions of extent 1 may carry any stride).
  int64_t expect = 1;
  bool empty = false;
  for (int64_t e : shape) empty = empty || e == 0;
  for (size_t i = a.ndim(); i-- > 0 && !empty;) {
    if (shape[i] != 1 && a.stride(i) != expect) {
      std::vector<int64_t> strides(a.ndim());
      for (size_t j = 0; j < a.ndim(); ++j) strides[j] = a.stride(j);
      throw ArgError(fmt::format(
          "{}: {} {} is not row-major contiguous (strides {} elements; lockstep reads rows in "
          "place): pass x.contiguous() (torch) or np.ascontiguousarray(x)",
          what, shape_of(a), dtype_name(*dt), shape_string(strides)));
    }
    expect *= shape[i];
  }
  const size_t bytes = size_t(a.size()) * dtype_size(*dt);
  // The DLPack producer's memory stays alive while any lockstep view of it does. The last
  // reference may go away without the GIL (a worker thread, a released-GIL call), so the
  // release takes it.
  auto keep = std::shared_ptr<const void>(new In(a), [](const void* p) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
    nb::gil_scoped_acquire gil;
    delete static_cast<const In*>(p);
  });
  void* ptr = const_cast<void*>(static_cast<const void*>(a.data()));
  if (bytes == 0 && ptr == nullptr) return Tensor(*dt, shape, device);
  return Tensor::wrap(Storage::wrap(ptr, bytes, device, std::move(keep)), *dt, std::move(shape));
}

nb::object to_array(const Tensor& t) {
  if (!t.defined()) return nb::none();
  if (!t.is_contiguous()) throw std::logic_error("to_array: a non-contiguous tensor");
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const int dev = t.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  nb::ndarray<nb::array_api> out(keep->raw(), shape.size(), shape.data(), owner, nullptr,
                                 dlpack_of(t.dtype()), dev, t.device().index);
  return nb::cast(out, nb::rv_policy::reference);
}

Stream stream_for(uint64_t handle, Device device, std::string_view what) {
  Stream s{reinterpret_cast<void*>(handle)};
  if (!device.is_cuda() || handle <= 2) return s;  // 0, 1, 2: legacy / per-thread defaults
#if defined(LOCKSTEP_HAVE_CUDA) && CUDART_VERSION >= 12080
  int on = -1;
  if (cudaStreamGetDevice(static_cast<cudaStream_t>(s.handle), &on) == cudaSuccess &&
      on != device.index)
    throw ArgError(
        fmt::format("{}: the stream belongs to cuda:{} but the tensors live on {}; "
                    "pass a stream of {} (or none: the current one)",
                    what, on, device.str(), device.str()));
  cudaGetLastError();
#else
  (void)what;
#endif
  return s;
}

DType dtype_from_string(std::string_view name, std::string_view what) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::kF32},
      {"float32", DType::kF32},
      {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16},
      {"f16", DType::kF16},
      {"float16", DType::kF16},
      {"f64", DType::kF64},
      {"float64", DType::kF64},
      {"u8", DType::kU8},
      {"uint8", DType::kU8},
      {"u16", DType::kU16},
      {"uint16", DType::kU16},
      {"i32", DType::kI32},
      {"int32", DType::kI32},
      {"i64", DType::kI64},
      {"int64", DType::kI64},
      {"float8_e4m3fn", DType::kF8E4M3},
      {"float8_e5m2", DType::kF8E5M2},
      {"float8_e8m0fnu", DType::kF8E8M0},
  };
  for (const Alias& a : kAliases)
    if (a.name == name) return a.dtype;
  if (auto d = dtype_from_name(name)) return *d;
  throw ArgError(
      fmt::format("{}: unknown dtype '{}' (f32, bf16, f16, f64, u8, i32, i64 or a "
                  "safetensors name such as F8_E4M3)",
                  what, name));
}

Device device_from_string(std::string_view name, std::string_view what) {
  if (auto d = parse_device(name)) return *d;
  throw ArgError(fmt::format("{}: unknown device '{}' (cpu, cuda, cuda:N)", what, name));
}

}  // namespace lockstep::py
