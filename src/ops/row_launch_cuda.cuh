// How the CUDA backend runs a row function (ops/row_exec.h) over many rows, private to ops/:
// a warp per row (WarpLanes, 32-lane ops), a 1024-thread block per row (BlockLanes) when there are
// enough rows to fill the GPU, and for a few vocabulary-sized rows (a decode batch) GridLanes:
// several blocks per row, one kernel per reduction of the row function. All three give the bits
// of HostLanes: lane l folds f(l), f(l + L), ... in ascending order, then the fixed tree.
//
// GridLanes. A row's 1024 lanes are split over `ctas` blocks (block c owns lanes [c*Lc, c*Lc+Lc),
// Lc = 1024 / ctas). The row function runs once per phase p = 0 .. R (R = its number of
// reductions, sum / sum2 / max in call order): in phase p, reductions 0 .. p-1 return their
// results (the tree of the lane partials that phase p-1 stored, or the result that an earlier
// phase stored), reduction p stores this block's lane partials and ends the phase's work: every
// later reduction returns 0 without evaluating, for_each and leader() do nothing. for_each and
// leader() act only in the phase of their segment (the reductions before them), so each output is
// written once; the final phase p = R writes what follows the last reduction. Contract for row
// functions run this way: values flow between segments only through reductions (never through
// memory written by for_each or by the leader of an earlier segment), and a value returned by a
// reduction never indexes memory unchecked (in a phase that does not compute it, it is 0).
// Inside a block, f(j) of the owned elements is evaluated by all threads into shared memory, then
// the owner thread of each lane adds its column in ascending order: the expensive part (exp) is
// spread over the block while every lane keeps its sequential order.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>

#include "../tensor/cuda_util.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops::cuda::rows {

using lockstep::cuda::cu;
using lockstep::cuda::DeviceGuard;
using lockstep::cuda::Scratch;
using ops::kBlockLanes;
using ops::kWarpLanes;
using ops::Sum2;

inline constexpr int kGridMaxReductions = 4;  // reductions per row function run by GridLanes
inline constexpr int kGridBuf = 4096;         // shared floats per component of a reduction
inline constexpr int kGridMaxCtas = 128;      // blocks per row (8 lanes each)
inline constexpr int kGridThreads = 256;      // threads per block (at least Lc)
inline constexpr int kWarpRowsPerBlock = 8;   // WarpLanes rows per 256-thread block
// Floats of scratch per row: lane partials [reduction][component][lane] and results.
inline constexpr int64_t kGridPartials = int64_t(kGridMaxReductions) * 2 * kBlockLanes;
inline constexpr int64_t kGridResults = int64_t(kGridMaxReductions) * 2;

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
// a: the accumulator (or the tree's lower lane), b: the new value (the upper lane).
struct MaxOp {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

// The fixed tree over 1024 partials p (global memory), by the calling warp: lane q holds
// p[q + 32 i]; levels 512 .. 32 add within a lane's registers, levels 16 .. 1 by shuffles.
// Returns the result in every lane.
template <class Op>
__device__ float tree_1024(const float* p, Op op) {
  const int q = threadIdx.x % kWarpLanes;
  float v[kBlockLanes / kWarpLanes];
#pragma unroll
  for (int i = 0; i < kBlockLanes / kWarpLanes; ++i) v[i] = p[q + kWarpLanes * i];
    // Levels 512, 256, 128, 64, 32: p[l] = op(p[l], p[l + off]) is v[i] = op(v[i], v[i + off /
    // 32]).
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = op(v[i], v[i + 16]);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = op(v[i], v[i + 8]);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = op(v[i], v[i + 4]);
  v[0] = op(v[0], v[2]);
  v[1] = op(v[1], v[3]);
  v[0] = op(v[0], v[1]);
  float r = v[0];
#pragma unroll
  for (int off = kWarpLanes / 2; off >= 1; off /= 2) {
    const float o = __shfl_down_sync(0xffffffffu, r, off);
    if (q < off) r = op(r, o);
  }
  return __shfl_sync(0xffffffffu, r, 0);
}

// Several blocks per row, one kernel per phase (above). Every thread of the row's blocks calls
// the row function with the same arguments; float rows only.
struct GridLanes {
  static constexpr int kLanes = kBlockLanes;
  int cta;                     // this block's index among the row's blocks
  int ctas;                    // blocks per row
  int lanes;                   // lanes per block, kBlockLanes / ctas
  int phase;                   // the reduction this kernel computes (R: the final phase)
  float* partials;             // this row's kGridPartials
  float* results;              // this row's kGridResults
  float* buf;                  // __shared__ [2][kGridBuf]
  float* bcast;                // __shared__ [2]
  mutable int seen = 0;        // reductions met so far
  mutable bool active = true;  // false after this phase's reduction

  __device__ bool leader() const { return active && seen == phase && cta == 0 && threadIdx.x == 0; }

  template <class F>
  __device__ void for_each(int64_t n, F&& f) const {
    if (!active || seen != phase) return;
    const int64_t stride = int64_t(ctas) * blockDim.x;
    for (int64_t j = int64_t(cta) * blockDim.x + threadIdx.x; j < n; j += stride) f(j);
  }

  template <class T, class F>
  __device__ T sum(int64_t n, F&& f) const {
    static_assert(std::is_same_v<T, float>, "GridLanes runs float rows");
    const auto one = [&](int64_t j) { return Sum2<float>{f(j), 0.0f}; };
    return reduce<1>(n, one, AddOp{}, 0.0f).a;
  }
  template <class T, class F>
  __device__ Sum2<T> sum2(int64_t n, F&& f) const {
    static_assert(std::is_same_v<T, float>, "GridLanes runs float rows");
    const auto two = [&](int64_t j) { return Sum2<float>(f(j)); };
    return reduce<2>(n, two, AddOp{}, 0.0f);
  }
  template <class T, class F>
  __device__ T max(int64_t n, F&& f) const {
    static_assert(std::is_same_v<T, float>, "GridLanes runs float rows");
    const auto one = [&](int64_t j) { return Sum2<float>{f(j), 0.0f}; };
    return reduce<1>(n, one, MaxOp{}, -std::numeric_limits<float>::infinity()).a;
  }

 private:
  // C components (1 or 2) of eval(j), a Sum2<float>.
  template <int C, class Eval, class Op>
  __device__ Sum2<float> reduce(int64_t n, const Eval& eval, Op op, float init) const {
    const int c = seen++;
    if (!active || c >= kGridMaxReductions) return {0.0f, 0.0f};
    if (c < phase) return replay<C>(c, op);
    store_partials<C>(c, n, eval, op, init);
    active = false;
    return {0.0f, 0.0f};
  }

  // The result of reduction c < phase: stored by block 0 of phase c + 1, or (in phase c + 1) the
  // tree of the partials of phase c, which block 0 then stores.
  template <int C, class Op>
  __device__ Sum2<float> replay(int c, Op op) const {
    float* res = results + c * 2;
    if (c + 1 < phase) return {res[0], C > 1 ? res[1] : 0.0f};
    if (threadIdx.x < kWarpLanes) {
      const float a = tree_1024(partials + (c * 2) * kBlockLanes, op);
      const float b = C > 1 ? tree_1024(partials + (c * 2 + 1) * kBlockLanes, op) : 0.0f;
      if (threadIdx.x == 0) {
        bcast[0] = a;
        bcast[1] = b;
      }
    }
    __syncthreads();
    const Sum2<float> r{bcast[0], bcast[1]};
    if (cta == 0 && threadIdx.x == 0) {
      res[0] = r.a;
      res[1] = r.b;
    }
    __syncthreads();  // bcast is reused by the next reduction
    return r;
  }

  // Lane partials of this block's lanes for reduction c: the elements j = i * 1024 + c0 + t
  // (t < lanes) evaluated by all threads into buf, sweep chunk by sweep chunk, then folded by the
  // owner thread t in ascending i.
  template <int C, class Eval, class Op>
  __device__ void store_partials(int c, int64_t n, const Eval& eval, Op op, float init) const {
    const int tid = threadIdx.x, nt = blockDim.x, L = lanes;
    const int64_t c0 = int64_t(cta) * L;
    float pa = init, pb = init;
    const int64_t sweeps = (n + kBlockLanes - 1) / kBlockLanes;
    const int per = kGridBuf / L;  // sweeps per chunk
    for (int64_t i0 = 0; i0 < sweeps; i0 += per) {
      const int m = int(sweeps - i0 < per ? sweeps - i0 : per);
      for (int idx = tid; idx < m * L; idx += nt) {
        const int64_t j = (i0 + idx / L) * kBlockLanes + c0 + idx % L;
        if (j < n) {
          const Sum2<float> v = eval(j);
          buf[idx] = v.a;
          if (C > 1) buf[kGridBuf + idx] = v.b;
        }
      }
      __syncthreads();
      if (tid < L)
        for (int i = 0; i < m; ++i) {
          const int64_t j = (i0 + i) * kBlockLanes + c0 + tid;
          if (j < n) {
            pa = op(pa, buf[i * L + tid]);
            if (C > 1) pb = op(pb, buf[kGridBuf + i * L + tid]);
          }
        }
      __syncthreads();
    }
    if (tid < L) {
      partials[(c * 2) * kBlockLanes + c0 + tid] = pa;
      if (C > 1) partials[(c * 2 + 1) * kBlockLanes + c0 + tid] = pb;
    }
  }
};

// ---- kernels -----------------------------------------------------------------------------
// Op: a functor with template <class X> __device__ void operator()(const X& ex, int64_t row).

template <class Op>
__global__ void __launch_bounds__(kBlockLanes) block_rows_kernel(Op op) {
  __shared__ float scratch[kBlockLanes];
  const ops::BlockLanes ex{int(threadIdx.x), scratch};
  op(ex, int64_t(blockIdx.x));
}

template <class Op>
__global__ void __launch_bounds__(kBlockLanes / 2)
    grid_rows_kernel(Op op, int phase, float* partials, float* results) {
  __shared__ float buf[2 * kGridBuf];
  __shared__ float bcast[2];
  const int64_t row = blockIdx.y;
  const GridLanes ex{int(blockIdx.x),
                     int(gridDim.x),
                     kBlockLanes / int(gridDim.x),
                     phase,
                     partials + row * kGridPartials,
                     results + row * kGridResults,
                     buf,
                     bcast};
  op(ex, row);
}

template <class Op>
__global__ void __launch_bounds__(kWarpLanes* kWarpRowsPerBlock)
    warp_rows_kernel(Op op, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / kWarpLanes;
  if (row >= rows) return;  // the whole warp leaves together
  const ops::WarpLanes ex{int(threadIdx.x % kWarpLanes)};
  op(ex, row);
}

// ---- launchers ---------------------------------------------------------------------------

// Streaming multiprocessors of the current device (cached per device ordinal).
inline int sm_count() {
  static std::mutex mu;
  static int cache[64] = {};
  int dev = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < 0 || dev >= 64) return 132;
  if (cache[dev] == 0)
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&cache[dev], cudaDevAttrMultiProcessorCount, dev));
  return cache[dev];
}

// Blocks per row of GridLanes for `rows` rows (0: one BlockLanes block per row): a power of two,
// at most kGridMaxCtas, about two blocks per SM in all. Never changes the bits.
inline int grid_ctas(int64_t rows) {
  const int64_t sms = sm_count();
  if (rows >= sms) return 0;
  int ctas = 1;
  while (ctas < kGridMaxCtas && rows * ctas * 2 <= 2 * sms) ctas *= 2;
  return std::max(ctas, 2);
}

// Runs op over `rows` rows of a 1024-lane row function with `reductions` reductions (sum, sum2,
// max calls per row, at most kGridMaxReductions).
template <class Op>
void launch_block_rows(const Op& op, int64_t rows, int reductions, Device device, Stream stream) {
  if (rows == 0) return;
  DeviceGuard guard(device);
  const cudaStream_t st = cu(stream);
  const int ctas = grid_ctas(rows);
  if (ctas == 0) {
    block_rows_kernel<Op><<<unsigned(rows), kBlockLanes, 0, st>>>(op);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  if (reductions > kGridMaxReductions)
    throw std::logic_error("GridLanes: a row function with more than 4 reductions");
  Scratch scratch(device, stream);
  float* partials = scratch.get<float>(size_t(rows * kGridPartials));
  float* results = scratch.get<float>(size_t(rows * kGridResults));
  const int threads = std::max(kGridThreads, kBlockLanes / ctas);
  for (int phase = 0; phase <= reductions; ++phase) {
    grid_rows_kernel<Op>
        <<<dim3(unsigned(ctas), unsigned(rows)), threads, 0, st>>>(op, phase, partials, results);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
}

// Runs op over `rows` rows of a 32-lane row function, a warp per row.
template <class Op>
void launch_warp_rows(const Op& op, int64_t rows, Device device, Stream stream) {
  if (rows == 0) return;
  DeviceGuard guard(device);
  const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
  warp_rows_kernel<Op>
      <<<unsigned(blocks), kWarpLanes * kWarpRowsPerBlock, 0, cu(stream)>>>(op, rows);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::ops::cuda::rows
