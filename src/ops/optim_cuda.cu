// CUDA kernels of the optimizer: AdamW (adamw_update of ops/optim.h per element, a grid-stride
// loop over each amax domain, blockIdx.y the domain; the updated weight's amax per domain as the
// largest order-preserving key, one atomicMax per warp, which is exact in any order) and the global
// gradient norm in the CPU's order (a thread per chunk of kGradNormChunk elements summing in
// ascending index order, staged through shared memory so that global loads stay coalesced; then a
// block per tensor whose thread 0 adds its chunk sums in order, then the tensors in list order).
// Bytes per parameter: AdamW 28 (param, grad, m, v in; param, m, v out), about 20 flops; the norm 4
// (the gradient, read once), 2 float64 flops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/tensor/tensor.h"
#include "ops_cuda.cuh"
#include "optim_cuda.h"

namespace lockstep::ops {

using namespace cuda_detail;

namespace {

__global__ void __launch_bounds__(kMapThreads)
    adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t per,
                 AdamWScalars<float> s, uint32_t* amax_key) {
  uint32_t key = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = (int64_t(blockIdx.y) + 1) * per;
  for (int64_t i = int64_t(blockIdx.y) * per + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       i < end; i += stride) {
    float p = param[i], mi = m[i], vi = v[i];
    adamw_update(s, p, grad[i], mi, vi);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
    key = max(key, adamw_amax_key(p));
  }
  if (amax_key) {
    key = __reduce_max_sync(0xFFFFFFFFu, key);
    if (threadIdx.x % 32 == 0 && key != 0) atomicMax(amax_key + blockIdx.y, key);
  }
}

__global__ void adamw_amax_finish_kernel(float* amax, int64_t domains, bool nonempty) {
  for (int64_t d = threadIdx.x; d < domains; d += blockDim.x)
    amax[d] = adamw_amax_from_key(__float_as_uint(amax[d]), nonempty);
}

// One tensor of the norm: its data, element count and first global chunk.
struct GradSeg {
  const float* ptr;
  int64_t n;
  int64_t chunk0;
};
static_assert(sizeof(GradSeg) == 24, "six 32-bit words per segment");

constexpr int kNormChunks = 256;  // chunks (= threads) per block
constexpr int kNormStage = 32;    // elements per chunk staged at a time

__global__ void __launch_bounds__(kNormChunks)
    grad_norm_chunk_kernel(const GradSeg* segs, int nseg, int64_t total_chunks, double* partial) {
  __shared__ const float* cptr[kNormChunks];
  __shared__ int cn[kNormChunks];
  __shared__ float tile[kNormChunks][kNormStage + 1];
  const int k = threadIdx.x, lane = k % 32, warp = k / 32;
  const int64_t g = int64_t(blockIdx.x) * kNormChunks + k;
  cptr[k] = nullptr;
  cn[k] = 0;
  if (g < total_chunks) {
    int lo = 0, hi = nseg - 1;  // the last segment whose first chunk is <= g
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (segs[mid].chunk0 <= g)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t e0 = (g - segs[lo].chunk0) * kGradNormChunk;
    const int64_t left = segs[lo].n - e0;
    cptr[k] = segs[lo].ptr + e0;
    cn[k] = int(left < kGradNormChunk ? left : kGradNormChunk);
  }
  __syncthreads();
  double acc = 0.0;
  for (int j0 = 0; j0 < kGradNormChunk; j0 += kNormStage) {
    for (int kk = warp * 32; kk < warp * 32 + 32; ++kk)
      tile[kk][lane] = j0 + lane < cn[kk] ? cptr[kk][j0 + lane] : 0.0f;
    __syncthreads();
    const int len = cn[k] - j0;
    for (int e = 0; e < kNormStage && e < len; ++e) acc = grad_norm_add(acc, tile[k][e]);
    __syncthreads();
  }
  if (g < total_chunks) partial[g] = acc;
}

constexpr int kCombineThreads = 256;  // a block per tensor: warps 1.. stage, thread 0 adds
constexpr int kCombineTile = 2048;    // chunk sums per staged tile (two tiles: 32 KiB)

// Block i: sums[i] = the chunk sums of tensor i added in chunk order by thread 0. The other warps
// stage the next tile of chunk sums into shared memory with coalesced loads while thread 0 adds the
// current one, so the serial chain waits on float64 adds, not on global loads.
__global__ void __launch_bounds__(kCombineThreads)
    grad_norm_tensor_kernel(const GradSeg* segs, const double* partial, double* sums) {
  __shared__ double tile[2][kCombineTile];
  const GradSeg seg = segs[blockIdx.x];
  const int64_t chunks = (seg.n + kGradNormChunk - 1) / kGradNormChunk;
  const int64_t tiles = (chunks + kCombineTile - 1) / kCombineTile;
  const double* src = partial + seg.chunk0;
  auto tile_len = [&](int64_t t) {  // chunk sums in tile t (the last one shorter)
    return int(chunks - t * kCombineTile < kCombineTile ? chunks - t * kCombineTile : kCombineTile);
  };
  auto stage = [&](int64_t t, int first, int step) {
    const int len = tile_len(t);
    for (int j = int(threadIdx.x) - first; j < len; j += step)
      tile[t & 1][j] = src[t * kCombineTile + j];
  };
  if (tiles > 0) stage(0, 0, kCombineThreads);
  __syncthreads();
  double acc = 0.0;
  for (int64_t t = 0; t < tiles; ++t) {
    if (threadIdx.x >= 32 && t + 1 < tiles) stage(t + 1, 32, kCombineThreads - 32);
    if (threadIdx.x == 0) {
      const int len = tile_len(t);
      const double* cur = tile[t & 1];
#pragma unroll 8
      for (int j = 0; j < len; ++j) acc = acc + cur[j];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = acc;
}

// The tensor sums in list order.
__global__ void grad_norm_total_kernel(const double* sums, int nseg, double* total) {
  double acc = 0.0;
  for (int i = 0; i < nseg; ++i) acc = acc + sums[i];
  *total = acc;
}

}  // namespace

void adamw_step_cuda(float* param, const float* grad, float* m, float* v, int64_t n,
                     const AdamWScalars<float>& s, float* amax, int64_t amax_domains,
                     Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  const cudaStream_t st = lockstep::cuda::cu(Stream{});
  uint32_t* key = reinterpret_cast<uint32_t*>(amax);
  if (amax) LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float) * amax_domains, st));
  const int64_t per = n / amax_domains;
  if (n > 0) {
    // About the blocks of one grid-stride launch over n, shared out between the domains.
    const unsigned bx = unsigned(std::max<int64_t>(1, map_blocks(n) / amax_domains));
    const dim3 grid(std::min<unsigned>(bx, map_blocks(per)), unsigned(amax_domains));
    adamw_kernel<<<grid, kMapThreads, 0, st>>>(param, grad, m, v, per, s, key);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  if (amax) {
    adamw_amax_finish_kernel<<<1, 256, 0, st>>>(amax, amax_domains, per > 0);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
}

double grad_norm_cuda(std::span<const float* const> ptrs, std::span<const int64_t> sizes,
                      Device device) {
  lockstep::cuda::DeviceGuard guard(device);
  const cudaStream_t st = lockstep::cuda::cu(Stream{});
  std::vector<GradSeg> segs;
  int64_t chunks = 0;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    segs.push_back({ptrs[i], sizes[i], chunks});
    chunks += (sizes[i] + kGradNormChunk - 1) / kGradNormChunk;
  }
  const int nseg = int(segs.size());
  lockstep::cuda::Scratch scratch(device, Stream{});
  auto* dsegs = scratch.get<GradSeg>(segs.size());
  lockstep::cuda::upload_words(reinterpret_cast<const uint32_t*>(segs.data()),
                               segs.size() * sizeof(GradSeg) / 4, dsegs, st);
  double* partial = scratch.get<double>(size_t(chunks));
  double* sums = scratch.get<double>(segs.size());
  Tensor total = Tensor::empty(DType::kF64, {1}, device);
  if (chunks > 0) {
    grad_norm_chunk_kernel<<<unsigned((chunks + kNormChunks - 1) / kNormChunks), kNormChunks, 0,
                             st>>>(dsegs, nseg, chunks, partial);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  if (nseg > 0) {
    grad_norm_tensor_kernel<<<unsigned(nseg), kCombineThreads, 0, st>>>(dsegs, partial, sums);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  grad_norm_total_kernel<<<1, 1, 0, st>>>(sums, nseg, total.ptr<double>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return std::sqrt(total.to(Device::cpu()).ptr<double>()[0]);
}

}  // namespace lockstep::ops
