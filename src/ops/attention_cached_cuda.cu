// CUDA attention over the sampler's KV cache (attention_cuda.h): attention_row per (row, NH query
// heads of a GQA group) on bf16 or FP8 cache codes, the learner's kRowwise bits. Two schedules of
// the same steps:
//   warp:  one warp per call, chunks in order (attention_row itself), for many rows;
//   split: one block per call, warp w on chunk base + w of each round of W chunks (scores, chunk
//          max, probabilities and pv in parallel), the max steps chained in chunk order by every
//          warp from the round's maxima, and the rescale steps acc = acc * alpha + pv chained in
//          chunk order per (head, dim) by the block; for few rows and long contexts.
// Napkin math (decode, bf16 cache, Hkv 4, D 128, context n): K and V bytes 2 * 2 * n * Hkv * D per
// row (8 MB at n = 4096: about 2 us of HBM at batch 1, 0.5 ms at batch 256); flops 4 n Hq D per
// row on the CUDA cores (NH = 8 query heads share each K / V load; 17 G instructions at batch 256,
// n = 4096, about 0.5 ms). FP8 codes halve the bytes and add one division per element.
#include "attention_cuda.h"
#include "attention_cuda_common.cuh"
#include "attention_rows_cuda.cuh"

namespace lockstep::ops::attention_cuda {

using namespace detail;

namespace {

constexpr int kRowsWarps = 4;  // warp schedule: calls per block

struct CachedParams {
  const float* q = nullptr;
  KvCacheView cache;
  const void* slots = nullptr;
  const void* positions = nullptr;
  bool slots64 = false, pos64 = false;
  float* out = nullptr;
  num::Bf16Out* out_bf16 = nullptr;  // set instead of out: the output stored as bf16
  float* lse = nullptr;              // may be null
  int64_t rows = 0, hq = 0, calls_per_row = 0;
  int qs = 0;           // q row stride in shared memory
  int warp_floats = 0;  // warp schedule: shared floats per warp
  float scale = 0;
  bool vec = false;  // D % 8 == 0: 8 codes load as one vector
};

// The row's slot and position; false (and the NaN row written by the caller) when out of range.
__device__ __forceinline__ bool row_indices(const CachedParams& p, int64_t r, int64_t& slot,
                                            int64_t& pos) {
  slot = index_at(p.slots, p.slots64, r);
  pos = index_at(p.positions, p.pos64, r);
  return slot >= 0 && slot < p.cache.slots && pos >= 0 && pos < p.cache.max_pos;
}

__device__ __forceinline__ void nan_row(const CachedParams& p, int64_t r, int64_t h0, int nh,
                                        int tid, int threads) {
  const int64_t D = p.cache.head_dim;
  const float nan = __int_as_float(0x7FC00000);
  for (int64_t i = tid; i < nh * D; i += threads) {
    if (p.out_bf16)
      p.out_bf16[(r * p.hq + h0) * D + i] = nan;
    else
      p.out[(r * p.hq + h0) * D + i] = nan;
  }
  if (p.lse && tid < nh) p.lse[r * p.hq + h0 + tid] = nan;
}

template <class Codes, int NH, int MaxD>
__global__ void __launch_bounds__(kRowsWarps * 32) cached_warp_kernel(CachedParams p) {
  extern __shared__ __align__(16) float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t call = int64_t(blockIdx.x) * kRowsWarps + warp;
  if (call >= p.rows * p.calls_per_row) return;  // the whole warp
  const int64_t r = call / p.calls_per_row, h0 = (call % p.calls_per_row) * NH;
  const int64_t D = p.cache.head_dim, g = h0 / (p.hq / p.cache.kv_heads);
  int64_t slot, pos;
  if (!row_indices(p, r, slot, pos)) {
    nan_row(p, r, h0, NH, lane, 32);
    return;
  }
  float* q_s = smem + warp * p.warp_floats;
  float* lse_s = q_s + NH * p.qs + 2 * 32 * NH;  // lse when the caller wants none
  const float* qg = p.q + (r * p.hq + h0) * D;
  for (int64_t i = lane; i < NH * D; i += 32) q_s[(i / D) * p.qs + i % D] = qg[i];
  __syncwarp();
  CachedKvSource<Codes> src = cached_source<Codes>(p.cache, slot, g, q_s, p.qs);
  src.qvec = true;
  src.vec = p.vec;
  WarpSmemLanes ex;
  ex.lane = lane;
  ex.ring = q_s + NH * p.qs;
  ex.slot_floats = NH;
  float* lse = p.lse ? p.lse + r * p.hq + h0 : lse_s;
  if (p.out_bf16)
    attention_row<NH, MaxD>(ex, src, pos + 1, D, p.scale, p.out_bf16 + (r * p.hq + h0) * D, D, lse,
                            1);
  else
    attention_row<NH, MaxD>(ex, src, pos + 1, D, p.scale, p.out + (r * p.hq + h0) * D, D, lse, 1);
}

// Shared layout of the split schedule (floats): q [NH][qs], per-warp rings [W][2][32][NH], per
// chunk of a round mc / alpha / lc / m' [W][NH], the running max [NH] (padded to 4), pv [W][NH][D].
struct SplitLayout {
  int q, ring, mc, alpha, lc, mafter, mrun, pv, total;
  __host__ __device__ SplitLayout(int nh, int w, int qs, int64_t D) {
    q = 0;
    ring = q + nh * qs;
    mc = ring + w * 64 * nh;
    alpha = mc + w * nh;
    lc = alpha + w * nh;
    mafter = lc + w * nh;
    mrun = mafter + w * nh;
    pv = mrun + (nh + 3) / 4 * 4;
    total = pv + w * nh * int(D);
  }
};

template <class Codes, int NH, int MaxD, int W>
__global__ void __launch_bounds__(W * 32) cached_split_kernel(CachedParams p) {
  extern __shared__ __align__(16) float smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t r = blockIdx.x / p.calls_per_row, h0 = (blockIdx.x % p.calls_per_row) * NH;
  const int64_t D = p.cache.head_dim, g = h0 / (p.hq / p.cache.kv_heads);
  int64_t slot, pos;
  if (!row_indices(p, r, slot, pos)) {
    nan_row(p, r, h0, NH, tid, W * 32);
    return;
  }
  const SplitLayout L(NH, W, p.qs, D);
  float* q_s = smem + L.q;
  float* mc_s = smem + L.mc;
  float* alpha_s = smem + L.alpha;
  float* lc_s = smem + L.lc;
  float* mafter_s = smem + L.mafter;
  float* mrun_s = smem + L.mrun;
  float* pv_s = smem + L.pv;
  const float* qg = p.q + (r * p.hq + h0) * D;
  for (int64_t i = tid; i < NH * D; i += W * 32) q_s[(i / D) * p.qs + i % D] = qg[i];
  if (tid < NH) mrun_s[tid] = -std::numeric_limits<float>::infinity();
  __syncthreads();
  CachedKvSource<Codes> src = cached_source<Codes>(p.cache, slot, g, q_s, p.qs);
  src.qvec = true;
  src.vec = p.vec;
  WarpSmemLanes ex;
  ex.lane = lane;
  ex.ring = smem + L.ring + warp * 64 * NH;
  ex.slot_floats = NH;
  using Vec = HeadVec<float, NH>;
  using DimsT = typename WarpSmemLanes::template Dims<float, MaxD>;
  // (head, dim) pairs owned by this thread for the rescale chain: idx = tid + k W 32, h = idx / D.
  constexpr int kPairs = (NH * MaxD + W * 32 - 1) / (W * 32);
  float acc[kPairs], lp[kPairs];
#pragma unroll
  for (int k = 0; k < kPairs; ++k) acc[k] = lp[k] = 0.0f;
  const int64_t n = pos + 1, nchunks = (n + kAttentionKeyChunk - 1) / kAttentionKeyChunk;
  for (int64_t base = 0; base < nchunks; base += W) {
    const int64_t c0 = (base + warp) * kAttentionKeyChunk;
    const bool active = base + warp < nchunks;
    const int nc = active ? int(n - c0 < kAttentionKeyChunk ? n - c0 : kAttentionKeyChunk) : 0;
    WarpSmemLanes::Keys<Vec> s{nullptr, Vec{}};
    if (active) {
      s = attention_chunk_scores<NH>(ex, src, c0, nc, D, p.scale);
      const Vec mc = attention_chunk_max<NH>(ex, s, nc);
      if (lane == 0)
#pragma unroll
        for (int h = 0; h < NH; ++h) mc_s[warp * NH + h] = mc[h];
    }
    __syncthreads();
    if (active) {
      Vec m_new, alpha;
#pragma unroll
      for (int h = 0; h < NH; ++h) {
        float m = mrun_s[h];
        for (int w = 0; w < warp; ++w) m = attention_max_next(m, mc_s[w * NH + h]);
        attention_max_step(m, mc_s[warp * NH + h], m_new[h], alpha[h]);
      }
      const auto pk = attention_chunk_probs<NH>(ex, s, nc, m_new);
      Vec lc;
      DimsT pv[NH];
      attention_chunk_pv<NH, MaxD>(ex, src, pk, c0, nc, D, lc, pv);
      if (lane == 0)
#pragma unroll
        for (int h = 0; h < NH; ++h) {
          lc_s[warp * NH + h] = lc[h];
          alpha_s[warp * NH + h] = alpha[h];
          mafter_s[warp * NH + h] = m_new[h];
        }
#pragma unroll
      for (int h = 0; h < NH; ++h)
        ex.template for_dims<MaxD>(
            D, [&](int64_t d, int i) { pv_s[(warp * NH + h) * D + d] = pv[h][i]; });
    }
    __syncthreads();
    const int A = int(nchunks - base < W ? nchunks - base : W);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int64_t idx = tid + int64_t(k) * W * 32;
      if (idx >= NH * D) continue;
      const int64_t h = idx / D, d = idx % D;
      for (int w = 0; w < A; ++w) {
        const float a = alpha_s[w * NH + h];
        acc[k] = attention_rescale_add(acc[k], a, pv_s[(w * NH + h) * D + d]);
        lp[k] = attention_rescale_add(lp[k], a, lc_s[w * NH + h]);
      }
    }
    // Read by the next round's max chain only after its first barrier.
    if (tid < NH) mrun_s[tid] = mafter_s[(A - 1) * NH + tid];
  }
  __syncthreads();
  const int64_t o0 = (r * p.hq + h0) * D;
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    const int64_t idx = tid + int64_t(k) * W * 32;
    if (idx >= NH * D) continue;
    if (p.out_bf16)
      p.out_bf16[o0 + idx] = attention_out(acc[k], lp[k]);
    else
      p.out[o0 + idx] = attention_out(acc[k], lp[k]);
    if (idx % D == 0 && p.lse)
      p.lse[r * p.hq + h0 + idx / D] = attention_lse(mrun_s[idx / D], lp[k]);
  }
}

constexpr int split_warps(int nh) { return nh <= 2 ? 16 : (nh == 4 ? 8 : 4); }

template <class Codes, int NH, int MaxD>
void launch(const CachedParams& p, CachedPath path, cudaStream_t st) {
  const int64_t calls = p.rows * p.calls_per_row;
  if (path == CachedPath::kWarp) {
    const size_t smem = size_t(kRowsWarps) * p.warp_floats * sizeof(float);
    cached_warp_kernel<Codes, NH, MaxD>
        <<<unsigned((calls + kRowsWarps - 1) / kRowsWarps), kRowsWarps * 32, smem, st>>>(p);
  } else {
    constexpr int W = split_warps(NH);
    const size_t smem = size_t(SplitLayout(NH, W, p.qs, p.cache.head_dim).total) * sizeof(float);
    auto kern = cached_split_kernel<Codes, NH, MaxD, W>;
    static const bool once =
        (allow_smem(kern, SplitLayout(NH, W, 256, 256).total * sizeof(float)), true);
    (void)once;
    kern<<<unsigned(calls), W * 32, smem, st>>>(p);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <class Codes>
void launch_codes(const CachedParams& p, int nh, CachedPath path, cudaStream_t st) {
  const bool wide = p.cache.head_dim > 128;
  auto go = [&](auto nh_c) {
    constexpr int NH = decltype(nh_c)::value;
    if (wide)
      launch<Codes, NH, 256>(p, path, st);
    else
      launch<Codes, NH, 128>(p, path, st);
  };
  switch (nh) {
    case 8:
      go(std::integral_constant<int, 8>{});
      break;
    case 4:
      go(std::integral_constant<int, 4>{});
      break;
    case 2:
      go(std::integral_constant<int, 2>{});
      break;
    default:
      go(std::integral_constant<int, 1>{});
      break;
  }
}

}  // namespace

void attention_cached(const Tensor& q, const KvCacheView& cache, const Tensor& slots,
                      const Tensor& positions, int64_t q_heads, float scale, Tensor& out,
                      Tensor* lse, CachedPath path, int nh) {
  CachedParams p;
  p.q = q.ptr<float>();
  p.cache = cache;
  p.slots = slots.raw(), p.positions = positions.raw();
  p.slots64 = slots.dtype() == DType::kI64, p.pos64 = positions.dtype() == DType::kI64;
  if (out.dtype() == DType::kBF16)
    p.out_bf16 = static_cast<num::Bf16Out*>(out.raw());
  else
    p.out = out.ptr<float>();
  p.lse = lse ? lse->ptr<float>() : nullptr;
  p.rows = q.numel() / (q_heads * cache.head_dim), p.hq = q_heads;
  p.scale = scale;
  // 8 codes per vector load: 16 bytes (bf16) or 8 (fp8) at every row start.
  const uintptr_t align = cache.dtype == KvDtype::kBf16 ? 15u : 7u;
  p.vec = cache.head_dim % 8 == 0 && (reinterpret_cast<uintptr_t>(cache.k) & align) == 0 &&
          (reinterpret_cast<uintptr_t>(cache.v) & align) == 0;
  p.qs = int((cache.head_dim + 3) / 4 * 4);
  if (p.rows == 0) return;
  const int64_t rep = q_heads / cache.kv_heads;
  const int sms = sm_count();
  if (nh == 0) {
    // The most heads per call (each K / V element loaded once for them) that still gives about two
    // blocks per SM.
    nh = attention_row_heads(rep);
    while (nh > 1 && p.rows * (q_heads / nh) < 2 * sms) nh /= 2;
  }
  if (nh < 1 || nh > kAttentionMaxRowHeads || rep % nh != 0)
    throw std::invalid_argument("attention_cached: heads per call must divide Hq / Hkv");
  p.calls_per_row = q_heads / nh;
  p.warp_floats = (nh * p.qs + 2 * 32 * nh + nh + 3) / 4 * 4;  // 16-byte aligned per warp
  if (path == CachedPath::kAuto)
    path = p.rows * p.calls_per_row >= int64_t(sms) * 32 ? CachedPath::kWarp : CachedPath::kSplit;
  const cudaStream_t st = cuda::cu(Stream{});
  if (cache.dtype == KvDtype::kBf16)
    launch_codes<uint16_t>(p, nh, path, st);
  else
    launch_codes<uint8_t>(p, nh, path, st);
}

}  // namespace lockstep::ops::attention_cuda
