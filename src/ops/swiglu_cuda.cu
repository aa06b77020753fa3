// CUDA kernels of SwiGLU: the forward a thread per element (swiglu_elem), the backward
// swiglu_bwd_row (ops/swiglu.h) on a warp per row, so dp sums in the CPU's HostLanes<32> order.
// Bytes per output element (F32): forward 12 (gate, up in; y out), backward 20 (gate, up, dy in;
// dgate, dup out); about 25 flops per element for the portable exp and the divisions, far below the
// H200's fp32 rate at these bytes: memory-bound.
#include "lockstep/ops/swiglu.h"
#include "ops_cuda.cuh"
#include "swiglu_cuda.h"

namespace lockstep::ops {

using namespace cuda_detail;

namespace {

// The forward is elementwise (swiglu_elem, as swiglu_row applies it): a thread per element, so
// that a few rows (a decode step) still spread over the GPU. Column c = blockIdx.x * 256 +
// threadIdx.x; rows blockIdx.y, blockIdx.y + gridDim.y, ...
constexpr int kElemThreads = 256;

// Y: float, or num::Bf16Out for rows stored as bf16.
template <class Y>
__global__ void __launch_bounds__(kElemThreads)
    swiglu_fwd_kernel(const float* __restrict__ x, const float* __restrict__ p, int64_t rows,
                      int64_t inter, Y* __restrict__ y) {
  const int64_t c = int64_t(blockIdx.x) * kElemThreads + threadIdx.x;
  if (c >= inter) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* xr = x + r * 2 * inter;
    y[r * inter + c] = swiglu_elem(xr[c], xr[inter + c], p ? p + r : nullptr);
  }
}

__global__ void __launch_bounds__(kRowThreads)
    swiglu_bwd_kernel(const float* x, const float* p, const float* dy, int64_t rows, int64_t inter,
                      float* dx, float* dp) {
  const int64_t r = warp_row();
  if (r >= rows) return;
  swiglu_bwd_row(WarpLanes{int(threadIdx.x % 32)}, x + r * 2 * inter, p ? p + r : nullptr,
                 dy + r * inter, inter, dx + r * 2 * inter, p ? dp + r : nullptr);
}

}  // namespace

void swiglu_fwd_cuda(const float* x, const float* p, int64_t rows, int64_t inter, float* y,
                     uint16_t* y_bf16, Device device) {
  if (rows == 0) return;
  lockstep::cuda::DeviceGuard guard(device);
  if (inter == 0) return;
  const dim3 grid(unsigned((inter + kElemThreads - 1) / kElemThreads),
                  unsigned(rows < 65535 ? rows : 65535));
  const cudaStream_t s = lockstep::cuda::cu(Stream{});
  if (y_bf16)
    swiglu_fwd_kernel<<<grid, kElemThreads, 0, s>>>(x, p, rows, inter,
                                                    reinterpret_cast<num::Bf16Out*>(y_bf16));
  else
    swiglu_fwd_kernel<<<grid, kElemThreads, 0, s>>>(x, p, rows, inter, y);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void swiglu_bwd_cuda(const float* x, const float* p, const float* dy, int64_t rows, int64_t inter,
                     float* dx, float* dp, Device device) {
  if (rows == 0) return;
  lockstep::cuda::DeviceGuard guard(device);
  swiglu_bwd_kernel<<<row_blocks(rows), kRowThreads, 0, lockstep::cuda::cu(Stream{})>>>(
      x, p, dy, rows, inter, dx, dp);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::ops
