// Launch helpers shared by the ops/ CUDA kernels (private, .cu files only): grid sizes for
// warp-per-row and grid-stride kernels, and a grid-stride kernel over a functor.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../tensor/cuda_util.h"

namespace lockstep::ops::cuda_detail {

// Warp-per-row kernels: blocks of kRowWarps warps, one row each.
inline constexpr int kRowWarps = 8;
inline constexpr int kRowThreads = kRowWarps * 32;
inline unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowWarps - 1) / kRowWarps); }

// Grid-stride kernels: a thread per element up to 2^16 blocks of 256 threads (many times what an
// H200 holds at once), then several elements per thread.
inline constexpr int kMapThreads = 256;
inline constexpr int64_t kMapMaxBlocks = int64_t(1) << 16;
inline unsigned map_blocks(int64_t n) {
  const int64_t need = (n + kMapThreads - 1) / kMapThreads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(need, kMapMaxBlocks)));
}

// f(i) for every i in [0, n).
template <class F>
__global__ void __launch_bounds__(kMapThreads) map_kernel(F f, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

template <class F>
void launch_map(F f, int64_t n) {
  if (n <= 0) return;
  map_kernel<<<map_blocks(n), kMapThreads, 0, lockstep::cuda::cu(Stream{})>>>(f, n);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

// The index of the calling warp's row in a warp-per-row grid.
__device__ __forceinline__ int64_t warp_row() {
  return int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
}

__device__ __forceinline__ float nan_f32() { return __uint_as_float(0x7FC00000u); }

}  // namespace lockstep::ops::cuda_detail
