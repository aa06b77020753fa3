// The fused weighted-SwiGLU + row amax + NVFP4 per_row kernel for a bf16 FC1 output [rows, 2H]
// (gate in columns [0, H), up in [H, 2H)), H % 16 == 0, H / 16 <= 1024 chunks, round to nearest.
// Same bytes as quantize_rows_kernel with LoadSwiglu (the generic path), element by element:
// y = RN(RN(silu_f32(g) * u) * prob[r]) (num::swiglu_weighted_f32), row amax over y, then the
// NVFP4 row kernel's arithmetic (quantize_rows_cuda.cuh, nvfp4_row).
// - silu_f32 of a bf16 gate is a function of its 16-bit code: a shared-memory table of silu_f32 for
//   the codes with |g| in [2^-16, 2^8) (24 exponents x 128 mantissas x 2 signs, 24 KB), built on
//   the device by num::silu_f32 itself, replaces the ~45 fp32 operations of silu by an index
//   computation and one LDS. A chunk whose gates leave that range (0, tiny, huge, inf, NaN) takes
//   the per-element path: the table where it applies, else num::silu_f32 (+-0 gives +-0).
// - Persistent CTAs (one per SM, so one table per SM, built while the first rows load): a team of
//   TT threads per row, kSwigluChunks chunks of 16 elements per thread (y held in registers between
//   the amax and the encode), up to 15 teams per CTA synchronized by named barriers (ids 1..15),
//   each team looping over rows r, r + teams * grid, ...; the team's thread 0 loads each whole
//   input row (gate and up halves, 4H bytes) with one bulk copy (TMA, cp.async.bulk) into one of
//   the team's kSwigluStages row buffers, kSwigluStages - 1 rows ahead, completing on the buffer's
//   mbarrier (16-byte per-thread cp.async copies would request every 32-byte sector from L2 in two
//   halves and write shared memory one lane per wavefront).
// - Shared-memory wavefronts count: a thread reads its chunk's two 16-byte gate (and up) halves in
//   a lane-dependent order, so the 8 lanes of a quarter warp hit 8 distinct bank quads (no 2-way
//   conflict at the 32-byte lane stride).
// - Row amax: redux.sync over order-preserving integer keys (NaN ignored, all NaN gives NaN), one
//   barrier per row; encode as the NVFP4 row kernel: block scale two_level_block_scale_fast, factor
//   two_level_encode_factor_fast, codes by e2m1_code_magic (encode_e2m1x16_f32_nonan), a chunk with
//   a NaN y by encode_e2m1x16_rn.
#pragma once

#include "../tensor/cuda_async.cuh"
#include "quantize_rows_cuda.cuh"

namespace lockstep::cuda::detail {

constexpr uint32_t kSiluBase = (127u - 16u) << 7;  // bf16 magnitude code of 2^-16
constexpr uint32_t kSiluN = 24u * 128u;            // table codes per sign: |g| in [2^-16, 2^8)
// 1024 threads x 1 chunk x 2 row buffers per team: the fastest configuration on the H200 (0.80-0.81
// of copy at the bench shape; the others measured are in bench/RESULTS.md).
constexpr int kSwigluThreads = 1024;  // most threads per CTA (one CTA per SM)
constexpr int kSwigluChunks = 1;      // 16-element chunks per thread and row
constexpr int kSwigluStages = 2;      // row buffers per team (1 row ahead)
constexpr int kSwigluTeams = 15;      // most teams per CTA (named barriers 1..15)

// silu of 16 bf16 gates (8 words) when some leave the table's range: the table where it applies,
// num::silu_f32 elsewhere (+-0 gives +-0, which silu_f32 returns too). Out of line, so that the
// rare path costs the common one no registers.
__device__ __noinline__ void silu16_slow(const float* tab, const uint32_t* gw, float* s) {
#pragma unroll 1
  for (int i = 0; i < 16; ++i) {
    const uint32_t b = (i & 1) ? gw[i / 2] >> 16 : gw[i / 2] & 0xFFFFu;
    const uint32_t m = b & 0x7FFFu;
    const float g = __uint_as_float(b << 16);
    if (m - kSiluBase < kSiluN)
      s[i] = tab[m - kSiluBase + (b >> 15) * kSiluN];
    else if (m == 0u)
      s[i] = g;
    else
      s[i] = num::silu_f32(g);
  }
}

__device__ __forceinline__ float fmax_nan_f32(float a, float b) {  // NaN if either is NaN
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ void team_bar(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Dynamic shared memory of swiglu_nvfp4_rows_kernel: each team's kStages input rows of 4H bytes. A
// bound for every H the kernel takes: teams x 4H = teams x 64 nchunks <= 64 kC x teams x tt <=
// 64 kC kThreads bytes per stage.
constexpr size_t swiglu_stage_bytes(int threads, int chunks, int stages) {
  return size_t(threads) * 64 * size_t(chunks) * size_t(stages);
}

// The row amax as an order-preserving key for redux.sync: 0 for NaN (ignored; nothing but NaN
// gives NaN back), else bits + 1 (|x| >= 0, so the bit order is the value order).
__device__ __forceinline__ unsigned amax_redux_key(float a) {
  return num::is_nan(a) ? 0u : __float_as_uint(a) + 1u;
}

// y = RN(RN(silu(g) * u) * pr) of one 16-element chunk (8 gate words, 8 up words); returns the
// NaN-propagating amax of |y| (NaN iff some y is NaN).
__device__ __forceinline__ float swiglu_chunk(const float* silu_tab, const uint4& g0,
                                              const uint4& g1, const uint4& u0, const uint4& u1,
                                              float pr, float y[16]) {
  const uint32_t gw[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
  const uint32_t uw[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
  uint32_t mn = 0xFFFFFFFFu, mx = 0u;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t a = gw[i] & 0x7FFF7FFFu;
    mn = __vminu2(mn, a);
    mx = __vmaxu2(mx, a);
  }
  const uint32_t lo = min(mn & 0xFFFFu, mn >> 16), hi = max(mx & 0xFFFFu, mx >> 16);
  float s[16];
  if (lo >= kSiluBase && hi < kSiluBase + kSiluN) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // halves: magnitude code + sign * kSiluN (no carry between the halves)
      const uint32_t k = ((gw[i] >> 15) & 0x00010001u) * kSiluN + (gw[i] & 0x7FFF7FFFu);
      s[2 * i] = silu_tab[(k & 0xFFFFu) - kSiluBase];
      s[2 * i + 1] = silu_tab[(k >> 16) - kSiluBase];
    }
  } else {
    uint32_t gl[8];
    float sl[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) gl[i] = gw[i];
    silu16_slow(silu_tab, gl, sl);
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = sl[i];
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    y[2 * i] = num::mul_rn(num::mul_rn(s[2 * i], __uint_as_float(uw[i] << 16)), pr);
    y[2 * i + 1] = num::mul_rn(num::mul_rn(s[2 * i + 1], __uint_as_float(uw[i] & 0xFFFF0000u)), pr);
  }
  // A tree of maxima (4 levels instead of a chain of 15: max.NaN is associative).
  float m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = fmax_nan_f32(fabsf(y[2 * i]), fabsf(y[2 * i + 1]));
#pragma unroll
  for (int w = 4; w >= 1; w >>= 1)
#pragma unroll
    for (int i = 0; i < w; ++i) m[i] = fmax_nan_f32(m[i], m[i + w]);
  return m[0];
}

// in: [rows, 2 * half] bf16; p: NVFP4 per_row parameters of the [rows, half] output (p.cols =
// half). blockDim.x = teams * tt <= kThreads, tt a multiple of 32 with kC * tt >= p.nchunks; a
// thread handles chunks tid, tid + tt, ... (kC of them) of its team's row, read from the row's
// image in the team's stage buffer (filled by one bulk copy, kStages - 1 rows ahead, completing on
// the stage's mbarrier; a stage is refilled only after the whole team passed the next row's team
// barrier); the router probability is loaded one row ahead into a register.
template <int kThreads, int kC, int kStages, bool Swz>
__global__ void __launch_bounds__(kThreads, 1)
    swiglu_nvfp4_rows_kernel(const uint16_t* __restrict__ in, const float* __restrict__ prob,
                             int64_t half, RowParams p, int tt) {
  __shared__ float silu_tab[2 * kSiluN];
  __shared__ unsigned red[2][32];
  __shared__ uint64_t full[kSwigluTeams][kStages];   // row copy of (team, stage) landed
  extern __shared__ __align__(128) uint8_t stage[];  // [teams][kStages][row bytes]
  const int t = threadIdx.x, nt = blockDim.x, lane = t & 31, warp = t >> 5;
  const int team = t / tt, tid = t - team * tt;
  const int teams = nt / tt, wpt = tt >> 5;
  const int sw = (lane >> 2) & 1;  // read order of a chunk's two halves (bank conflicts)
  const int64_t stride = int64_t(gridDim.x) * teams;
  int64_t r = int64_t(blockIdx.x) * teams + team;
  bool valid[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) valid[c] = tid + c * tt < p.nchunks;
  const int64_t out_step = stride * (p.cols / 2);
  const uint32_t row_bytes = uint32_t(4 * half);  // gate and up halves of one input row
  uint8_t* const tstage = stage + size_t(team) * kStages * row_bytes;
  if (t < teams * kStages) async::mbar_init(&full[t / kStages][t % kStages], 1);
  async::fence_mbarrier_init();
  __syncthreads();
  // One bulk copy (TMA) of the whole input row per stage, issued by the team's thread 0: full
  // 32-byte sectors from L2 and full-width shared-memory writes (per-thread 16-byte cp.async moved
  // every sector in two halves and wrote shared memory one lane at a time).
  auto issue = [&](int slot, int64_t row) {
    if (tid == 0 && row < p.rows) {
      async::mbar_expect_tx(&full[team][slot], row_bytes);
      async::bulk_load(tstage + size_t(slot) * row_bytes, in + row * (2 * half), row_bytes,
                       &full[team][slot]);
    }
  };
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k, r + k * stride);
  int64_t out_off = r * (p.cols / 2);
  float pr = (r < p.rows && valid[0]) ? __ldg(prob + r) : 0.0f;
  // The table, while the first rows load.
  for (int i = t; i < int(2 * kSiluN); i += nt) {
    const uint32_t code = (i >= int(kSiluN) ? 0x8000u : 0u) | (kSiluBase + uint32_t(i) % kSiluN);
    silu_tab[i] = num::silu_f32(__uint_as_float(code << 16));
  }
  __syncthreads();

  int slot = 0, par = 0;
  uint32_t phases = 0;  // bit s: parity of the next completion of stage s
  for (; r < p.rows; r += stride) {
    // Refills the stage the team finished reading last step (every reader passed the team barrier).
    issue(slot == 0 ? kStages - 1 : slot - 1, r + (kStages - 1) * stride);
    const int64_t rn = r + stride;
    const float prn = (rn < p.rows && valid[0]) ? __ldg(prob + rn) : 0.0f;
    async::mbar_wait(&full[team][slot], (phases >> slot) & 1u);
    phases ^= 1u << slot;
    float y[kC][16];
    float cam[kC];
    bool has_nan[kC];
    unsigned key = 0u;
    const uint4* sp = reinterpret_cast<const uint4*>(tstage + size_t(slot) * row_bytes) +
                      2 * tid;    // gate chunk tid
    const int64_t up = half / 8;  // uint4 from a gate chunk to its up chunk
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      cam[c] = num::amax_empty();
      has_nan[c] = false;
      if (valid[c]) {
        // Lanes 4-7 of each quarter warp read a chunk's second half first (sw = 1): a 16-byte
        // load at a 32-byte lane stride then covers 8 distinct bank quads (no 2-way conflict).
        // y[c] then holds elements 8..15 before 0..7; the encode swaps its two words back.
        const uint4* g = sp + 2 * c * tt + sw;
        const uint4* h = sp + 2 * c * tt + (1 - sw);
        cam[c] = swiglu_chunk(silu_tab, g[0], h[0], g[up], h[up], pr, y[c]);
        has_nan[c] = num::is_nan(cam[c]);
        if (__builtin_expect(has_nan[c], 0))
          cam[c] = amax16(y[c]);  // NaN ignored; all NaN gives NaN
        key = max(key, amax_redux_key(cam[c]));
      }
    }
    // Team amax: redux over each warp, then over the team's warps through shared memory (one
    // barrier; red[par] is rewritten two rows later, after every reader passed the next barrier).
    key = __reduce_max_sync(0xFFFFFFFFu, key);
    if (lane == 0) red[par][warp] = key;
    team_bar(1 + team, tt);
    key = __reduce_max_sync(0xFFFFFFFFu, lane < wpt ? red[par][team * wpt + lane] : 0u);
    const float a = key != 0u ? __uint_as_float(key - 1u) : nan_f32();
    if (tid == 0) p.amax_out[r] = a;
    if (valid[0]) {
      const num::TwoLevelOuter outer = num::two_level_outer_e2m1(a);
      uint8_t* const drow = p.data + out_off;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        if (!valid[c]) continue;
        const int b = tid + c * tt;
        const uint8_t sc = num::two_level_block_scale_fast(cam[c], outer);
        const float f = num::two_level_encode_factor_fast(sc, outer);
        const uint2 q = __builtin_expect(has_nan[c], 0) ? encode_e2m1x16_rn(y[c], f)
                                                        : encode_e2m1x16_f32_nonan(y[c], f);
        *reinterpret_cast<uint2*>(drow + b * 8) = sw ? make_uint2(q.y, q.x) : q;
        store_scale<Swz>(p.scale, r, b, sc);
      }
    }
    out_off += out_step;
    pr = prn;
    par ^= 1;
    slot = slot == kStages - 1 ? 0 : slot + 1;
  }
}

// Geometry, shared-memory opt-in and launch of swiglu_nvfp4_rows_kernel (p.nchunks <= kC *
// kThreads): teams of tt = roundup(ceil(p.nchunks / kC), 32) threads, at most kSwigluTeams per CTA,
// one CTA per SM (or fewer CTAs when there are fewer rows than teams).
template <int kThreads, int kC, int kStages, bool Swz>
cudaError_t swiglu_nvfp4_rows_launch(const uint16_t* in, const float* prob, int64_t half,
                                     const RowParams& p, cudaStream_t st) {
  const int tt = ((p.nchunks + kC - 1) / kC + 31) / 32 * 32;
  const int teams = kThreads / tt < kSwigluTeams ? kThreads / tt : kSwigluTeams;
  const int threads = tt * teams;
  const size_t smem = swiglu_stage_bytes(kThreads, kC, kStages);
  auto* kern = swiglu_nvfp4_rows_kernel<kThreads, kC, kStages, Swz>;
  cudaError_t e =
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  int dev = 0, sms = 0, per_sm = 0;
  if (e == cudaSuccess) e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem);
  if (e != cudaSuccess) return e;
  const int64_t want = (p.rows + teams - 1) / teams;
  const int64_t cap = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
  kern<<<unsigned(want < cap ? want : cap), threads, smem, st>>>(in, prob, half, p, tt);
  return cudaGetLastError();
}

}  // namespace lockstep::cuda::detail
