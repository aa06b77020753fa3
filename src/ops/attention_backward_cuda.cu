// Attention backward on CUDA (attention_cuda.h): flash-style, recomputed from lse, bf16 tensor
// cores, deterministic (no atomics, every output element written once in a fixed order):
//   prepass: Q, K, V, dO to bf16 [H, T, KD]; Di = sum_d dout * out (a warp per (token, head),
//            fixed tree), lse2 = lse * log2(e), both [Hq, T];
//   dK / dV: a block per (64-key tile, kv head); its 4 warps own 16 keys each and loop over the
//            group's query heads (ascending) and their 32-query tiles from the diagonal on
//            (ascending): S^T = K Q^T, P^T = 2^(S^T c - lse2), dP^T = V dO^T,
//            dS^T = P^T (dP^T - Di), dV += P^T dO, dK += dS^T Q; then dK *= scale;
//   dQ:      a block per (64-query tile, query head); warps own 16 queries each and loop over key
//            tiles up to the diagonal: S, P, dP = dO V^T, dS as above, dQ += dS K; dQ *= scale.
// P, dS, Q, K, V and dO enter the mma as bf16 (bound: docs/ops.md). For head dims above 128 the
// dK / dV kernel runs twice (dV, then dK), keeping its accumulators in registers.
// Napkin math (16K tokens of 4K-token sequences, Hq 32, Hkv 4, D 128): dK / dV 4 and dQ 3 causal
// GEMMs of T n Hq D flops each, about 1.9 TFLOP: 8-10 ms at 200-250 TFLOP/s of mma.sync.
#include "attention_cuda.h"
#include "attention_cuda_common.cuh"

namespace lockstep::ops::attention_cuda {

using namespace detail;

namespace {

constexpr float kLog2e = 1.44269504088896341f;

struct BwdParams {
  const uint16_t* q = nullptr;  // bf16 [Hq, T, KD]
  const uint16_t* k = nullptr;  // bf16 [Hkv, T, KD]
  const uint16_t* v = nullptr;
  const uint16_t* dout = nullptr;  // bf16 [Hq, T, KD]
  const float* lse2 = nullptr;     // [Hq, T]
  const float* di = nullptr;       // [Hq, T]
  float* dq = nullptr;             // [T, Hq * D]
  float* dk = nullptr;             // [T, Hkv * D]
  float* dv = nullptr;
  PackedSchedule sched;
  int64_t T = 0, hq = 0, hkv = 0, D = 0;
  float scale = 0, scale_log2 = 0;
};

// Di and lse2 of (token t, head h): one warp, lanes over d (stride 32), then a fixed tree.
__global__ void bwd_prepass_kernel(const float* dout, const float* out, const float* lse, int64_t T,
                                   int64_t hq, int64_t D, float* di, float* lse2) {
  const int lane = threadIdx.x & 31;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= T * hq) return;
  const int64_t t = w / hq, h = w % hq;
  const float* a = dout + w * D;
  const float* b = out + w * D;
  float s = 0.0f;
  for (int64_t d = lane; d < D; d += 32) s = s + a[d] * b[d];
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) s = s + __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) {
    di[h * T + t] = s;
    lse2[h * T + t] = lse[w] * kLog2e;
  }
}

template <int KD>
struct BwdTile {
  static constexpr int kS = KD + 8;
  // dK / dV: 64 keys, 32-query steps.
  static constexpr int kBK = kTile, kBQ = 32;
  static constexpr size_t kSmemKV =
      size_t(2 * kBK + 4 * kBQ) * kS * sizeof(uint16_t) + 4 * kBQ * sizeof(float);
  // dQ: 64 queries, key steps of 64 (32 for KD 256).
  static constexpr int kBR = kTile, kBC = KD <= 128 ? 64 : 32;
  static constexpr size_t kSmemQ = size_t(2 * kBR + 4 * kBC) * kS * sizeof(uint16_t);
};

// Rows row0 .. row0 + rows - 1 of a [n, KD] bf16 operand into smem rows of stride S (zero past n).
template <int KD, int kThreads>
__device__ __forceinline__ void load_rows(uint16_t* dst, const uint16_t* src, int64_t row0,
                                          int rows, int64_t n, int tid) {
  constexpr int CPR = KD / 8, S = KD + 8;
  for (int i = tid; i < rows * CPR; i += kThreads) {
    const int r = i / CPR, c = i % CPR;
    const bool ok = row0 + r < n;
    cp_async16(dst + r * S + c * 8, src + (ok ? row0 + r : 0) * KD + c * 8, ok);
  }
}

// acc[16 x N] += A[16 x K] B[K x N] where A comes from smem rows (this warp's 16 rows, K = KD along
// the row) and B^T from smem rows (N rows, K along the row): the S = X Y^T products.
template <int KD, int NT>
__device__ __forceinline__ void mma_rows_rows(float (&acc)[NT][4], const uint16_t* A,
                                              const uint16_t* B, int lane) {
  constexpr int S = KD + 8;
#pragma unroll
  for (int ks = 0; ks < KD / 16; ++ks) {
    uint32_t a[4];
    ldsm_x4(a, A + (lane & 15) * S + ks * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldsm_x4(
          b, B + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * S + ks * 16 + ((lane >> 3) & 1) * 8);
      mma_bf16(acc[2 * np], a, b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc[16 x KD] += F[16 x 16 kk] X[16 kk x KD]: F from C fragments (fp32, rounded to bf16 here) of a
// 16 x (8 NT) product, X rows in smem (row = the reduction index).
template <int KD, int NT>
__device__ __forceinline__ void mma_frag_rows(float (&acc)[KD / 8][4], const float (&f)[NT][4],
                                              const uint16_t* X, int lane) {
  constexpr int S = KD + 8;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    const uint32_t a[4] = {pack_bf16(f[2 * kk][0], f[2 * kk][1]),
                           pack_bf16(f[2 * kk][2], f[2 * kk][3]),
                           pack_bf16(f[2 * kk + 1][0], f[2 * kk + 1][1]),
                           pack_bf16(f[2 * kk + 1][2], f[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < KD / 16; ++dp) {
      uint32_t b[4];
      ldsm_x4_t(b, X + (kk * 16 + (lane & 15)) * S + dp * 16 + (lane >> 4) * 8);
      mma_bf16(acc[2 * dp], a, b[0], b[1]);
      mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// The 16 x KD accumulator rows row0 + (g, g + 8) to out[(c0 + row) * ld + col0 + d] times `mul`.
template <int KD>
__device__ __forceinline__ void store_acc(const float (&acc)[KD / 8][4], float* out, int64_t ld,
                                          int64_t c0, int64_t row0, int64_t n, int64_t D, float mul,
                                          int lane) {
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + gq + 8 * r;
    if (row >= n) continue;
    float* o = out + (c0 + row) * ld;
#pragma unroll
    for (int dt = 0; dt < KD / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = dt * 8 + 2 * tq + e;
        if (d < D) o[d] = acc[dt][2 * r + e] * mul;
      }
  }
}

// kPart: 0 dK and dV, 1 dV only, 2 dK only.
template <int KD, int kPart>
__global__ void __launch_bounds__(128) flash_bwd_dkdv_kernel(BwdParams p) {
  using Cfg = BwdTile<KD>;
  constexpr int BK = Cfg::kBK, BQ = Cfg::kBQ, S = Cfg::kS, NQ = BQ / 8, DT = KD / 8;
  constexpr bool kDV = kPart != 2, kDK = kPart != 1;
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* Ks = sm;                                         // [BK][S]
  uint16_t* Vs = Ks + BK * S;                                // [BK][S]
  uint16_t* Qs = Vs + BK * S;                                // [2][BQ][S]
  uint16_t* Os = Qs + 2 * BQ * S;                            // dO: [2][BQ][S]
  float* lse_s = reinterpret_cast<float*>(Os + 2 * BQ * S);  // [2][BQ]
  float* di_s = lse_s + 2 * BQ;                              // [2][BQ]
  int64_t seq, tile;
  if (!tile_of(p.sched, blockIdx.x, seq, tile)) return;
  const int64_t g = blockIdx.y, rep = p.hq / p.hkv;
  const int64_t c0 = p.sched.cu[seq], n = p.sched.cu[seq + 1] - c0;
  const int64_t k0 = tile * BK;  // the first key tiles (most queries) first
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  load_rows<KD, 128>(Ks, p.k + (g * p.T + c0) * KD, k0, BK, n, tid);
  load_rows<KD, 128>(Vs, p.v + (g * p.T + c0) * KD, k0, BK, n, tid);
  const int64_t qt0 = k0 / BQ, nqt = (n + BQ - 1) / BQ - qt0;  // query tiles from the diagonal
  const int64_t iters = rep * nqt;
  // Iteration it: query head g rep + it / nqt, queries (qt0 + it % nqt) BQ ...
  auto issue = [&](int64_t it, int b) {
    const int64_t h = g * rep + it / nqt, q0 = (qt0 + it % nqt) * BQ;
    load_rows<KD, 128>(Qs + b * BQ * S, p.q + (h * p.T + c0) * KD, q0, BQ, n, tid);
    load_rows<KD, 128>(Os + b * BQ * S, p.dout + (h * p.T + c0) * KD, q0, BQ, n, tid);
    if (tid < BQ) {
      const bool ok = q0 + tid < n;
      lse_s[b * BQ + tid] = ok ? p.lse2[h * p.T + c0 + q0 + tid] : 0.0f;
      di_s[b * BQ + tid] = ok ? p.di[h * p.T + c0 + q0 + tid] : 0.0f;
    }
  };
  issue(0, 0);
  cp_async_commit();
  float dv[kDV ? DT : 1][4], dk[kDK ? DT : 1][4];
#pragma unroll
  for (int i = 0; i < (kDV ? DT : 1); ++i) dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < (kDK ? DT : 1); ++i) dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
  const int64_t key[2] = {k0 + warp * 16 + gq, k0 + warp * 16 + gq + 8};
  for (int64_t it = 0; it < iters; ++it) {
    const int b = int(it & 1);
    if (it + 1 < iters) {
      issue(it + 1, b ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t q0 = (qt0 + it % nqt) * BQ;
    const uint16_t* Qb = Qs + b * BQ * S;
    const uint16_t* Ob = Os + b * BQ * S;
    // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys x BQ queries.
    float st[NQ][4], dpt[NQ][4];
#pragma unroll
    for (int i = 0; i < NQ; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.0f;
    mma_rows_rows<KD, NQ>(st, Ks + warp * 16 * S, Qb, lane);
    mma_rows_rows<KD, NQ>(dpt, Vs + warp * 16 * S, Ob, lane);
    // P^T and dS^T (masked: query < key, or either past the sequence, gives 0).
#pragma unroll
    for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * tq + (e & 1);
        const int64_t qpos = q0 + qi, kpos = key[e >> 1];
        const bool live = qpos >= kpos && qpos < n && kpos < n;
        const float pe = live ? ex2_approx(st[nt][e] * p.scale_log2 - lse_s[b * BQ + qi]) : 0.0f;
        st[nt][e] = pe;
        dpt[nt][e] = pe * (dpt[nt][e] - di_s[b * BQ + qi]);
      }
    if constexpr (kDV) mma_frag_rows<KD, NQ>(dv, st, Ob, lane);
    if constexpr (kDK) mma_frag_rows<KD, NQ>(dk, dpt, Qb, lane);
    __syncthreads();  // every warp is done with buffer b before the next prefetch reuses it
  }
  const int64_t ld = p.hkv * p.D;
  if constexpr (kDV) store_acc<KD>(dv, p.dv + g * p.D, ld, c0, k0 + warp * 16, n, p.D, 1.0f, lane);
  if constexpr (kDK)
    store_acc<KD>(dk, p.dk + g * p.D, ld, c0, k0 + warp * 16, n, p.D, p.scale, lane);
}

template <int KD>
__global__ void __launch_bounds__(128) flash_bwd_dq_kernel(BwdParams p) {
  using Cfg = BwdTile<KD>;
  constexpr int BR = Cfg::kBR, BC = Cfg::kBC, S = Cfg::kS, NT = BC / 8, DT = KD / 8;
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* Qs = sm;               // [BR][S]
  uint16_t* Os = Qs + BR * S;      // dO: [BR][S]
  uint16_t* Ks = Os + BR * S;      // [2][BC][S]
  uint16_t* Vs = Ks + 2 * BC * S;  // [2][BC][S]
  int64_t seq, tile;
  if (!tile_of(p.sched, blockIdx.x, seq, tile)) return;
  const int64_t h = blockIdx.y, g = h / (p.hq / p.hkv);
  const int64_t c0 = p.sched.cu[seq], n = p.sched.cu[seq + 1] - c0;
  const int64_t q0 = ((n + BR - 1) / BR - 1 - tile) * BR;  // the longest query tiles first
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const uint16_t* kg = p.k + (g * p.T + c0) * KD;
  const uint16_t* vg = p.v + (g * p.T + c0) * KD;
  load_rows<KD, 128>(Qs, p.q + (h * p.T + c0) * KD, q0, BR, n, tid);
  load_rows<KD, 128>(Os, p.dout + (h * p.T + c0) * KD, q0, BR, n, tid);
  load_rows<KD, 128>(Ks, kg, 0, BC, n, tid);
  load_rows<KD, 128>(Vs, vg, 0, BC, n, tid);
  cp_async_commit();
  const int64_t row[2] = {q0 + warp * 16 + gq, q0 + warp * 16 + gq + 8};
  float lse2[2], di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool ok = row[r] < n;
    lse2[r] = ok ? p.lse2[h * p.T + c0 + row[r]] : 0.0f;
    di[r] = ok ? p.di[h * p.T + c0 + row[r]] : 0.0f;
  }
  const int64_t q_last = (q0 + BR < n ? q0 + BR : n) - 1;
  const int nkt = int(q_last / BC) + 1;
  float dq[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  for (int kt = 0; kt < nkt; ++kt) {
    const int b = kt & 1;
    if (kt + 1 < nkt) {
      load_rows<KD, 128>(Ks + (b ^ 1) * BC * S, kg, int64_t(kt + 1) * BC, BC, n, tid);
      load_rows<KD, 128>(Vs + (b ^ 1) * BC * S, vg, int64_t(kt + 1) * BC, BC, n, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* Kb = Ks + b * BC * S;
    const uint16_t* Vb = Vs + b * BC * S;
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.0f;
    mma_rows_rows<KD, NT>(s, Qs + warp * 16 * S, Kb, lane);
    mma_rows_rows<KD, NT>(dp, Os + warp * 16 * S, Vb, lane);
    const int64_t kbase = int64_t(kt) * BC;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = kbase + nt * 8 + 2 * tq + (e & 1), i = row[e >> 1];
        const bool live = j <= i && i < n && j < n;
        const float pe = live ? ex2_approx(s[nt][e] * p.scale_log2 - lse2[e >> 1]) : 0.0f;
        s[nt][e] = pe * (dp[nt][e] - di[e >> 1]);  // dS
      }
    mma_frag_rows<KD, NT>(dq, s, Kb, lane);
    __syncthreads();
  }
  store_acc<KD>(dq, p.dq + h * p.D, p.hq * p.D, c0, q0 + warp * 16, n, p.D, p.scale, lane);
}

template <int KD>
void launch_bwd(const BwdParams& p, cudaStream_t st) {
  using Cfg = BwdTile<KD>;
  const dim3 kv_grid(unsigned(p.sched.max_tiles), unsigned(p.hkv));
  const dim3 q_grid(unsigned(p.sched.max_tiles), unsigned(p.hq));
  auto run_kv = [&](auto kern) {
    allow_smem(kern, Cfg::kSmemKV);
    kern<<<kv_grid, 128, Cfg::kSmemKV, st>>>(p);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  };
  if constexpr (KD <= 128) {
    static const bool once = (allow_smem(flash_bwd_dkdv_kernel<KD, 0>, Cfg::kSmemKV), true);
    (void)once;
    flash_bwd_dkdv_kernel<KD, 0><<<kv_grid, 128, Cfg::kSmemKV, st>>>(p);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  } else {
    run_kv(flash_bwd_dkdv_kernel<KD, 1>);
    run_kv(flash_bwd_dkdv_kernel<KD, 2>);
  }
  static const bool once_q = (allow_smem(flash_bwd_dq_kernel<KD>, Cfg::kSmemQ), true);
  (void)once_q;
  flash_bwd_dq_kernel<KD><<<q_grid, 128, Cfg::kSmemQ, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, const Tensor& dout, const Tensor& cu, const AttentionDims& dims,
              float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t T = q.numel() / (dims.q_heads * dims.head_dim);
  if (T == 0) return;
  const cudaStream_t st = cuda::cu(Stream{});
  cuda::Scratch scratch(q.device(), Stream{});
  const int kd = flash_head_dim(dims.head_dim);
  BwdParams p;
  p.sched = make_schedule(cu, T, scratch);
  uint16_t* qb = scratch.get<uint16_t>(size_t(dims.q_heads * T * kd));
  uint16_t* kb = scratch.get<uint16_t>(size_t(dims.kv_heads * T * kd));
  uint16_t* vb = scratch.get<uint16_t>(size_t(dims.kv_heads * T * kd));
  uint16_t* ob = scratch.get<uint16_t>(size_t(dims.q_heads * T * kd));
  float* lse2 = scratch.get<float>(size_t(dims.q_heads * T));
  float* di = scratch.get<float>(size_t(dims.q_heads * T));
  to_bf16_heads(q.ptr<float>(), qb, T, dims.q_heads, dims.head_dim, kd, st);
  to_bf16_heads(k.ptr<float>(), kb, T, dims.kv_heads, dims.head_dim, kd, st);
  to_bf16_heads(v.ptr<float>(), vb, T, dims.kv_heads, dims.head_dim, kd, st);
  to_bf16_heads(dout.ptr<float>(), ob, T, dims.q_heads, dims.head_dim, kd, st);
  const int64_t warps = T * dims.q_heads;
  bwd_prepass_kernel<<<unsigned((warps * 32 + 255) / 256), 256, 0, st>>>(
      dout.ptr<float>(), out.ptr<float>(), lse.ptr<float>(), T, dims.q_heads, dims.head_dim, di,
      lse2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  p.q = qb, p.k = kb, p.v = vb, p.dout = ob, p.lse2 = lse2, p.di = di;
  p.dq = dq.ptr<float>(), p.dk = dk.ptr<float>(), p.dv = dv.ptr<float>();
  p.T = T, p.hq = dims.q_heads, p.hkv = dims.kv_heads, p.D = dims.head_dim;
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  switch (kd) {
    case 32:
      launch_bwd<32>(p, st);
      break;
    case 64:
      launch_bwd<64>(p, st);
      break;
    case 128:
      launch_bwd<128>(p, st);
      break;
    default:
      launch_bwd<256>(p, st);
      break;
  }
}

}  // namespace lockstep::ops::attention_cuda
