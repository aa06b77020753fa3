// cast() on CUDA: a grid-stride loop widening to fp32 exactly and narrowing with the RNE
// conversions of numerics/hd.h (the same functions as the host path). Bytes per element: 6 for
// F32 <-> 16-bit, 4 between the 16-bit types.
#include <algorithm>

#include "cast_cuda.h"
#include "cuda_util.h"
#include "lockstep/numerics/hd.h"

namespace lockstep::cuda {
namespace {

template <class From>
__device__ float widen(From v);
template <>
__device__ float widen<float>(float v) {
  return v;
}

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
template <>
__device__ float widen<Bf16>(Bf16 v) {
  return num::bf16_to_f32(v.bits);
}
template <>
__device__ float widen<F16>(F16 v) {
  return num::f16_to_f32(v.bits);
}

template <class To>
__device__ To narrow(float v);
template <>
__device__ float narrow<float>(float v) {
  return v;
}
template <>
__device__ Bf16 narrow<Bf16>(float v) {
  return Bf16{num::f32_to_bf16(v)};
}
template <>
__device__ F16 narrow<F16>(float v) {
  return F16{num::f32_to_f16(v)};
}

template <class From, class To>
__global__ void __launch_bounds__(256) cast_kernel(const From* src, To* dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = narrow<To>(widen<From>(src[i]));
}

template <class From, class To>
void launch(const void* src, void* dst, int64_t n) {
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, int64_t(1) << 16);
  cast_kernel<From, To><<<unsigned(blocks), 256, 0, cu(Stream{})>>>(static_cast<const From*>(src),
                                                                    static_cast<To*>(dst), n);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <class From>
void launch_to(const void* src, void* dst, DType to, int64_t n) {
  switch (to) {
    case DType::kF32:
      return launch<From, float>(src, dst, n);
    case DType::kBF16:
      return launch<From, Bf16>(src, dst, n);
    default:
      return launch<From, F16>(src, dst, n);
  }
}

}  // namespace

void cast_cuda(const void* src, DType from, void* dst, DType to, int64_t n, Device device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  switch (from) {
    case DType::kF32:
      return launch_to<float>(src, dst, to, n);
    case DType::kBF16:
      return launch_to<Bf16>(src, dst, to, n);
    default:
      return launch_to<F16>(src, dst, to, n);
  }
}

}  // namespace lockstep::cuda
