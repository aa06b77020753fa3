// Benchmark inputs generated on the device (bench_fill.h).
#include "bench_fill.h"
#include "lockstep/numerics/hd.h"
#include "lockstep/numerics/philox.h"
#include "tensor/cuda_util.h"

namespace lockstep::bench {
namespace {

__global__ void random_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const num::Philox4x32 w =
      num::philox4x32_10(num::Philox4x32{{uint32_t(i), uint32_t(i >> 32), 0u, 0u}}, uint32_t(seed),
                         uint32_t(seed >> 32));
  float s = 0.0f;
  for (int k = 0; k < 4; ++k) s += float(w.v[k] >> 8) * 5.9604644775390625e-08f;
  p[i] = num::f32_to_bf16((s - 2.0f) * 1.7320508f);
}

__global__ void fill_kind_kernel(uint8_t* p, size_t n, uint32_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    uint8_t b = uint8_t(h);
    if (kind == 1) b = (i & 1) ? uint8_t(0x3F | (h & 0x80)) : uint8_t(h);
    if (kind == 2) b = uint8_t(0x30 + (h & 0xF));
    if (kind == 3) b = uint8_t(122 + (h % 10));
    if (kind == 4) b = uint8_t(h & 0xF7);
    p[i] = b;
  }
}

}  // namespace

Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed, Device device) {
  cuda::DeviceGuard guard(device);
  Tensor t = Tensor::empty(DType::kBF16, {rows, cols}, device);
  const int64_t n = rows * cols;
  if (n > 0) {
    random_bf16_kernel<<<unsigned((n + 255) / 256), 256>>>(t.ptr<uint16_t>(), n, seed);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  return t;
}

void fill_bytes_kind(void* p, size_t bytes, uint32_t seed, int kind) {
  if (bytes == 0) return;
  fill_kind_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, seed, kind);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::bench
