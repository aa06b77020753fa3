// CUDA kernels of RMSNorm (forward, input and weight gradients) and rotary embedding: the row
// functions of ops/rmsnorm.h on a warp per row (WarpLanes: the CPU's HostLanes<32> order; a
// forward of up to 1024 rows: a block per row, its first warp summing), the
// weight gradient in the shared chunked order, rope_pair on a thread per pair.
// Bytes per element (F32): forward 8 (read x, write y); backward 12 for dx (dy, x, dx) plus 8 for
// the dw partials (dy, x again); rope 8 (x in and out; the table rows stay in cache). No flops
// worth counting: every kernel is memory-bound.
#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/rope.h"
#include "norm_cuda.h"
#include "ops_cuda.cuh"

namespace lockstep::ops {

using namespace cuda_detail;

namespace {

// With a residual res (else null) the row first becomes x + res, stored to x (add_inplace's bits),
// and is then normalised: the lanes' stores are ordered before the row function's reads by the
// warp barrier.
template <class Y>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_fwd_kernel(float* x, const float* res, const float* w, int64_t rows, int64_t d,
                       float eps, Y* y, float* rstd) {
  const int64_t r = warp_row();
  if (r >= rows) return;  // warp-uniform
  float* xr = x + r * d;
  if (res) {
    const float* rr = res + r * d;
    for (int64_t c = threadIdx.x % 32; c < d; c += 32) xr[c] = xr[c] + rr[c];
    __syncwarp();
  }
  rmsnorm_row(WarpLanes{int(threadIdx.x % 32)}, xr, w, d, eps, y + r * d, rstd + r);
}

// Few rows (a decode step): a block per row. The block loads the row into shared memory (rows up
// to kWideStagedCols; every thread's loads in flight together), so that the first warp's 32-lane
// sum of the row function reads shared memory instead of waiting for one global load per step of
// its lanes; then every thread writes its elements of y, eight loads of w in flight. With a
// residual res (else null) the row first becomes x + res, stored to x (add_inplace's bits) and
// staged (or, unstaged, read back after the block barrier).
constexpr int kWideThreads = 256;
constexpr int64_t kWideMaxRows = 1024;
constexpr int64_t kWideStagedCols = 8192;  // 32 KB of shared memory

template <bool kStaged, class Y>
__global__ void __launch_bounds__(kWideThreads)
    rmsnorm_fwd_wide_kernel(float* x, const float* res, const float* w, int64_t d, float eps, Y* y,
                            float* rstd) {
  __shared__ float rs_shared;
  __shared__ float staged[kStaged ? kWideStagedCols : 1];
  constexpr int64_t kStep = kWideThreads;
  const int64_t r = blockIdx.x;
  float* xw = x + r * d;
  const float* xr = xw;
  Y* yr = y + r * d;
  const float* rr = res ? res + r * d : nullptr;
  if constexpr (kStaged) {
    int64_t c = threadIdx.x;
    for (; c + 7 * kStep < d; c += 8 * kStep) {
      float v[8], a[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = xr[c + u * kStep], a[u] = rr ? rr[c + u * kStep] : 0.0f;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (rr) xw[c + u * kStep] = v[u] = v[u] + a[u];
        staged[c + u * kStep] = v[u];
      }
    }
    for (; c < d; c += kStep) {
      float v = xr[c];
      if (rr) xw[c] = v = v + rr[c];
      staged[c] = v;
    }
    __syncthreads();
    xr = staged;
  } else if (rr) {
    for (int64_t c = threadIdx.x; c < d; c += kStep) xw[c] = xw[c] + rr[c];
    __syncthreads();
  }
  if (threadIdx.x < 32) {
    const float rs = rmsnorm_rstd(WarpLanes{int(threadIdx.x)}, xr, d, eps);
    if (threadIdx.x == 0) rstd[r] = rs_shared = rs;
  }
  __syncthreads();
  const float rs = rs_shared;
  int64_t c = threadIdx.x;
  for (; c + 7 * kStep < d; c += 8 * kStep) {
    float xv[8], wv[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) xv[u] = xr[c + u * kStep], wv[u] = w[c + u * kStep];
#pragma unroll
    for (int u = 0; u < 8; ++u) yr[c + u * kStep] = rmsnorm_elem(xv[u], rs, wv[u]);
  }
  for (; c < d; c += kStep) yr[c] = rmsnorm_elem(xr[c], rs, w[c]);
}

__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_dx_kernel(const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t rows, int64_t d, float* dx) {
  const int64_t r = warp_row();
  if (r >= rows) return;
  rmsnorm_bwd_row(WarpLanes{int(threadIdx.x % 32)}, dy + r * d, x + r * d, w, rstd[r], d,
                  dx + r * d);
}

// Chunk k = blockIdx.x, column c = blockIdx.y * 256 + threadIdx.x: partial[k, c].
constexpr int kDwThreads = 256;
__global__ void __launch_bounds__(kDwThreads)
    rmsnorm_dw_partial_kernel(const float* dy, const float* x, const float* rstd, int64_t rows,
                              int64_t d, float* partial) {
  const int64_t c = int64_t(blockIdx.y) * kDwThreads + threadIdx.x;
  if (c >= d) return;
  const int64_t k = blockIdx.x;
  const int64_t r0 = k * kRmsNormDwChunk;
  const int64_t r1 = r0 + kRmsNormDwChunk < rows ? r0 + kRmsNormDwChunk : rows;
  rmsnorm_dw_partial(dy, x, rstd, d, r0, r1, c, c + 1, partial + k * d + c);
}

__global__ void __launch_bounds__(kDwThreads)
    rmsnorm_dw_combine_kernel(const float* partial, int64_t chunks, int64_t d, float* dw) {
  const int64_t c = int64_t(blockIdx.x) * kDwThreads + threadIdx.x;
  if (c < d) dw[c] = rmsnorm_dw_combine(partial, chunks, d, c);
}

// Index arithmetic in I (uint32_t whenever the pair count fits: 64-bit division is slow).
template <bool kBackward, class I>
struct RopeOp {
  float* x;
  const int32_t* positions;
  const float *cos, *sin;
  I heads, h;  // h = head_dim / 2
  int32_t max_pos;
  __device__ void operator()(int64_t i64) const {
    const I i = I(i64);
    const I row = i / h, j = i - row * h;  // row = token * heads + head
    const I t = row / heads;
    const int64_t head_dim = 2 * int64_t(h);
    float* xr = x + int64_t(row) * head_dim;
    const int32_t p = positions[t];
    if (p < 0 || p >= max_pos) {
      xr[j] = xr[j + h] = nan_f32();
      return;
    }
    rope_pair<float, kBackward>(xr, cos + int64_t(p) * head_dim, sin + int64_t(p) * head_dim,
                                int64_t(h), int64_t(j), xr);
  }
};

template <bool kBackward>
void launch_rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t h,
                 const float* cos, const float* sin, int32_t max_pos) {
  const int64_t pairs = tokens * heads * h;
  if (pairs <= int64_t(UINT32_MAX))
    launch_map(
        RopeOp<kBackward, uint32_t>{x, positions, cos, sin, uint32_t(heads), uint32_t(h), max_pos},
        pairs);
  else
    launch_map(RopeOp<kBackward, int64_t>{x, positions, cos, sin, heads, h, max_pos}, pairs);
}

// x is written only with a residual (the kernels take it as float* for that case).
template <class Y>
void launch_rmsnorm_fwd(float* x, const float* res, const float* w, int64_t rows, int64_t d,
                        float eps, Y* y, float* rstd) {
  const cudaStream_t s = lockstep::cuda::cu(Stream{});
  if (rows <= kWideMaxRows && d <= kWideStagedCols)
    rmsnorm_fwd_wide_kernel<true, Y>
        <<<unsigned(rows), kWideThreads, 0, s>>>(x, res, w, d, eps, y, rstd);
  else if (rows <= kWideMaxRows)
    rmsnorm_fwd_wide_kernel<false, Y>
        <<<unsigned(rows), kWideThreads, 0, s>>>(x, res, w, d, eps, y, rstd);
  else
    rmsnorm_fwd_kernel<Y>
        <<<row_blocks(rows), kRowThreads, 0, s>>>(x, res, w, rows, d, eps, y, rstd);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_fwd_cuda(float* x, const float* res, const float* w, int64_t rows, int64_t d,
                      float eps, float* y, uint16_t* y_bf16, float* rstd, Device device) {
  if (rows == 0) return;
  lockstep::cuda::DeviceGuard guard(device);
  if (y_bf16)
    launch_rmsnorm_fwd(x, res, w, rows, d, eps, reinterpret_cast<num::Bf16Out*>(y_bf16), rstd);
  else
    launch_rmsnorm_fwd(x, res, w, rows, d, eps, y, rstd);
}

void rmsnorm_bwd_cuda(const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t rows, int64_t d, float* dx, float* dw, Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  const cudaStream_t s = lockstep::cuda::cu(Stream{});
  const int64_t chunks = rmsnorm_dw_chunks(rows);
  const unsigned col_blocks = unsigned((d + kDwThreads - 1) / kDwThreads);
  lockstep::cuda::Scratch scratch(device, Stream{});
  float* partial = chunks > 0 ? scratch.get<float>(size_t(chunks * d)) : nullptr;
  if (chunks > 0) {
    rmsnorm_dw_partial_kernel<<<dim3(unsigned(chunks), col_blocks), kDwThreads, 0, s>>>(
        dy, x, rstd, rows, d, partial);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  rmsnorm_dw_combine_kernel<<<col_blocks, kDwThreads, 0, s>>>(partial, chunks, d, dw);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (rows == 0) return;
  rmsnorm_dx_kernel<<<row_blocks(rows), kRowThreads, 0, s>>>(dy, x, w, rstd, rows, d, dx);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void rope_cuda(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
               const float* cos, const float* sin, int64_t max_pos, bool backward, Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  // Positions compare as int32 against max_pos: a table longer than 2^31 - 1 rows is clamped
  // (no position can reach it).
  const int32_t mp = int32_t(max_pos < int64_t(INT32_MAX) ? max_pos : int64_t(INT32_MAX));
  if (backward)
    launch_rope<true>(x, positions, tokens, heads, head_dim / 2, cos, sin, mp);
  else
    launch_rope<false>(x, positions, tokens, heads, head_dim / 2, cos, sin, mp);
}

}  // namespace lockstep::ops
