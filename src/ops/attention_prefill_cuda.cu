// The learner's fast attention forward on CUDA (kPrefill, attention_cuda.h): a flash-attention
// kernel on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators). Q, K, V are first copied to
// bf16 [H, T, KD] (RNE; K and V of the model are bf16 values already, so only Q rounds; KD = D
// rounded up to 32, 64, 128 or 256, zero-padded). One block of 4 warps per (64-query tile of a
// sequence, query head); each warp owns 16 query rows; key tiles of BC = 64 (32 for KD 256) are
// double-buffered by cp.async; S = Q K^T, an online softmax in base 2 (ex2.approx) with the running
// max and row sums per thread, P rounded to bf16 for O += P V. No atomics: every output element is
// written once, by a fixed order of operations, so the bits repeat run to run. Bound against the
// CPU in docs/ops.md. Napkin math (16K tokens of 4K-token sequences, Hq 32, D 128): 4 T n Hq D / 2
// flops = 0.55 TFLOP causal, about 1.5-2.5 ms at 250-350 TFLOP/s of mma.sync; operand bytes (Q, K,
// V bf16, out and lse fp32) about 0.4 GB, 0.1 ms of HBM.
#include "attention_cuda.h"
#include "attention_cuda_common.cuh"
#include "lockstep/numerics/transcendental.h"

namespace lockstep::ops::attention_cuda {

using namespace detail;

namespace {

struct FwdParams {
  const uint16_t* q = nullptr;  // bf16 [Hq, T, KD]
  const uint16_t* k = nullptr;  // bf16 [Hkv, T, KD]
  const uint16_t* v = nullptr;
  float* out = nullptr;  // [T, Hq * D]
  float* lse = nullptr;  // [T, Hq]
  PackedSchedule sched;
  int64_t T = 0, hq = 0, hkv = 0, D = 0;
  float scale_log2 = 0;  // RN(scale * log2(e)): scores in base-2 units
};

template <int KD>
struct FwdTile {
  static constexpr int kBR = kTile, kBC = KD <= 128 ? 64 : 32, kS = KD + 8;  // smem row: KD + 8
  static constexpr size_t kSmem = size_t(kBR + 4 * kBC) * kS * sizeof(uint16_t);
};

constexpr float kNegInf = -__builtin_huge_valf();

template <int KD>
__global__ void __launch_bounds__(128) flash_fwd_kernel(FwdParams p) {
  using Cfg = FwdTile<KD>;
  constexpr int BR = Cfg::kBR, BC = Cfg::kBC, S = Cfg::kS, NT = BC / 8, DT = KD / 8, CPR = KD / 8;
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* Qs = sm;
  uint16_t* Ks = Qs + BR * S;      // [2][BC][S]
  uint16_t* Vs = Ks + 2 * BC * S;  // [2][BC][S]
  int64_t seq, tile;
  if (!tile_of(p.sched, blockIdx.x, seq, tile)) return;
  const int64_t h = blockIdx.y, g = h / (p.hq / p.hkv);
  const int64_t c0 = p.sched.cu[seq], n = p.sched.cu[seq + 1] - c0;
  const int64_t q0 = ((n + BR - 1) / BR - 1 - tile) * BR;  // the longest query tiles first
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const uint16_t* qg = p.q + (h * p.T + c0) * KD;
  const uint16_t* kg = p.k + (g * p.T + c0) * KD;
  const uint16_t* vg = p.v + (g * p.T + c0) * KD;
  // Rows row0 .. row0 + rows - 1 of a [n, KD] operand into smem (rows past n zero-filled).
  auto load_rows = [&](uint16_t* dst, const uint16_t* src, int64_t row0, int rows) {
    for (int i = tid; i < rows * CPR; i += 128) {
      const int r = i / CPR, c = i % CPR;
      const bool ok = row0 + r < n;
      cp_async16(dst + r * S + c * 8, src + (ok ? row0 + r : 0) * KD + c * 8, ok);
    }
  };
  const int64_t q_last = (q0 + BR < n ? q0 + BR : n) - 1;
  const int nkt = int(q_last / BC) + 1;
  load_rows(Qs, qg, q0, BR);
  load_rows(Ks, kg, 0, BC);
  load_rows(Vs, vg, 0, BC);
  cp_async_commit();

  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  const int64_t row[2] = {q0 + warp * 16 + gq, q0 + warp * 16 + gq + 8};
  constexpr bool kHoistQ = KD <= 128;
  uint32_t qf[kHoistQ ? KD / 16 : 1][4];

  for (int kt = 0; kt < nkt; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < nkt) {
      load_rows(Ks + (buf ^ 1) * BC * S, kg, int64_t(kt + 1) * BC, BC);
      load_rows(Vs + (buf ^ 1) * BC * S, vg, int64_t(kt + 1) * BC, BC);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* Kb = Ks + buf * BC * S;
    const uint16_t* Vb = Vs + buf * BC * S;
    if constexpr (kHoistQ) {
      if (kt == 0)
#pragma unroll
        for (int ks = 0; ks < KD / 16; ++ks)
          ldsm_x4(qf[ks], Qs + (warp * 16 + (lane & 15)) * S + ks * 16 + (lane >> 4) * 8);
    }
    // S = Q K^T for this warp's 16 rows and the tile's BC keys.
    float s[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KD / 16; ++ks) {
      uint32_t a[4];
      if constexpr (kHoistQ) {
        a[0] = qf[ks][0], a[1] = qf[ks][1], a[2] = qf[ks][2], a[3] = qf[ks][3];
      } else {
        ldsm_x4(a, Qs + (warp * 16 + (lane & 15)) * S + ks * 16 + (lane >> 4) * 8);
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, Kb + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * S + ks * 16 +
                       ((lane >> 3) & 1) * 8);
        mma_bf16(s[2 * np], a, b[0], b[1]);
        mma_bf16(s[2 * np + 1], a, b[2], b[3]);
      }
    }
    // Scale to base 2, causal / sequence mask, online softmax.
    const int64_t kbase = int64_t(kt) * BC;
    const bool mask = kbase + BC - 1 > q0 + warp * 16 || kbase + BC > n;
    float mx[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * p.scale_log2;
        const int64_t j = kbase + nt * 8 + 2 * tq + (e & 1);
        if (mask && (j > row[e >> 1] || j >= n)) x = kNegInf;
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      base[r] = m_new == kNegInf ? 0.0f : m_new;  // a row with no key yet: p = 0, alpha = 0
      const float alpha = ex2_approx(m[r] - base[r]);
      m[r] = m_new;
      l[r] *= alpha;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) o[dt][2 * r] *= alpha, o[dt][2 * r + 1] *= alpha;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = ex2_approx(s[nt][e] - base[e >> 1]);
        s[nt][e] = pe;
        l[e >> 1] += pe;
      }
      // O += P V (P as bf16 A fragments straight from the S accumulators).
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                             pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b[4];
        ldsm_x4_t(b, Vb + (kk * 16 + (lane & 15)) * S + dp * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * dp], a, b[0], b[1]);
        mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next prefetch reuses it
  }
  // Row sums over the quad (lanes 4 gq .. 4 gq + 3 hold the row's columns), then out and lse.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int64_t ld = p.hq * p.D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= n) continue;
    float* orow = p.out + (c0 + row[r]) * ld + h * p.D;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = dt * 8 + 2 * tq + e;
        if (d < p.D) orow[d] = o[dt][2 * r + e] / l[r];
      }
    if (tq == 0)
      p.lse[(c0 + row[r]) * p.hq + h] = m[r] * 0.693147180559945309f + num::log_f32(l[r]);
  }
}

template <int KD>
void launch_fwd(const FwdParams& p, cudaStream_t st) {
  auto kern = flash_fwd_kernel<KD>;
  static const bool once = (allow_smem(kern, FwdTile<KD>::kSmem), true);
  (void)once;
  const dim3 grid(unsigned(p.sched.max_tiles), unsigned(p.hq));
  kern<<<grid, 128, FwdTile<KD>::kSmem, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void prefill_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu,
                     const AttentionDims& dims, float scale, Tensor& out, Tensor& lse) {
  const int64_t T = q.numel() / (dims.q_heads * dims.head_dim);
  if (T == 0) return;
  const cudaStream_t st = cuda::cu(Stream{});
  cuda::Scratch scratch(q.device(), Stream{});
  const int kd = flash_head_dim(dims.head_dim);
  FwdParams p;
  p.sched = make_schedule(cu, T, scratch);
  uint16_t* qb = scratch.get<uint16_t>(size_t(dims.q_heads * T * kd));
  uint16_t* kb = scratch.get<uint16_t>(size_t(dims.kv_heads * T * kd));
  uint16_t* vb = scratch.get<uint16_t>(size_t(dims.kv_heads * T * kd));
  to_bf16_heads(q.ptr<float>(), qb, T, dims.q_heads, dims.head_dim, kd, st);
  to_bf16_heads(k.ptr<float>(), kb, T, dims.kv_heads, dims.head_dim, kd, st);
  to_bf16_heads(v.ptr<float>(), vb, T, dims.kv_heads, dims.head_dim, kd, st);
  p.q = qb, p.k = kb, p.v = vb;
  p.out = out.ptr<float>(), p.lse = lse.ptr<float>();
  p.T = T, p.hq = dims.q_heads, p.hkv = dims.kv_heads, p.D = dims.head_dim;
  p.scale_log2 = scale * 1.44269504088896341f;
  switch (kd) {
    case 32:
      launch_fwd<32>(p, st);
      break;
    case 64:
      launch_fwd<64>(p, st);
      break;
    case 128:
      launch_fwd<128>(p, st);
      break;
    default:
      launch_fwd<256>(p, st);
      break;
  }
}

}  // namespace lockstep::ops::attention_cuda
