// CUDA kernels of the elementwise helpers: grid-stride loops over the expressions of
// ops/elementwise.h, a block per row for scale_rows, a warp per row for row_dot (WarpLanes: the
// CPU's HostLanes<32> order). Bytes per element (F32): scale, round_bf16, sigmoid 8; add 12;
// scale_rows 8; row_dot 8. All memory-bound.
#include "elementwise_cuda.h"
#include "lockstep/ops/elementwise.h"
#include "ops_cuda.cuh"

namespace lockstep::ops {

using namespace cuda_detail;

namespace {

struct ScaleOp {
  const float* x;
  float s;
  float* y;
  __device__ void operator()(int64_t i) const { y[i] = x[i] * s; }
};
struct AddOp {
  const float *a, *b;
  float* y;
  __device__ void operator()(int64_t i) const { y[i] = a[i] + b[i]; }
};
struct RoundBf16Op {
  float* x;
  __device__ void operator()(int64_t i) const { x[i] = round_bf16(x[i]); }
};
struct SigmoidOp {
  float* x;
  __device__ void operator()(int64_t i) const { x[i] = sigmoid(x[i]); }
};

constexpr int kScaleRowsThreads = 256;
__global__ void __launch_bounds__(kScaleRowsThreads)
    scale_rows_kernel(const float* x, const float* a, int64_t d, float* y) {
  const int64_t r = blockIdx.x;
  const float ar = a[r];
  for (int64_t c = threadIdx.x; c < d; c += kScaleRowsThreads) y[r * d + c] = ar * x[r * d + c];
}

__global__ void __launch_bounds__(kRowThreads)
    row_dot_kernel(const float* a, const float* b, int64_t rows, int64_t d, float* y) {
  const int64_t r = warp_row();
  if (r >= rows) return;  // warp-uniform
  const WarpLanes ex{int(threadIdx.x % 32)};
  const float s = row_dot_row(ex, a + r * d, b + r * d, d);
  if (ex.leader()) y[r] = s;
}

}  // namespace

void scale_cuda(const float* x, float s, int64_t n, float* y, Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  launch_map(ScaleOp{x, s, y}, n);
}

void add_cuda(const float* a, const float* b, int64_t n, float* y, Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  launch_map(AddOp{a, b, y}, n);
}

void round_bf16_cuda(float* x, int64_t n, Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  launch_map(RoundBf16Op{x}, n);
}

void sigmoid_cuda(float* x, int64_t n, Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  launch_map(SigmoidOp{x}, n);
}

void scale_rows_cuda(const float* x, const float* a, int64_t rows, int64_t d, float* y,
                     Device device) {
  if (rows == 0 || d == 0) return;
  lockstep::cuda::DeviceGuard guard(device);
  scale_rows_kernel<<<unsigned(rows), kScaleRowsThreads, 0, lockstep::cuda::cu(Stream{})>>>(x, a, d,
                                                                                            y);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void row_dot_cuda(const float* a, const float* b, int64_t rows, int64_t d, float* y,
                  Device device) {
  if (rows == 0) return;
  lockstep::cuda::DeviceGuard guard(device);
  row_dot_kernel<<<row_blocks(rows), kRowThreads, 0, lockstep::cuda::cu(Stream{})>>>(a, b, rows, d,
                                                                                     y);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::ops
