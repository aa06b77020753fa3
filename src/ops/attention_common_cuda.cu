// The packed-batch schedule of the CUDA attention kernels (sanitized cu_seqlens and tile offsets,
// built on the device in one block) and the bf16 operand copies of the flash kernels
// (attention_cuda_common.cuh).
#include "attention_cuda_common.cuh"
#include "lockstep/numerics/hd.h"

namespace lockstep::ops::attention_cuda::detail {
namespace {

constexpr int kScheduleThreads = 1024;

template <class Idx>
__device__ int64_t cu_at(const Idx* cu, int64_t s) {
  return int64_t(cu[s]);
}

// One block: each thread takes a contiguous range of [0, b] and scans it sequentially; the
// per-thread totals are scanned by thread 0 (max for the clamp, + for the tile counts).
template <class Idx>
__global__ void __launch_bounds__(kScheduleThreads)
    schedule_kernel(const Idx* cu_in, int64_t b, int64_t T, int64_t* cu, int64_t* tiles) {
  __shared__ int64_t part[kScheduleThreads];
  const int tid = threadIdx.x;
  const int64_t n = b + 1, per = (n + kScheduleThreads - 1) / kScheduleThreads;
  const int64_t lo = tid * per, hi = lo + per < n ? lo + per : n;
  // Pass 1: prefix max of the clamped entries.
  int64_t mx = 0;
  for (int64_t s = lo; s < hi; ++s) {
    int64_t v = s == 0 ? 0 : cu_at(cu_in, s);
    v = v < 0 ? 0 : (v > T ? T : v);
    mx = v > mx ? v : mx;
  }
  part[tid] = mx;
  __syncthreads();
  if (tid == 0) {
    int64_t run = 0;
    for (int i = 0; i < kScheduleThreads; ++i) {
      const int64_t x = part[i];
      part[i] = run;  // max over the ranges before thread i
      run = x > run ? x : run;
    }
  }
  __syncthreads();
  int64_t run = part[tid];
  for (int64_t s = lo; s < hi; ++s) {
    int64_t v = s == 0 ? 0 : cu_at(cu_in, s);
    v = v < 0 ? 0 : (v > T ? T : v);
    run = v > run ? v : run;
    cu[s] = s == b ? T : run;
  }
  __syncthreads();
  // Pass 2: exclusive prefix sum of ceil(len / kTile) (entry b is the total).
  int64_t sum = 0;
  for (int64_t s = lo; s < hi && s < b; ++s) sum += (cu[s + 1] - cu[s] + kTile - 1) / kTile;
  part[tid] = sum;
  __syncthreads();
  if (tid == 0) {
    int64_t acc = 0;
    for (int i = 0; i < kScheduleThreads; ++i) {
      const int64_t x = part[i];
      part[i] = acc;
      acc += x;
    }
  }
  __syncthreads();
  int64_t acc = part[tid];
  for (int64_t s = lo; s < hi; ++s) {
    tiles[s] = acc;
    if (s < b) acc += (cu[s + 1] - cu[s] + kTile - 1) / kTile;
  }
}

// One thread per 8 output values (16 bytes).
__global__ void to_bf16_heads_kernel(const float* src, uint16_t* dst, int64_t T, int64_t H,
                                     int64_t D, int kd) {
  const int64_t chunks = kd / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= H * T * chunks) return;
  const int64_t c = i % chunks, row = i / chunks, t = row % T, h = row / T;
  const float* s = src + (t * H + h) * D;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t d = c * 8 + 2 * k;
    const uint32_t lo = d < D ? num::f32_to_bf16(s[d]) : 0u;
    const uint32_t hi = d + 1 < D ? num::f32_to_bf16(s[d + 1]) : 0u;
    w[k] = lo | (hi << 16);
  }
  reinterpret_cast<uint4*>(dst)[i] = make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace

PackedSchedule make_schedule(const Tensor& cu_in, int64_t tokens, cuda::Scratch& scratch) {
  PackedSchedule p;
  p.num_seqs = cu_in.numel() - 1;
  p.tokens = tokens;
  p.max_tiles = (tokens + kTile - 1) / kTile + p.num_seqs;
  if (p.num_seqs < 1) return p;
  int64_t* cu = scratch.get<int64_t>(size_t(p.num_seqs + 1));
  int64_t* tiles = scratch.get<int64_t>(size_t(p.num_seqs + 1));
  const cudaStream_t st = cuda::cu(scratch.stream());
  if (cu_in.dtype() == DType::kI32)
    schedule_kernel<<<1, kScheduleThreads, 0, st>>>(cu_in.ptr<int32_t>(), p.num_seqs, tokens, cu,
                                                    tiles);
  else
    schedule_kernel<<<1, kScheduleThreads, 0, st>>>(cu_in.ptr<int64_t>(), p.num_seqs, tokens, cu,
                                                    tiles);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  p.cu = cu;
  p.tiles = tiles;
  return p;
}

void to_bf16_heads(const float* src, uint16_t* dst, int64_t tokens, int64_t heads, int64_t D,
                   int kd, cudaStream_t stream) {
  const int64_t n = heads * tokens * (kd / 8);
  if (n == 0) return;
  to_bf16_heads_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(src, dst, tokens, heads, D,
                                                                      kd);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

}  // namespace lockstep::ops::attention_cuda::detail
