// The Hopper wgmma GEMM with packed nvfp4 W decoded inside the kernel (GemmVariant::
// kWgmmaWreg128 / Wreg256, sm_90a): no bf16 copy of W is written. The tensor cores compute the
// transposed tile D^T = W A^T: the W tile is wgmma's "A" operand and the bf16 A tile (fed by TMA as
// in qgemm_wgmma_tma_cuda.cu; a packed A is dequantized into a bf16 copy first) its "B" operand,
// both in shared memory.
//
// One CTA per SM walks output tiles of TA A rows x TW W rows (WregTile): 256 x 128 (one m64n256
// wgmma per consumer warpgroup on its 64 W rows) or, for 128-255 rows per group, 128 x 256 (two
// m64n128 wgmmas on its 128 W rows). Warpgroup 0 produces through two rings: thread 0 TMA-loads the
// A tiles (128-byte swizzle; a stage is held until the wgmma reading it has finished), warp 1
// TMA-loads the W tile's E2M1 codes (32 bytes per row per 64-wide k step) and copies its E4M3
// block-scale bytes with cp.async (a stage is released as soon as it is decoded, so this ring runs
// further ahead). Warpgroups 1 and 2 consume: while the tensor cores run steps s - 1 and s, each
// consumer thread decodes 32 (TW = 128) or 64 (TW = 256) values of step s + 1 (the E2M1 values by
// byte permutes, times the block scale in one bf16x2 multiply: the exact inner values of
// docs/gemm.md section 2) into one of three swizzled bf16 W tiles in shared memory. A warpgroup
// decodes exactly the W rows its own wgmma reads, so the two warpgroups never wait for each other.
// Tiles that are stored whole take a short epilogue whose lane pairs swap one value each to store
// two adjacent columns (the transposed accumulator holds two W rows per thread).
//
// The chain of every output element is the one of the other two wgmma kernels: fp32 accumulators
// from +0, 64-wide k steps of four k16 steps, ascending, no split-K, the same exact bf16 products.
// Swapping the operand roles changes which tensor-core lane computes an element, not its sum: the
// tests require identical bits across the kernels.
#include <algorithm>

#include "qgemm_cuda.cuh"
#include "qgemm_wgmma_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kThreads = 384;  // warpgroup 0: producer; 1, 2: consumers
constexpr int kBK = 64;        // k per step
constexpr int kAStages = 4;    // ring of A tiles (held until the wgmma reading them finishes)
constexpr int kWStages = 6;    // ring of packed W (released as soon as it is decoded)
constexpr int kWBufs = 3;  // decoded W tiles: steps s - 1 and s in flight while s + 1 is decoded

// A position in a ring of N slots: the slot and the parity of the lap (the mbarrier phase).
// Advanced one step at a time, so that the loops need no 64-bit division by the ring sizes (6 and 3
// are not powers of two: measured, the divisions were a large share of the consumers'
// instructions).
template <int N>
struct RingPos {
  int slot = 0;
  uint32_t lap = 0;
  __device__ __forceinline__ void next() {
    if (++slot == N) slot = 0, lap ^= 1u;
  }
};

// The two tile shapes: TA A rows (wgmma N) x TW W rows. TA = 256, TW = 128: each consumer
// warpgroup runs one m64n256 wgmma on its 64 W rows; TA = 128, TW = 256 (groups of 128-255 rows:
// no half-empty A tile): two m64n128 wgmmas on its 128 W rows. Either way 128 fp32 accumulators per
// thread, and the same chain per element.
template <int TA>
struct WregTile {
  static_assert(TA == 256 || TA == 128, "A tiles of 256 or 128 rows");
  static constexpr int kTA = TA;
  static constexpr int kTW = TA == 256 ? 128 : 256;
  static constexpr int kSub = kTW / 128;            // m64 W sub-tiles per consumer warpgroup
  static constexpr int kNI = kTA / 8;               // 8-column groups of one sub-tile's accumulator
  static constexpr int kABytes = kTA * kBK * 2;     // swizzled bf16 A tile
  static constexpr int kCodeBytes = kTW * kBK / 2;  // E2M1 codes, 32 bytes per W row
  static constexpr int kScaleBytes = kTW * 4;       // E4M3 block scales, 4 per W row
  static constexpr int kWStageBytes = kCodeBytes + kScaleBytes;
  static constexpr int kRowsPerLane = kTW / 32;  // W rows whose scales one producer lane copies
  static constexpr int kWBytes = kTW * kBK * 2;  // one decoded bf16 W tile (128-byte swizzled rows)
  // A ring + decoded W tiles + packed W ring + full / empty barriers of both rings + the tile's row
  // outer scales + the E4M3 scale table + alignment slack
  static constexpr int kSmemBytes = kAStages * kABytes + kWBufs * kWBytes +
                                    kWStages * kWStageBytes + 2 * (kAStages + kWStages) * 8 +
                                    kTA * 4 + 256 * 4 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "fits one CTA per SM");
};

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}
// Arrive on `bar` once this thread's earlier cp.async copies have landed (counted in its init).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}

// Eight E2M1 codes (nibble i = element i) -> their exact bf16 values as four bf16x2 words
// (element 2j in the low half of word j), the values pair_entry gives: magnitudes by byte
// permutes from two 8-entry byte tables (high and low byte of the bf16 of 0, 0.5, 1, 1.5, 2, 3,
// 4, 6); signs by one permute in sign-replicate mode per four values (byte j of x carries the sign
// of code 2j + 1 in its top bit, byte j of x << 4 that of code 2j), or-ed into the high bytes.
// 15 operations per eight values. Checked against decode_e2m1 through the GEMM tests, whose grid
// operands take every code.
__device__ __forceinline__ void e2m1x8_to_bf16x8(uint32_t x, uint32_t (&o)[4]) {
  constexpr uint32_t kHiLo = 0x3F3F3F00u, kHiHi = 0x40404040u;  // high bytes, codes 0-3 / 4-7
  constexpr uint32_t kLoLo = 0xC0800000u, kLoHi = 0xC0804000u;  // low bytes
  const uint32_t m = x & 0x77777777u, x4 = x << 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t sel = h ? m >> 16 : m;
    const uint32_t hi = __byte_perm(kHiLo, kHiHi, sel), lo = __byte_perm(kLoLo, kLoHi, sel);
    // bytes 0..3: 0xFF / 0x00 by the signs of codes 4h, 4h + 1, 4h + 2, 4h + 3 (selector nibbles
    // with bit 3 set replicate the top bit of the chosen byte of {x4, x})
    uint32_t sgn;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(sgn) : "r"(x4), "r"(x), "r"(h ? 0xFBEAu : 0xD9C8u));
    const uint32_t hs = hi | (sgn & 0x80808080u);
    o[2 * h] = __byte_perm(lo, hs, 0x5140u);      // codes 4h (low half), 4h + 1
    o[2 * h + 1] = __byte_perm(lo, hs, 0x7362u);  // codes 4h + 2, 4h + 3
  }
}

// Decodes W tile row `row`, k [32 half, +32) of one step from the stage's codes (32 bytes per row)
// and scales (4 per row, from byte code_bytes) into the swizzled bf16 W tile `wt` (the layout of a
// 128-byte swizzled TMA box: chunk q of a row = k 8q .. 8q + 7).
template <int kCodeBytes>
__device__ __forceinline__ void decode_w(const uint8_t* stage, uint8_t* wt, int row, int half,
                                         const uint32_t* s_scale) {
  const uint4 c = *reinterpret_cast<const uint4*>(stage + row * 32 + half * 16);
  const uint32_t sw = *reinterpret_cast<const uint32_t*>(stage + kCodeBytes + row * 4);
  const uint32_t words[4] = {c.x, c.y, c.z, c.w};
  // the two 16-wide blocks of this half: scale codes 2 half, 2 half + 1 of the row's four
  const uint32_t sc2[2] = {s_scale[(sw >> (16 * half)) & 0xFF],
                           s_scale[(sw >> (16 * half + 8)) & 0xFF]};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int chunk = 4 * half + q;  // k 8 chunk .. + 7: block scale chunk / 2
    const uint32_t sc = sc2[q >> 1];
    uint32_t o[4];
    e2m1x8_to_bf16x8(words[q], o);
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = bf16x2_mul(o[i], sc);
    *reinterpret_cast<uint4*>(wt + swz(row, chunk)) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// The epilogue of one consumer thread and W sub-tile: acc[4i + 2h + e] (i < kNI) is output row
// (A row) m0 + 8i + 2 (lane % 4) + e, column (W row) n0 + wrow + 8h. Per element the steps of
// epilogue_value in order, the row outer scales from shared memory (s_oa), the two columns' from
// registers.
template <bool kBf16Out, int kNI>
__device__ __forceinline__ void epilogue_t(const float (&acc)[4 * kNI], int64_t m0, int64_t n0,
                                           int wrow, int lane, const GemmGroupDesc& G,
                                           const GemmOperandView& w, int64_t n,
                                           const DeviceEpilogue& ep, const GemmOutView& out,
                                           float* raw, const float* s_oa) {
  int64_t col[2];
  float ow[2], bias[2];
  bool col_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    col[h] = n0 + wrow + 8 * h;
    col_ok[h] = col[h] < n;
    ow[h] = col_ok[h] ? outer_of(w, G.w_row0 + col[h]) : 1.0f;
    bias[h] = ep.bias && col_ok[h] ? ep.bias[G.w_row0 + col[h]] : 0.0f;
  }
  const bool has_bias = ep.bias != nullptr;
  const float alpha = ep.alpha;
#pragma unroll
  for (int i = 0; i < kNI; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int rt = 8 * i + 2 * (lane & 3) + e;  // row in the tile
      const int64_t r = m0 + rt;
      if (r >= G.rows) continue;
      const int64_t orow = G.a_row0 + r;
      const float oa = s_oa[rt];
      const bool token = r < G.tokens;  // padding rows: +0
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!col_ok[h]) continue;
        const float v = acc[4 * i + 2 * h + e];
        const int64_t o = orow * n + col[h];
        if (raw) {
          raw[o] = v;
          continue;
        }
        float d = num::mul_rn(alpha, num::mul_rn(num::mul_rn(oa, ow[h]), v));
        if (has_bias) d = num::add_rn(d, bias[h]);
        if (!token) d = 0.0f;
        if constexpr (kBf16Out)
          out.d_bf16[o] = num::f32_to_bf16(d);
        else
          out.d_f32[o] = d;
      }
    }
  }
}

// The epilogue when the whole tile is stored, is made of tokens and has no SwiGLU (N even): each
// element's value as in epilogue_t, then lanes g and g ^ 1 (W rows r, r + 1) swap one value so
// that each stores two adjacent columns of one row (bf16x2 / float2).
template <bool kBf16Out, int kNI>
__device__ __forceinline__ void epilogue_full(const float (&acc)[4 * kNI], int64_t m0, int64_t n0,
                                              int wrow, int lane, const GemmGroupDesc& G,
                                              const GemmOperandView& w, int64_t n,
                                              const DeviceEpilogue& ep, const GemmOutView& out,
                                              const float* s_oa) {
  const bool odd = (lane >> 2) & 1;  // this lane keeps row e = 1 of each pair, columns (r - 1, r)
  float ow[2], bias[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    ow[h] = outer_of(w, G.w_row0 + n0 + wrow + 8 * h);
    bias[h] = ep.bias ? ep.bias[G.w_row0 + n0 + wrow + 8 * h] : 0.0f;
  }
  const bool has_bias = ep.bias != nullptr;
  const float alpha = ep.alpha;
  const int e_keep = odd ? 1 : 0;
  const int64_t row0 = G.a_row0 + m0 + 2 * (lane & 3) + e_keep;  // output row at i = 0
  const int64_t col0 = n0 + wrow - (odd ? 1 : 0);                // first of the pair at h = 0
#pragma unroll
  for (int i = 0; i < kNI; ++i) {
    const float oa[2] = {s_oa[8 * i + 2 * (lane & 3)], s_oa[8 * i + 2 * (lane & 3) + 1]};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float y[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float d =
            num::mul_rn(alpha, num::mul_rn(num::mul_rn(oa[e], ow[h]), acc[4 * i + 2 * h + e]));
        if (has_bias) d = num::add_rn(d, bias[h]);
        y[e] = d;
      }
      const float got = __shfl_xor_sync(0xFFFFFFFFu, odd ? y[0] : y[1], 4);
      const float lo = odd ? got : y[0], hi = odd ? y[1] : got;
      const int64_t o = (row0 + 8 * i) * n + col0 + 8 * h;
      if constexpr (kBf16Out)
        *reinterpret_cast<uint32_t*>(out.d_bf16 + o) =
            uint32_t(num::f32_to_bf16(lo)) | (uint32_t(num::f32_to_bf16(hi)) << 16);
      else
        *reinterpret_cast<float2*>(out.d_f32 + o) = make_float2(lo, hi);
    }
  }
}

// Persistent, one CTA per SM over the tiles of tile_space(groups, n, TA, TW). Rows of a TMA box
// past the group belong to the next group or are zero-filled past the tensor; W rows past the
// tensor take the last row's scales: either way they only reach outputs that are not stored.
template <int TA>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_wreg_kernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_codes, GemmOperandView a,
                      GemmOperandView w, int64_t n, const GemmGroupDesc* groups, DeviceEpilogue ep,
                      GemmOutView out, float* raw, TileSpace ts) {
#if defined(LOCKSTEP_WGMMA)
  using T = WregTile<TA>;
  constexpr int kTA = T::kTA, kTW = T::kTW, kSub = T::kSub, kNI = T::kNI;
  constexpr int kABytes = T::kABytes, kCodeBytes = T::kCodeBytes, kWStageBytes = T::kWStageBytes;
  constexpr int kRowsPerLane = T::kRowsPerLane, kWBytes = T::kWBytes;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // the swizzle atom
  uint8_t* wbuf = smem + kAStages * kABytes;                                  // [kWBufs][kWBytes]
  uint8_t* wring = wbuf + kWBufs * kWBytes;  // [kWStages][kWStageBytes]: codes, then scales
  uint64_t* full_a = reinterpret_cast<uint64_t*>(wring + kWStages * kWStageBytes);
  uint64_t* empty_a = full_a + kAStages;
  uint64_t* full_w = empty_a + kAStages;
  uint64_t* empty_w = full_w + kWStages;
  float* s_oa = reinterpret_cast<float*>(empty_w + kWStages);  // [kTA] row outer scales of the tile
  uint32_t* s_scale =
      reinterpret_cast<uint32_t*>(s_oa + kTA);  // [256] bf16x2 {s, s} of the E4M3 scale codes
  const int tid = threadIdx.x, wg = tid >> 7;
  const int64_t K = a.cols;
  const int ktiles = int(K / kBK);
  if (tid == 0) {
    for (int s = 0; s < kAStages; ++s) {
      mbar_init(&full_a[s], 1);
      mbar_init(&empty_a[s], 2 * 4);  // every consumer warp releases the stage
    }
    for (int s = 0; s < kWStages; ++s) {
      mbar_init(&full_w[s],
                1 + 32);  // the codes' TMA transaction + the scale copies of producer warp 1
      mbar_init(&empty_w[s],
                2 * 128);  // every consumer thread (its reads of the cp.async-written scales)
    }
    fence_mbarrier_init();
  }
  if (tid < 256) s_scale[tid] = uint32_t(scale_entry(Format::kNvfp4, uint32_t(tid))) * 0x10001u;
  __syncthreads();

  if (wg == 0) {  // producers: warp 0 thread 0 the A ring, warp 1 the packed W ring
    setmaxnreg_dec<40>();
    const int warp = tid >> 5, lane = tid & 31;
    if (warp > 1 || (warp == 0 && lane > 0)) return;
    int64_t it = 0;        // k steps issued so far
    RingPos<kAStages> pa;  // warp 0: the A slot of step it
    RingPos<kWStages> pw;  // warp 1: the packed W slot of step it
    TileCursor tiles;
    for (int64_t u = blockIdx.x; u < ts.units; u += gridDim.x) {
      GemmGroupDesc G;
      int64_t m0, n0;
      if (!tiles.next(u, groups, ts, G, m0, n0)) continue;
      if (warp == 0) {
        const int ya = int(G.a_row0 + m0);
        for (int kt = 0; kt < ktiles; ++kt, ++it, pa.next()) {
          const int s = pa.slot;
          if (it >= kAStages)
            mbar_wait_backoff(&empty_a[s], pa.lap ^ 1u);  // released in the previous lap
          mbar_expect_tx(&full_a[s], kABytes);
          tma_load(smem + s * kABytes, &map_a, &full_a[s], kt * kBK, ya);
        }
        continue;
      }
      // lane l: TMA of the codes (lane 0) and the scales of W rows kRowsPerLane l .. + kRowsPerLane
      // - 1 (rows past the tensor read the last row's)
      const int yw = int(G.w_row0 + n0);
      const uint8_t* sc[kRowsPerLane];
#pragma unroll
      for (int r = 0; r < kRowsPerLane; ++r)
        sc[r] = w.block_scale +
                std::min<int64_t>(G.w_row0 + n0 + kRowsPerLane * lane + r, w.rows - 1) * (K / 16);
      for (int kt = 0; kt < ktiles; ++kt, ++it, pw.next()) {
        const int s = pw.slot;
        if (it >= kWStages) mbar_wait_backoff(&empty_w[s], pw.lap ^ 1u);
        uint8_t* st = wring + s * kWStageBytes;
        if (lane == 0) {
          mbar_expect_tx(&full_w[s], kCodeBytes);
          tma_load(st, &map_codes, &full_w[s], kt * (kBK / 2), yw);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerLane; ++r)
          cp_async4(st + kCodeBytes + 4 * (kRowsPerLane * lane + r), sc[r] + kt * (kBK / 16));
        cp_async_arrive(&full_w[s]);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  setmaxnreg_inc<232>();
  const int t = tid - 128, lane = t & 31, c = wg - 1;
  // this thread's first W row in sub-tile 0 (epilogue); sub-tile j adds 64 j
  const int wrow = 64 * kSub * c + 16 * ((t & 127) >> 5) + (lane >> 2);
  int64_t total = 0;  // k steps of this CTA (the producer fills exactly these)
  {
    TileCursor tiles;
    for (int64_t u = blockIdx.x; u < ts.units; u += gridDim.x) {
      GemmGroupDesc G;
      int64_t m0, n0;
      if (!tiles.next(u, groups, ts, G, m0, n0)) break;
      total += ktiles;
    }
  }
  // Decode the next step's W into the next of the kWBufs tiles once its packed stage has landed,
  // and release that stage. A warpgroup decodes exactly the 64 kSub rows its own wgmma reads
  // (thread t: TW = 128 row t / 2, half t % 2; TW = 256 row t, both halves), so its own wgmma_wait
  // and a barrier of its 128 threads (with the async-proxy fence) order the stores against its
  // wgmma: the two warpgroups never wait for each other here.
  RingPos<kWStages> dw;  // packed W slot of the next decode
  RingPos<kWBufs> db;    // decoded tile it goes to
  auto decode = [&] {
    const int s = dw.slot;
    mbar_wait(&full_w[s], dw.lap);
    const uint8_t* st = wring + s * kWStageBytes;
    uint8_t* wt = wbuf + db.slot * kWBytes;
    dw.next(), db.next();
    if constexpr (kSub == 1) {
      decode_w<kCodeBytes>(st, wt, t >> 1, t & 1, s_scale);
    } else {
      decode_w<kCodeBytes>(st, wt, t, 0, s_scale);
      decode_w<kCodeBytes>(st, wt, t, 1, s_scale);
    }
    mbar_arrive(&empty_w[s]);
    fence_proxy_async();
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + c) : "memory");
  };
  if (total > 0) decode();
  int64_t it = 0, released = 0;            // steps issued, A stages released
  RingPos<kAStages> ra, rr;                // A slot of step it; of step `released`
  RingPos<kWBufs> mb;                      // decoded W tile of step it
  auto release_upto = [&](int64_t done) {  // steps < done have finished
    for (; released < done; ++released, rr.next()) mbar_arrive_warp(&empty_a[rr.slot]);
  };
  TileCursor tiles;
  for (int64_t u = blockIdx.x; u < ts.units; u += gridDim.x) {
    GemmGroupDesc G;
    int64_t m0, n0;
    if (!tiles.next(u, groups, ts, G, m0, n0)) continue;
    float acc[kSub][4 * kNI];
#pragma unroll
    for (int j = 0; j < kSub; ++j)
#pragma unroll
      for (int i = 0; i < 4 * kNI; ++i) acc[j][i] = 0.0f;
    for (int kt = 0; kt < ktiles; ++kt, ++it, ra.next(), mb.next()) {
      mbar_wait(&full_a[ra.slot], ra.lap);
      const uint8_t* st = smem + ra.slot * kABytes;
      const uint8_t* wt = wbuf + mb.slot * kWBytes + c * kSub * 64 * 128;
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kBK / 16; ++j) {
        if constexpr (kSub == 1) {
          wgmma_m64n256k16(acc[0], smem_desc(wt + j * 32), smem_desc(st + j * 32));
        } else {
#pragma unroll
          for (int q = 0; q < kSub; ++q)
            wgmma_m64n128k16(acc[q], smem_desc(wt + q * 64 * 128 + j * 32), smem_desc(st + j * 32),
                             1);
        }
      }
      wgmma_commit();
      wgmma_wait<kWBufs - 1>();  // step it + 1 - kWBufs has finished: its stage and wbuf[(it + 1) %
                                 // kWBufs] are free
      release_upto(it + 2 - kWBufs);
      if (it + 1 < total) decode();
    }
    wgmma_wait<0>();
    release_upto(it);
    // The tile's row outer scales into shared memory (both warpgroups are past the previous tile's
    // epilogue at the first barrier).
    consumer_bar();
    if (t < kTA) s_oa[t] = m0 + t < G.rows ? outer_of(a, G.a_row0 + m0 + t) : 1.0f;
    consumer_bar();
    const bool full = !raw && m0 + kTA <= G.tokens && n0 + kTW <= n && n % 2 == 0;
#pragma unroll
    for (int q = 0; q < kSub; ++q) {
      if (full && out.d_bf16)
        epilogue_full<true, kNI>(acc[q], m0, n0, wrow + 64 * q, lane, G, w, n, ep, out, s_oa);
      else if (full)
        epilogue_full<false, kNI>(acc[q], m0, n0, wrow + 64 * q, lane, G, w, n, ep, out, s_oa);
      else if (out.d_bf16)
        epilogue_t<true, kNI>(acc[q], m0, n0, wrow + 64 * q, lane, G, w, n, ep, out, raw, s_oa);
      else
        epilogue_t<false, kNI>(acc[q], m0, n0, wrow + 64 * q, lane, G, w, n, ep, out, raw, s_oa);
    }
  }
#else
  (void)map_a, (void)map_codes, (void)a, (void)w, (void)n, (void)groups, (void)ep, (void)out,
      (void)raw, (void)ts;
  __trap();
#endif
}

template <int TA>
void launch_wreg_t(const CUtensorMap& ma, const CUtensorMap& mc, const GemmOperandView& a,
                   const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                   const DeviceEpilogue& ep, GemmOutView out, float* raw, cudaStream_t stream) {
  using T = WregTile<TA>;
  static const int ctas = persistent_ctas(reinterpret_cast<const void*>(wgmma_wreg_kernel<TA>),
                                          kThreads, T::kSmemBytes);
  const TileSpace ts = tile_space(groups, n, T::kTA, T::kTW);
  const unsigned grid = unsigned(std::min<int64_t>(ctas, ts.units));
  wgmma_wreg_kernel<TA><<<grid, kThreads, T::kSmemBytes, stream>>>(
      ma, mc, a, w, n, groups.device_table(), ep, out, raw, ts);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

// A tile of 128 A rows (256 W rows) for 128-255 average rows per group, of 256 A rows (128 W rows)
// from 256 up to 2047. Measured on the H200 (128 experts, FC1 K=2048 N=1536 / FC2 K=768 N=2048):
// at 128 rows per expert 128-row tiles 334-352 / 177-186 us against 549 / 317 us for the in-loop
// kernel (and 770 / 482 us for half-empty 256-row tiles); at 512 rows 256-row tiles 860 / 501 us
// against 1212 / 687 us with 128-row tiles and 1085 / 720 us for the staged kernel, which writes a
// bf16 copy of every expert's W. Dense 4096^3 and 8192^3, where one W copy serves thousands of
// rows, are faster staged (230 / 1671 us vs 269 / 2214 us). The bounds themselves are not
// measured; the choice never changes a bit.
int wreg_wgmma_tile(const GemmOperandView& a, const GemmOperandView& w,
                    const DeviceGroupTable& groups, GemmVariant route) {
  if (w.format != Format::kNvfp4 || !tensor_maps_available() || a.rows >= (int64_t(1) << 31) ||
      w.rows >= (int64_t(1) << 31) || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.block_scale) % 4 != 0 ||
      (a.format == Format::kBf16 && reinterpret_cast<uintptr_t>(a.data) % 16 != 0) ||
      groups.groups == 0)
    return 0;
  if (route == GemmVariant::kWgmmaWreg128) return 128;
  if (route == GemmVariant::kWgmmaWreg256) return 256;
  if (route != GemmVariant::kWgmma) return 0;
  const int64_t per_group = groups.total_rows / groups.groups;
  if (per_group >= 128 && per_group < 256) return 128;
  return per_group >= 256 && per_group < 2048 ? 256 : 0;
}

void launch_wgmma_wreg(int tile, const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                       const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                       Scratch& scratch, cudaStream_t stream) {
  const int64_t K = a.cols;
  const size_t a_bytes = bf16_copy_bytes(a);
  const size_t raw_bytes = ep.swiglu ? size_t(groups.total_rows) * size_t(n) * sizeof(float) : 0;
  uint8_t* base = static_cast<uint8_t*>(scratch.bytes(a_bytes + raw_bytes));
  const uint16_t* ab = dequantized(a, reinterpret_cast<uint16_t*>(base), stream);
  float* raw = ep.swiglu ? reinterpret_cast<float*>(base + a_bytes) : nullptr;
  const int tw = tile == 256 ? WregTile<256>::kTW : WregTile<128>::kTW;
  const CUtensorMap ma = tensor_map_2d(ab, 2, a.rows, K, kBK, tile, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap mc =
      tensor_map_2d(w.data, 1, w.rows, K / 2, kBK / 2, tw, CU_TENSOR_MAP_SWIZZLE_NONE);
  if (tile == 256)
    launch_wreg_t<256>(ma, mc, a, w, n, groups, ep, out, raw, stream);
  else
    launch_wreg_t<128>(ma, mc, a, w, n, groups, ep, out, raw, stream);
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
