// CUDA kernels of the MoE routing ops (ops/moe.h). The grouped layout places each expert's slots
// in ascending (t, s) order, as the CPU reference does. A call with few slots (a decode step) does
// it in one block: a histogram in shared memory, the offsets by a warp scan over the E experts,
// then a warp per expert placing its slots in order, 32 at a time. A larger call (or a row multiple
// above 2^16) sorts the slots by expert with a stable radix sort (CUB), takes the offsets in a
// serial pass and places each slot by its sorted rank. The row moves are plain copies and in-order
// sums.
#include <cub/device/device_radix_sort.cuh>

#include "../tensor/cuda_util.h"
#include "lockstep/numerics/transcendental.h"
#include "moe_cuda.h"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::cu;

constexpr int kThreads = 256;

int blocks_for(int64_t n, int per_block = kThreads) {
  return int(std::max<int64_t>(1, (n + per_block - 1) / per_block));
}

__global__ void route_keys_kernel(const int32_t* ids, int64_t n, int32_t experts, int32_t* keys,
                                  int32_t* vals, int32_t* count) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int32_t e = ids[i];
  e = e < 0 ? 0 : (e >= experts ? experts - 1 : e);
  keys[i] = e;
  vals[i] = int32_t(i);
  atomicAdd(count + e, 1);
}

// One thread: padded offsets (and the unpadded starts of each expert's slots in sorted order).
__global__ void route_offsets_kernel(const int32_t* count, int32_t experts, int64_t multiple,
                                     int64_t rows, int64_t* off, int64_t* start) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int64_t o = 0, s = 0;
  for (int32_t e = 0; e < experts; ++e) {
    off[e] = o;
    start[e] = s;
    o += (int64_t(count[e]) + multiple - 1) / multiple * multiple;
    s += count[e];
  }
  off[experts] = rows;
}

__global__ void route_place_kernel(const int32_t* keys, const int32_t* vals, int64_t n, int64_t k,
                                   const int64_t* off, const int64_t* start, int32_t* src_rows,
                                   int32_t* slot_row) {
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p >= n) return;
  const int32_t e = keys[p], i = vals[p];
  const int64_t row = off[e] + (p - start[e]);
  slot_row[i] = int32_t(row);
  src_rows[row] = int32_t(i / k);
}

// The whole layout in one block, for n <= kSmallSlots slots and E <= kSmallExperts experts.
// Shared memory: offsets [E + 1] (I64), then keys [n] and counts [E] (I32).
constexpr int64_t kSmallSlots = 4096, kSmallExperts = 1024;
constexpr int kSmallThreads = 1024;
constexpr int64_t kSmallMaxMultiple = int64_t(1) << 16;  // padded counts in 32 bits

size_t small_route_smem(int64_t n, int64_t experts) {
  return size_t(experts + 1) * 8 + size_t(n + experts) * 4;
}

__global__ void __launch_bounds__(kSmallThreads)
    route_small_kernel(const int32_t* ids, int64_t n, int32_t experts, int64_t k, int64_t multiple,
                       int64_t rows, int64_t* off_out, int32_t* src_rows, int32_t* slot_row) {
  extern __shared__ int64_t smem[];
  int64_t* off = smem;
  int32_t* keys = reinterpret_cast<int32_t*>(off + experts + 1);
  int32_t* count = keys + n;
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    int32_t e = ids[i];
    e = e < 0 ? 0 : (e >= experts ? experts - 1 : e);
    keys[i] = e;
    atomicAdd(count + e, 1);
  }
  __syncthreads();
  // Offsets: the first warp scans the padded counts 32 experts at a time (32-bit division: 64-bit
  // division is a long software sequence on the GPU).
  if (threadIdx.x < 32) {
    const uint32_t m = uint32_t(multiple);
    int64_t base = 0;
    for (int32_t e0 = 0; e0 < experts; e0 += 32) {
      const int32_t e = e0 + int32_t(threadIdx.x);
      const uint32_t c = e < experts ? uint32_t(count[e]) : 0u;
      const int64_t pad = m == 1 ? int64_t(c) : int64_t((c + m - 1) / m) * m;
      int64_t v = pad;  // inclusive scan over the warp
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const int64_t up = __shfl_up_sync(0xffffffffu, v, o);
        if (int(threadIdx.x) >= o) v += up;
      }
      if (e < experts) off[e] = base + v - pad;
      base += __shfl_sync(0xffffffffu, v, 31);
    }
    if (threadIdx.x == 0) off[experts] = rows;  // the tail belongs to the last expert
  }
  __syncthreads();
  for (int32_t e = threadIdx.x; e <= experts; e += blockDim.x) off_out[e] = off[e];
  // Warp w places experts w, w + warps, ...: the slots of one expert in slot order, 32 slots per
  // ballot, then marks the expert's padding rows.
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int32_t e = threadIdx.x / 32; e < experts; e += warps) {
    int64_t row = off[e];
    const int64_t end = row + count[e];
    for (int64_t c = 0; c < n && row < end; c += 32) {
      const int64_t i = c + lane;
      const bool hit = i < n && keys[i] == e;
      const unsigned m = __ballot_sync(0xffffffffu, hit);
      if (hit) {
        const int64_t at = row + __popc(m & ((1u << lane) - 1u));
        slot_row[i] = int32_t(at);
        src_rows[at] = int32_t(i / k);
      }
      row += __popc(m);
    }
    for (int64_t p = end + lane; p < off[e + 1]; p += 32) src_rows[p] = -1;
  }
}

// out[r] = x[src[r]] (0 when src[r] < 0); one block row-chunk per output row.
// E: float, or uint16_t for bf16 rows (moved unchanged; 0 is bf16 +0).
template <class E>
__global__ void gather_kernel(const E* x, const int32_t* src, int64_t rows, int64_t d, E* out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t s = src[r];
    E* o = out + r * d;
    if (s < 0) {
      for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = E(0);
    } else {
      const E* a = x + int64_t(s) * d;
      for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = a[c];
    }
  }
}

// out[t, c] = sum over s ascending of rows[slot_row[t k + s], c], from +0. Column c =
// blockIdx.x * blockDim.x + threadIdx.x; tokens blockIdx.y, blockIdx.y + gridDim.y, ...; the
// slots' rows are loaded 8 at a time before they are added (in slot order).
__global__ void combine_kernel(const float* __restrict__ rows, const int32_t* __restrict__ slot_row,
                               int64_t tokens, int64_t k, int64_t d, float* __restrict__ out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= d) return;
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const int32_t* sr = slot_row + t * k;
    float acc = 0.0f;
    int64_t s = 0;
    for (; s + 8 <= k; s += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = rows[int64_t(sr[s + u]) * d + c];
#pragma unroll
      for (int u = 0; u < 8; ++u) acc = __fadd_rn(acc, v[u]);
    }
    for (; s < k; ++s) acc = __fadd_rn(acc, rows[int64_t(sr[s]) * d + c]);
    out[t * d + c] = acc;
  }
}

// out[slot_row[t k + s]] = x[t] for every slot (out zero-filled before).
__global__ void scatter_kernel(const float* x, const int32_t* slot_row, int64_t tokens, int64_t k,
                               int64_t d, float* out) {
  for (int64_t i = blockIdx.x; i < tokens * k; i += gridDim.x) {
    const float* a = x + (i / k) * d;
    float* o = out + int64_t(slot_row[i]) * d;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = a[c];
  }
}

__global__ void scatter_slots_kernel(const float* w, const int32_t* slot_row, int64_t n,
                                     float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[slot_row[i]] = w[i];
}

__global__ void gather_slots_kernel(const float* v, const int32_t* slot_row, int64_t n,
                                    float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = v[slot_row[i]];
}

__global__ void sigmoid_backward_kernel(const float* dy, const float* y, int64_t n, float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __fmul_rn(dy[i], __fmul_rn(y[i], __fsub_rn(1.0f, y[i])));
}

int row_blocks(int64_t rows) { return int(std::min<int64_t>(std::max<int64_t>(rows, 1), 65535)); }
int row_threads(int64_t d) { return d >= 256 ? 256 : (d >= 128 ? 128 : 64); }

}  // namespace

void moe_route(const Tensor& ids, MoeRoute& r) {
  lockstep::cuda::DeviceGuard guard(ids.device());
  const Device dev = ids.device();
  const cudaStream_t st = cu(Stream{});
  const int64_t n = r.tokens * r.top_k, E = r.experts;
  r.offsets = Tensor::empty(DType::kI64, {E + 1}, dev);
  r.src_rows = Tensor::empty(DType::kI32, {r.rows}, dev);
  r.slot_row = Tensor::empty(DType::kI32, {n}, dev);
  if (n <= kSmallSlots && E <= kSmallExperts && r.row_multiple <= kSmallMaxMultiple) {
    route_small_kernel<<<1, kSmallThreads, small_route_smem(n, E), st>>>(
        ids.ptr<int32_t>(), n, int32_t(E), r.top_k, r.row_multiple, r.rows,
        r.offsets.ptr<int64_t>(), r.src_rows.ptr<int32_t>(), r.slot_row.ptr<int32_t>());
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  lockstep::cuda::Scratch sc(dev, Stream{});
  int32_t* count = sc.get<int32_t>(size_t(E));
  int64_t* start = sc.get<int64_t>(size_t(E));
  int32_t* keys = sc.get<int32_t>(size_t(n));
  int32_t* vals = sc.get<int32_t>(size_t(n));
  int32_t* keys_out = sc.get<int32_t>(size_t(n));
  int32_t* vals_out = sc.get<int32_t>(size_t(n));
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(count, 0, size_t(E) * 4, st));
  if (r.rows > 0)
    LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(r.src_rows.raw(), 0xFF, size_t(r.rows) * 4, st));
  if (n > 0) {
    route_keys_kernel<<<blocks_for(n), kThreads, 0, st>>>(ids.ptr<int32_t>(), n, int32_t(E), keys,
                                                          vals, count);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    int bits = 1;
    while ((int64_t(1) << bits) < E) ++bits;
    size_t temp = 0;
    LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, keys, keys_out, vals,
                                                        vals_out, n, 0, bits, st));
    void* tmp = sc.bytes(temp);
    LOCKSTEP_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(tmp, temp, keys, keys_out, vals, vals_out, n, 0, bits, st));
  }
  route_offsets_kernel<<<1, 1, 0, st>>>(count, int32_t(E), r.row_multiple, r.rows,
                                        r.offsets.ptr<int64_t>(), start);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (n > 0) {
    route_place_kernel<<<blocks_for(n), kThreads, 0, st>>>(
        keys_out, vals_out, n, r.top_k, r.offsets.ptr<int64_t>(), start, r.src_rows.ptr<int32_t>(),
        r.slot_row.ptr<int32_t>());
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
}

void moe_gather(const Tensor& x, const MoeRoute& r, Tensor& out) {
  if (r.rows == 0 || x.cols() == 0) return;
  lockstep::cuda::DeviceGuard guard(x.device());
  if (x.dtype() == DType::kBF16)
    gather_kernel<<<row_blocks(r.rows), row_threads(x.cols()), 0, cu(Stream{})>>>(
        static_cast<const uint16_t*>(x.raw()), r.src_rows.ptr<int32_t>(), r.rows, x.cols(),
        static_cast<uint16_t*>(out.raw()));
  else
    gather_kernel<<<row_blocks(r.rows), row_threads(x.cols()), 0, cu(Stream{})>>>(
        x.ptr<float>(), r.src_rows.ptr<int32_t>(), r.rows, x.cols(), out.ptr<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void moe_combine(const Tensor& rows, const MoeRoute& r, Tensor& out) {
  if (r.tokens == 0 || rows.cols() == 0) return;
  lockstep::cuda::DeviceGuard guard(rows.device());
  const int threads = row_threads(rows.cols());
  const dim3 grid(unsigned((rows.cols() + threads - 1) / threads), unsigned(row_blocks(r.tokens)));
  combine_kernel<<<grid, threads, 0, cu(Stream{})>>>(rows.ptr<float>(), r.slot_row.ptr<int32_t>(),
                                                     r.tokens, r.top_k, rows.cols(),
                                                     out.ptr<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void moe_scatter(const Tensor& x, const MoeRoute& r, Tensor& out) {
  if (r.tokens == 0 || x.cols() == 0) return;
  lockstep::cuda::DeviceGuard guard(x.device());
  scatter_kernel<<<row_blocks(r.tokens * r.top_k), row_threads(x.cols()), 0, cu(Stream{})>>>(
      x.ptr<float>(), r.slot_row.ptr<int32_t>(), r.tokens, r.top_k, x.cols(), out.ptr<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void moe_scatter_slots(const Tensor& w, const MoeRoute& r, Tensor& out) {
  const int64_t n = r.tokens * r.top_k;
  if (n == 0) return;
  lockstep::cuda::DeviceGuard guard(w.device());
  scatter_slots_kernel<<<blocks_for(n), kThreads, 0, cu(Stream{})>>>(
      w.ptr<float>(), r.slot_row.ptr<int32_t>(), n, out.ptr<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void moe_gather_slots(const Tensor& v, const MoeRoute& r, Tensor& out) {
  const int64_t n = r.tokens * r.top_k;
  if (n == 0) return;
  lockstep::cuda::DeviceGuard guard(v.device());
  gather_slots_kernel<<<blocks_for(n), kThreads, 0, cu(Stream{})>>>(
      v.ptr<float>(), r.slot_row.ptr<int32_t>(), n, out.ptr<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void sigmoid_backward(const Tensor& dy, const Tensor& y, Tensor& out) {
  const int64_t n = dy.numel();
  if (n == 0) return;
  lockstep::cuda::DeviceGuard guard(dy.device());
  sigmoid_backward_kernel<<<blocks_for(n), kThreads, 0, cu(Stream{})>>>(
      dy.ptr<float>(), y.ptr<float>(), n, out.ptr<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::ops::cuda
