// CUDA kernels of attention_row on packed sequences (the learner's kRowwise forward) and the KV
// cache's rounding and writes (attention_cuda.h). One warp per (token, NH query heads of a GQA
// group) runs attention_row (ops/attention.h) with the shared-memory warp executor: the CPU's bits.
// Napkin math (H200, T tokens of sequences of length n, Hq heads of D): the row function does
// 4 D flops per (query head, key) on the CUDA cores (no FMA: mul and add are separate rounded
// operations), T n Hq D 2 flops for causal rows, about 16 ms per layer for 16K tokens of 4K-token
// sequences at Hq 32, D 128 (33.5 T instructions/s); K / V reads hit L1 / L2 (NH = 8 heads share a
// load).
#include "attention_cuda.h"
#include "attention_cuda_common.cuh"
#include "attention_rows_cuda.cuh"
#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/rope.h"
#include "ops_cuda.cuh"

namespace lockstep::ops::attention_cuda {

using namespace detail;

namespace {

constexpr int kRowsWarps = 4;  // warps (independent rows) per block

struct PackedParams {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  PackedSchedule sched;
  int64_t tokens = 0, hq = 0, hkv = 0, D = 0, calls_per_token = 0;
  int qs = 0;           // q row stride in shared memory (D rounded up to 4)
  int warp_floats = 0;  // shared floats per warp
  float scale = 0;
  bool vec = false;  // k, v 16-byte aligned rows of D % 4 == 0 floats
};

template <int NH, int MaxD>
__global__ void __launch_bounds__(kRowsWarps * 32) packed_rows_kernel(PackedParams p) {
  extern __shared__ __align__(16) float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t call = int64_t(blockIdx.x) * kRowsWarps + warp;
  if (call >= p.tokens * p.calls_per_token) return;  // the whole warp
  const int64_t t = call / p.calls_per_token, h0 = (call % p.calls_per_token) * NH;
  const int64_t D = p.D, g = h0 / (p.hq / p.hkv);
  float* q_s = smem + warp * p.warp_floats;
  const float* qg = p.q + (t * p.hq + h0) * D;
  for (int64_t i = lane; i < NH * D; i += 32) q_s[(i / D) * p.qs + i % D] = qg[i];
  __syncwarp();
  const int64_t s0 = p.sched.cu[seq_of_token(p.sched, t)];
  StridedKvSource<float> src;
  src.q = q_s;
  src.head_stride = p.qs;
  src.qvec = true;
  src.k = p.k + (s0 * p.hkv + g) * D;
  src.v_ = p.v + (s0 * p.hkv + g) * D;
  src.kv_stride = p.hkv * D;
  src.vec = p.vec;
  WarpSmemLanes ex;
  ex.lane = lane;
  ex.ring = q_s + NH * p.qs;
  ex.slot_floats = NH;
  attention_row<NH, MaxD>(ex, src, t - s0 + 1, D, p.scale, p.out + (t * p.hq + h0) * D, D,
                          p.lse + t * p.hq + h0, 1);
}

template <int NH, int MaxD>
void launch_packed(const PackedParams& p, cudaStream_t st) {
  const int64_t calls = p.tokens * p.calls_per_token;
  const size_t smem = size_t(kRowsWarps) * p.warp_floats * sizeof(float);
  packed_rows_kernel<NH, MaxD>
      <<<unsigned((calls + kRowsWarps - 1) / kRowsWarps), kRowsWarps * 32, smem, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

// ---- KV rounding and cache writes: one warp per (row, kv head, K or V) --------------------------

struct KvParams {
  const float* k = nullptr;  // rows [rows, Hkv * D]
  const float* v = nullptr;
  float* inplace = nullptr;  // kv_round: the tensor itself (k == inplace, v unused)
  KvCacheView cache;
  const void* slots = nullptr;
  const void* positions = nullptr;
  bool slots64 = false, pos64 = false;
  int64_t rows = 0, hkv = 0, D = 0;
  KvDtype dtype = KvDtype::kBf16;
  int parts = 2;  // 1: kv_round (one tensor), 2: K and V
};

// The amax of a row of D <= 256 values held 8 per lane (d = lane + 32 i): fmax semantics, so the
// order of the warp tree does not change the result.
__device__ __forceinline__ float warp_amax(const float (&x)[8], int64_t D, int lane) {
  float a = num::amax_empty();
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (lane + 32 * i < D) a = num::amax_fold(a, x[i]);
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) a = num::fmax_f32(a, __shfl_xor_sync(0xffffffffu, a, off));
  return a;
}

// Stores the row of kv head g (8 values a lane: d = lane + 32 i; s: its fp8 scale) as K (part 0)
// or V (part 1) at (slot, pos) of the cache by the cache rule; out-of-range indices store nothing.
__device__ __forceinline__ void store_kv_row(const KvCacheView& c, int part, int64_t g,
                                             int64_t slot, int64_t pos, const float (&x)[8],
                                             float s, int lane) {
  if (slot < 0 || slot >= c.slots || pos < 0 || pos >= c.max_pos) return;
  const int64_t at = slot * c.max_pos + pos, D = c.head_dim;
  void* base = part == 0 ? c.k : c.v;
  if (c.dtype == KvDtype::kBf16) {
    uint16_t* dst = static_cast<uint16_t*>(base) + (at * c.kv_heads + g) * D;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (lane + 32 * i < D) dst[lane + 32 * i] = kv_bf16_code(x[i]);
  } else {
    uint8_t* dst = static_cast<uint8_t*>(base) + (at * c.kv_heads + g) * D;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (lane + 32 * i < D) dst[lane + 32 * i] = kv_fp8_code(x[i], s);
    if (lane == 0) (part == 0 ? c.k_scale : c.v_scale)[at * c.kv_heads + g] = s;
  }
}

__global__ void kv_rows_kernel(KvParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= p.rows * p.hkv * p.parts) return;
  const int part = int(w % p.parts);
  const int64_t rg = w / p.parts, r = rg / p.hkv, g = rg % p.hkv, D = p.D;
  const float* src = (part == 0 ? p.k : p.v) + (r * p.hkv + g) * D;
  float x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = lane + 32 * i < D ? src[lane + 32 * i] : 0.0f;
  const float s = p.dtype == KvDtype::kFp8E4M3 ? kv_fp8_scale(warp_amax(x, D, lane)) : 1.0f;
  if (p.inplace) {
    float* dst = p.inplace + (r * p.hkv + g) * D;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t d = lane + 32 * i;
      if (d >= D) continue;
      dst[d] = p.dtype == KvDtype::kBf16 ? kv_bf16_value(kv_bf16_code(x[i]))
                                         : kv_fp8_value(kv_fp8_code(x[i], s), s);
    }
    return;
  }
  store_kv_row(p.cache, part, g, index_at(p.slots, p.slots64, r), index_at(p.positions, p.pos64, r),
               x, s, lane);
}

void launch_kv(const KvParams& p) {
  const int64_t warps = p.rows * p.hkv * p.parts;
  if (warps == 0) return;
  kv_rows_kernel<<<unsigned((warps * 32 + 255) / 256), 256, 0, cuda::cu(Stream{})>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

// ---- the cached step's prologue: one warp per (token, head row) of qkv -------------------------
// Rows 0 .. Hq - 1 of a token are q heads: rmsnorm_row with q_norm, then rope_pair, into q. Rows
// Hq .. Hq + Hkv - 1 are k heads: the same with k_norm into the warp's shared row, then stored by
// the cache rule. The last Hkv rows are v heads, stored as they are. The row functions and their
// order are those of the rmsnorm kernels, RopeOp and kv_rows_kernel: the same bits as running the
// three.
struct PrologueParams {
  const float* qkv = nullptr;  // [tokens, (hq + 2 hkv) * D]
  const float* q_w = nullptr;  // [D]
  const float* k_w = nullptr;  // [D]
  float eps = 0;
  const int32_t* positions = nullptr;  // [tokens]
  const void* slots = nullptr;         // [tokens], I32 or I64
  bool slots64 = false;
  const float* cos = nullptr;  // rope table [rope_max_pos, D]
  const float* sin = nullptr;
  int32_t rope_max_pos = 0;
  KvCacheView cache;
  float* q = nullptr;  // [tokens, hq * D]
  int64_t tokens = 0, hq = 0;
};

constexpr int kPrologueWarps = 4;

__global__ void __launch_bounds__(kPrologueWarps * 32) prologue_kernel(PrologueParams p) {
  __shared__ float k_rows[kPrologueWarps][kAttentionMaxHeadDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t hkv = p.cache.kv_heads, D = p.cache.head_dim, half = D / 2;
  const int64_t per_token = p.hq + 2 * hkv;
  const int64_t w = int64_t(blockIdx.x) * kPrologueWarps + warp;
  if (w >= p.tokens * per_token) return;  // the whole warp
  const int64_t t = w / per_token, h = w % per_token;
  const float* src = p.qkv + w * D;
  const int32_t pos = p.positions[t];
  float x[8];
  if (h < p.hq + hkv) {
    const bool is_q = h < p.hq;
    float* y = is_q ? p.q + (t * p.hq + h) * D : k_rows[warp];
    float rstd;
    rmsnorm_row(WarpLanes{lane}, src, is_q ? p.q_w : p.k_w, D, p.eps, y, &rstd);
    __syncwarp();
    const bool in_table = pos >= 0 && pos < p.rope_max_pos;
    for (int64_t j = lane; j < half; j += 32) {
      if (!in_table)
        y[j] = y[j + half] = cuda_detail::nan_f32();
      else
        rope_pair<float, false>(y, p.cos + int64_t(pos) * D, p.sin + int64_t(pos) * D, half, j, y);
    }
    if (is_q) return;
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = lane + 32 * i < D ? y[lane + 32 * i] : 0.0f;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = lane + 32 * i < D ? src[lane + 32 * i] : 0.0f;
  }
  const int part = h < p.hq + hkv ? 0 : 1;
  const int64_t g = part == 0 ? h - p.hq : h - p.hq - hkv;
  const float s = p.cache.dtype == KvDtype::kFp8E4M3 ? kv_fp8_scale(warp_amax(x, D, lane)) : 1.0f;
  store_kv_row(p.cache, part, g, index_at(p.slots, p.slots64, t), pos, x, s, lane);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void rowwise_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu,
                     const AttentionDims& dims, float scale, Tensor& out, Tensor& lse) {
  const int64_t tokens = q.numel() / (dims.q_heads * dims.head_dim);
  if (tokens == 0) return;
  const cudaStream_t st = cuda::cu(Stream{});
  cuda::Scratch scratch(q.device(), Stream{});
  PackedParams p;
  p.sched = make_schedule(cu, tokens, scratch);
  p.q = q.ptr<float>(), p.k = k.ptr<float>(), p.v = v.ptr<float>();
  p.out = out.ptr<float>(), p.lse = lse.ptr<float>();
  p.tokens = tokens, p.hq = dims.q_heads, p.hkv = dims.kv_heads, p.D = dims.head_dim;
  p.scale = scale;
  p.vec = dims.head_dim % 4 == 0 && aligned16(p.k) && aligned16(p.v);
  p.qs = int((dims.head_dim + 3) / 4 * 4);
  const int nh = attention_row_heads(dims.q_heads / dims.kv_heads);
  p.calls_per_token = dims.q_heads / nh;
  p.warp_floats = nh * p.qs + 2 * 32 * nh;
  const bool wide = dims.head_dim > 128;
  auto go = [&](auto nh_c) {
    constexpr int NH = decltype(nh_c)::value;
    if (wide)
      launch_packed<NH, 256>(p, st);
    else
      launch_packed<NH, 128>(p, st);
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

void kv_round(Tensor& x, int64_t kv_heads, int64_t head_dim, KvDtype dtype) {
  KvParams p;
  p.k = p.inplace = x.ptr<float>();
  p.rows = x.numel() / (kv_heads * head_dim), p.hkv = kv_heads, p.D = head_dim;
  p.dtype = dtype;
  p.parts = 1;
  launch_kv(p);
}

void kv_cache_write(const KvCacheView& cache, const Tensor& k_rows, const Tensor& v_rows,
                    const Tensor& slots, const Tensor& positions) {
  KvParams p;
  p.k = k_rows.ptr<float>(), p.v = v_rows.ptr<float>();
  p.cache = cache;
  p.slots = slots.raw(), p.positions = positions.raw();
  p.slots64 = slots.dtype() == DType::kI64;
  p.pos64 = positions.dtype() == DType::kI64;
  p.rows = k_rows.numel() / (cache.kv_heads * cache.head_dim);
  p.hkv = cache.kv_heads, p.D = cache.head_dim, p.dtype = cache.dtype;
  launch_kv(p);
}

void cached_qkv_prologue(const KvCacheView& cache, const Tensor& qkv, const Tensor& q_w,
                         const Tensor& k_w, float eps, const Tensor& positions, const Tensor& slots,
                         const Tensor& cos, const Tensor& sin, int64_t rope_max_pos,
                         int64_t q_heads, Tensor& q) {
  PrologueParams p;
  p.qkv = qkv.ptr<float>(), p.q_w = q_w.ptr<float>(), p.k_w = k_w.ptr<float>(), p.eps = eps;
  p.positions = positions.ptr<int32_t>();
  p.slots = slots.raw(), p.slots64 = slots.dtype() == DType::kI64;
  p.cos = cos.ptr<float>(), p.sin = sin.ptr<float>();
  p.rope_max_pos = int32_t(rope_max_pos < int64_t(INT32_MAX) ? rope_max_pos : int64_t(INT32_MAX));
  p.cache = cache;
  p.q = q.ptr<float>();
  p.tokens = positions.numel(), p.hq = q_heads;
  const int64_t warps = p.tokens * (q_heads + 2 * cache.kv_heads);
  if (warps == 0) return;
  prologue_kernel<<<unsigned((warps + kPrologueWarps - 1) / kPrologueWarps), kPrologueWarps * 32, 0,
                    cuda::cu(Stream{})>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::ops::attention_cuda
