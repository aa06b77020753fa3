// CUDA kernels of the token embedding: the forward gather, and a deterministic backward: a stable
// radix sort (CUB) of the token indices by id, each id's first sorted position by binary search,
// then a block per vocabulary row summing its tokens' gradient rows in ascending token order with
// the CPU's embedding_bwd_sum (ops/embedding.h).
// Bytes (F32): forward 8 per output element; backward 4 per dout element read once, plus 4 per
// dtable element written (V x d: 1.24 GB for Qwen3-30B-A3B's 151936 x 2048, which dominates), plus
// the sort (about 8 bytes per token per radix pass).
#include <cub/device/device_radix_sort.cuh>
#include <stdexcept>
#include <string>

#include "embedding_cuda.h"
#include "lockstep/ops/embedding.h"
#include "ops_cuda.cuh"

namespace lockstep::ops {

using namespace cuda_detail;

namespace {

constexpr int kEmbedThreads = 256;

// Block t: out[t, :] = table[ids[t], :], NaN for an id outside [0, vocab). kVec4: float4 accesses
// (d % 4 == 0 and 16-byte aligned rows).
template <bool kVec4>
__global__ void __launch_bounds__(kEmbedThreads)
    embedding_fwd_kernel(const float* table, int64_t vocab, int64_t d, const int32_t* ids,
                         float* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && int64_t(id) < vocab;
  const float* src = table + (ok ? int64_t(id) : 0) * d;
  float* dst = out + t * d;
  if constexpr (kVec4) {
    const float4 nan4 = make_float4(nan_f32(), nan_f32(), nan_f32(), nan_f32());
    for (int64_t c = int64_t(threadIdx.x) * 4; c < d; c += kEmbedThreads * 4)
      *reinterpret_cast<float4*>(dst + c) = ok ? *reinterpret_cast<const float4*>(src + c) : nan4;
  } else {
    for (int64_t c = threadIdx.x; c < d; c += kEmbedThreads) dst[c] = ok ? src[c] : nan_f32();
  }
}

struct SortKeysOp {
  const int32_t* ids;
  int64_t vocab;
  uint32_t* keys;
  int32_t* vals;
  __device__ void operator()(int64_t t) const {
    const int32_t id = ids[t];
    keys[t] = (id >= 0 && int64_t(id) < vocab) ? uint32_t(id) : uint32_t(vocab);
    vals[t] = int32_t(t);
  }
};

// start[v] = the first sorted position whose key is >= v, for v in [0, vocab].
struct StartOp {
  const uint32_t* keys;
  int64_t tokens;
  int64_t* start;
  __device__ void operator()(int64_t v) const {
    int64_t lo = 0, hi = tokens;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (int64_t(keys[mid]) < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    start[v] = lo;
  }
};

// Block v: dtable[v, :] from the sorted tokens start[v] .. start[v + 1].
template <bool kVec4>
__global__ void __launch_bounds__(kEmbedThreads)
    embedding_bwd_kernel(const float* dout, const int32_t* order, const int64_t* start, int64_t d,
                         float* dtable) {
  const int64_t v = blockIdx.x;
  const int64_t i0 = start[v], i1 = start[v + 1];
  float* row = dtable + v * d;
  if constexpr (kVec4) {
    for (int64_t c = int64_t(threadIdx.x) * 4; c < d; c += kEmbedThreads * 4) {
      float acc[4];
      embedding_bwd_sum(dout, order, i0, i1, d, c, c + 4, acc);
      *reinterpret_cast<float4*>(row + c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    }
  } else {
    for (int64_t c = threadIdx.x; c < d; c += kEmbedThreads)
      embedding_bwd_sum(dout, order, i0, i1, d, c, c + 1, row + c);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void embedding_fwd_cuda(const float* table, int64_t vocab, int64_t d, const int32_t* ids,
                        int64_t tokens, float* out, Device device) {
  if (tokens == 0) return;
  lockstep::cuda::DeviceGuard guard(device);
  const cudaStream_t s = lockstep::cuda::cu(Stream{});
  if (d % 4 == 0 && aligned16(table) && aligned16(out))
    embedding_fwd_kernel<true>
        <<<unsigned(tokens), kEmbedThreads, 0, s>>>(table, vocab, d, ids, out);
  else
    embedding_fwd_kernel<false>
        <<<unsigned(tokens), kEmbedThreads, 0, s>>>(table, vocab, d, ids, out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void embedding_bwd_cuda(const float* dout, const int32_t* ids, int64_t tokens, int64_t vocab,
                        int64_t d, float* dtable, Device device) {
  if (tokens > int64_t(INT32_MAX) || vocab >= int64_t(INT32_MAX))
    throw std::invalid_argument("embedding_backward: " + std::to_string(tokens) +
                                " tokens over a " + std::to_string(vocab) +
                                "-row table; the CUDA backward takes fewer than 2^31 of each");
  lockstep::cuda::DeviceGuard guard(device);
  const cudaStream_t s = lockstep::cuda::cu(Stream{});
  lockstep::cuda::Scratch scratch(device, Stream{});
  int64_t* start = scratch.get<int64_t>(size_t(vocab + 1));
  const int32_t* order = nullptr;
  if (tokens > 0) {
    uint32_t* keys = scratch.get<uint32_t>(size_t(tokens));
    uint32_t* keys_sorted = scratch.get<uint32_t>(size_t(tokens));
    int32_t* vals = scratch.get<int32_t>(size_t(tokens));
    int32_t* vals_sorted = scratch.get<int32_t>(size_t(tokens));
    launch_map(SortKeysOp{ids, vocab, keys, vals}, tokens);
    int end_bit = 1;  // keys are 0 .. vocab: the bits of vocab
    while (end_bit < 32 && (uint64_t(1) << end_bit) <= uint64_t(vocab)) ++end_bit;
    size_t temp_bytes = 0;
    LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, temp_bytes, keys, keys_sorted, vals, vals_sorted, int(tokens), 0, end_bit, s));
    void* temp = scratch.bytes(temp_bytes);
    LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_sorted, vals,
                                                        vals_sorted, int(tokens), 0, end_bit, s));
    launch_map(StartOp{keys_sorted, tokens, start}, vocab + 1);
    order = vals_sorted;
  } else {
    LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(start, 0, size_t(vocab + 1) * sizeof(int64_t), s));
  }
  if (d % 4 == 0 && aligned16(dout) && aligned16(dtable))
    embedding_bwd_kernel<true>
        <<<unsigned(vocab), kEmbedThreads, 0, s>>>(dout, order, start, d, dtable);
  else
    embedding_bwd_kernel<false>
        <<<unsigned(vocab), kEmbedThreads, 0, s>>>(dout, order, start, d, dtable);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::ops
