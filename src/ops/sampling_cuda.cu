// CUDA kernels of sample_tokens (softmax_cuda.h): the definition of ops/sampling.h composed from
// the header's pieces, the same tokens and log-probs as sample_tokens_cpu.
//
// Greedy (top_k == 1): one row function (max, sum, lowest index of the largest log-prob) through
//   row_launch_cuda.cuh: a block per row, or for a decode batch several blocks per row and one
//   kernel per reduction (4 kernels). Bytes: the row read 3 times (from L2 after the first).
// Otherwise: stats (m, S) the same way; for the sorted order (top_k > 1 or top_p < 1) keys
//   (lp, index) for every token, the row's index above them, and one CUB device-wide radix sort of
//   the chunk's keys (about 2 x 8 bytes x 7-8 passes per token, the whole GPU on each pass: a
//   segmented sort would give each row's sort one CTA); block sums (blocks of 256 candidates,
//   weights staged in shared memory by all threads, one thread per block summing sequentially);
//   then per row one block: the prefix chain (one thread, nb = V / 256 adds), the searches over the
//   block prefixes (all threads, any order: the prefixes are non-decreasing), the sequential
//   in-block scans (one thread over weights staged by all). Bytes per row: 3 reads of the logits
//   (stats twice, block sums once, mostly from L2 for a decode batch) plus 2 x 256 weights.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "lockstep/ops/sampling.h"
#include "row_launch_cuda.cuh"
#include "softmax_cuda.h"

namespace lockstep::ops::cuda {

namespace {

using lockstep::cuda::cu;
using lockstep::cuda::DeviceGuard;
using lockstep::cuda::Scratch;
using ops::kSampleBlock;
using ops::RowStats;

constexpr int kThreads = 256;
constexpr int kBlocksPerCta = 8;  // sample blocks per block-sum CTA
constexpr int64_t kMaxBlocks = ops::kSampleMaxVocab / kSampleBlock;
constexpr int64_t kSortChunkKeys = int64_t(1) << 24;  // keys sorted per CUB call (128 MiB)

struct SampleStatsOp {
  const float* x;
  float* stats;  // [rows][3]: m, S, log S
  int64_t vocab;
  float inv_t;
  template <class X>
  __device__ void operator()(const X& ex, int64_t r) const {
    const RowStats<float> st = ops::sample_stats_row(ex, x + r * vocab, vocab, inv_t);
    if (ex.leader()) {
      stats[3 * r] = st.m;
      stats[3 * r + 1] = st.s;
      stats[3 * r + 2] = st.log_s;
    }
  }
};

struct SampleGreedyOp {
  const float* x;
  int32_t* tokens;
  float* logprobs;
  int64_t vocab;
  float inv_t;
  template <class X>
  __device__ void operator()(const X& ex, int64_t r) const {
    ops::sample_greedy_row(ex, x + r * vocab, vocab, inv_t, tokens + r, logprobs + r);
  }
};

__device__ RowStats<float> load_stats(const float* stats, int64_t r) {
  return {stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
}

// The weight of candidate i of row r: from the logits (index order) or the sorted keys.
struct Weights {
  const float* x;       // the row's logits
  const uint64_t* key;  // the row's sorted keys, or null (index order)
  float inv_t;
  RowStats<float> st;
  int bits;
  __device__ float operator()(int64_t i) const {
    return ops::sample_weight(key ? ops::sample_key_logprob(key[i], bits)
                                  : ops::sample_logprob(x[i], inv_t, st));
  }
  __device__ int64_t token(int64_t i) const {
    return key ? ops::sample_key_index(key[i], bits) : i;
  }
};

// keys[r][j] = sample_sort_key(lp_j, j) for the rows [r0, r0 + grid.y), with the row's place in
// the chunk (blockIdx.y) in the bits above, so that one sort of the chunk keeps its rows apart and
// in order. The row bits lie above the key's 32 + bits (sample_key_index and sample_key_logprob
// read below them).
__global__ void sample_keys_kernel(const float* x, const float* stats, int64_t vocab, float inv_t,
                                   int bits, int64_t r0, uint64_t* keys) {
  const int64_t r = r0 + blockIdx.y;
  const int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= vocab) return;
  const RowStats<float> st = load_stats(stats, r);
  keys[int64_t(blockIdx.y) * vocab + j] =
      (uint64_t(blockIdx.y) << (32 + bits)) |
      ops::sample_sort_key(ops::sample_logprob(x[r * vocab + j], inv_t, st), j, bits);
}

// Block sums of the first n candidates of rows [r0, r0 + grid.y): P[r][b] (nb per row). A CTA owns
// kBlocksPerCta sample blocks; weights are staged with one padding float per 256 so that the
// summing threads hit distinct banks.
__global__ void __launch_bounds__(kThreads)
    sample_block_sums_kernel(const float* x, const uint64_t* keys, const float* stats,
                             int64_t vocab, int64_t n, float inv_t, int bits, int64_t r0,
                             int64_t nb, float* P) {
  __shared__ float w[kBlocksPerCta * (kSampleBlock + 1)];
  const int64_t r = r0 + blockIdx.y;
  const RowStats<float> st = load_stats(stats, r);
  const int64_t b0 = int64_t(blockIdx.x) * kBlocksPerCta;
  float* Pr = P + int64_t(blockIdx.y) * nb;
  if (!ops::sample_row_valid(st)) {
    if (threadIdx.x < kBlocksPerCta && b0 + threadIdx.x < nb) Pr[b0 + threadIdx.x] = 0.0f;
    return;
  }
  const Weights wt{x + r * vocab, keys ? keys + int64_t(blockIdx.y) * vocab : nullptr, inv_t, st,
                   bits};
  const int64_t i0 = b0 * kSampleBlock;
  for (int t = threadIdx.x; t < kBlocksPerCta * kSampleBlock; t += kThreads)
    if (i0 + t < n) w[t + t / kSampleBlock] = wt(i0 + t);
  __syncthreads();
  const int64_t b = b0 + threadIdx.x;
  if (threadIdx.x < kBlocksPerCta && b < nb) {
    const int64_t begin = b * kSampleBlock,
                  end = begin + kSampleBlock < n ? begin + kSampleBlock : n;
    const float* wb = w + threadIdx.x * (kSampleBlock + 1) - begin;
    Pr[b] = ops::sample_block_sum([wb](int64_t i) { return wb[i]; }, begin, end);
  }
}

// One CTA per row of [r0, r0 + grid.x): the prefix chain, the inverse CDF, the token and its lp.
__global__ void __launch_bounds__(kThreads)
    sample_finish_kernel(const float* x, const uint64_t* keys, const float* stats, int64_t vocab,
                         int64_t n, float inv_t, int bits, int64_t r0, int64_t nb, const float* P,
                         bool truncate_p, float top_p, uint64_t seed, const int32_t* streams,
                         const int32_t* pos32, const int64_t* pos64, int32_t* tokens,
                         float* logprobs) {
  __shared__ float sp[kMaxBlocks];
  __shared__ float sw[kSampleBlock];
  __shared__ int s_first;
  __shared__ long long s_i;
  __shared__ float s_q;
  const int tid = threadIdx.x;
  const int64_t r = r0 + blockIdx.x;
  const RowStats<float> st = load_stats(stats, r);
  if (!ops::sample_row_valid(st)) {
    if (tid == 0) {
      tokens[r] = -1;
      logprobs[r] = std::numeric_limits<float>::quiet_NaN();
    }
    return;
  }
  const Weights wt{x + r * vocab, keys ? keys + int64_t(blockIdx.x) * vocab : nullptr, inv_t, st,
                   bits};
  for (int64_t b = tid; b < nb; b += kThreads) sp[b] = P[int64_t(blockIdx.x) * nb + b];
  __syncthreads();
  if (tid == 0) ops::sample_prefix_chain(sp, nb);
  __syncthreads();
  const float u =
      ops::sampling_uniform(seed, uint32_t(streams[r]), pos64 ? pos64[r] : int64_t(pos32[r]));
  const auto first_block = [&](int64_t lim, float thr, bool at_least) -> int64_t {
    if (tid == 0) s_first = int(lim);
    __syncthreads();
    for (int64_t b = tid; b < lim; b += kThreads)
      if (at_least ? sp[b] >= thr : sp[b] > thr) {
        atomicMin(&s_first, int(b));
        break;
      }
    __syncthreads();
    const int64_t found = s_first;
    __syncthreads();
    return found;
  };
  const auto scan = [&](int64_t begin, int64_t end, float base, float thr, bool at_least,
                        float* q) -> int64_t {
    for (int64_t i = begin + tid; i < end; i += kThreads) sw[i - begin] = wt(i);
    __syncthreads();
    if (tid == 0) {
      float qi = 0.0f;
      const float* wb = sw - begin;
      s_i = ops::sample_scan_block([wb](int64_t i) { return wb[i]; }, begin, end, base, thr,
                                   at_least, &qi);
      s_q = qi;
    }
    __syncthreads();
    const int64_t i = s_i;
    *q = s_q;
    __syncthreads();
    return i;
  };
  const int64_t i = ops::sample_pick(n, sp, truncate_p, top_p, u, first_block, scan);
  if (tid == 0) {
    const int64_t j = wt.token(i);
    tokens[r] = int32_t(j);
    logprobs[r] = ops::sample_logprob(x[r * vocab + j], inv_t, st);
  }
}

}  // namespace

void sample_tokens_rows(const float* logits, int64_t rows, int64_t vocab, const int32_t* streams,
                        const int32_t* pos32, const int64_t* pos64, const ops::SampleConfig& cfg,
                        int32_t* tokens, float* logprobs, Device device, Stream stream) {
  if (rows == 0) return;
  const float inv_t = ops::sampling_scale(cfg.temperature);
  if (cfg.top_k == 1) {
    rows::launch_block_rows(SampleGreedyOp{logits, tokens, logprobs, vocab, inv_t}, rows,
                            /*reductions=*/3, device, stream);
    return;
  }
  DeviceGuard guard(device);
  const cudaStream_t st = cu(stream);
  Scratch scratch(device, stream);
  float* stats = scratch.get<float>(size_t(rows * 3));
  rows::launch_block_rows(SampleStatsOp{logits, stats, vocab, inv_t}, rows, /*reductions=*/2,
                          device, stream);
  const bool sorted = cfg.top_k > 0 || cfg.top_p < 1.0;
  const int64_t n = cfg.top_k > 0 && cfg.top_k < vocab ? cfg.top_k : vocab;
  const int64_t nb = (n + kSampleBlock - 1) / kSampleBlock;
  const int bits = ops::sample_index_bits(vocab);
  // Rows per chunk (a grid dimension): in the sorted order as many as kSortChunkKeys keys.
  const int64_t chunk = std::min<int64_t>(
      rows, sorted ? std::max<int64_t>(1, kSortChunkKeys / vocab) : int64_t(65535));
  float* P = scratch.get<float>(size_t(chunk * nb));
  uint64_t *keys_in = nullptr, *keys = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
  // Key bits: the row's place in the chunk above lp and the index (at most 64: chunk * vocab keys
  // <= 2^24 with vocab >= 2^(bits-1)).
  const int key_bits = 32 + bits + ops::sample_index_bits(chunk);
  if (sorted) {
    keys_in = scratch.get<uint64_t>(size_t(chunk * vocab));
    keys = scratch.get<uint64_t>(size_t(chunk * vocab));
    LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, keys_in, keys,
                                                       int64_t(chunk * vocab), 0, key_bits, st));
    temp = scratch.bytes(temp_bytes);
  }
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t cr = std::min(chunk, rows - r0);
    if (sorted) {
      sample_keys_kernel<<<dim3(unsigned((vocab + kThreads - 1) / kThreads), unsigned(cr)),
                           kThreads, 0, st>>>(logits, stats, vocab, inv_t, bits, r0, keys_in);
      LOCKSTEP_CUDA_CHECK_LAUNCH();
      LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, keys_in, keys,
                                                         int64_t(cr * vocab), 0, key_bits, st));
    }
    sample_block_sums_kernel<<<
        dim3(unsigned((nb + kBlocksPerCta - 1) / kBlocksPerCta), unsigned(cr)), kThreads, 0, st>>>(
        logits, keys, stats, vocab, n, inv_t, bits, r0, nb, P);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    sample_finish_kernel<<<unsigned(cr), kThreads, 0, st>>>(
        logits, keys, stats, vocab, n, inv_t, bits, r0, nb, P, cfg.top_p < 1.0, float(cfg.top_p),
        cfg.seed, streams, pos32, pos64, tokens, logprobs);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace lockstep::ops::cuda
