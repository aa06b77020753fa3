// Kernels that need more than one row at a time: the domain amax pass (per tensor, per group,
// 128x128 tiles, joint), NVFP4 16x16 (2-D) blocks and MXFP8 rowwise + columnwise in one pass, each
// as a generic loader kernel and a bf16 fast kernel (launched from quantize_tiles_cuda.cu), and the
// Hadamard transform (launched from quantize_cuda.cu).
#pragma once

#include "lockstep/numerics/hadamard.h"
#include "quantize_rows_cuda.cuh"

namespace lockstep::cuda::detail {

// ---- domain amax: keys[domain] = max amax_key over the domain's elements ------------------------
// CTA = 8 warps; warp w covers rows [blockIdx.y*256 + w*32, +32) and chunks [blockIdx.x*32, +32),
// one chunk per lane. A warp keeps one running key per lane and flushes it (warp-reduced per
// domain) only when the row part of the domain changes, so atomics stay few.

__device__ __forceinline__ void amax_flush(uint32_t* keys, int64_t dom, uint32_t key) {
  const unsigned mask = __match_any_sync(0xFFFFFFFFu, (unsigned long long)dom);
  const uint32_t m = __reduce_max_sync(mask, key);
  if ((threadIdx.x & 31) == __ffs(mask) - 1 && dom >= 0 && m != 0) atomicMax(keys + dom, m);
}

template <class Loader>
__global__ void __launch_bounds__(256) domain_amax_kernel(Loader ld, AmaxParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x * 32 + lane;
  const bool valid = b < p.nchunks;
  const int64_t c0 = int64_t(b) * 16;
  const int n = valid ? int(p.cols - c0 < 16 ? p.cols - c0 : 16) : 0;
  const int64_t r0 = int64_t(blockIdx.y) * 256 + warp * kAmaxRowsPerWarp;
  const int64_t r1 = r0 + kAmaxRowsPerWarp < p.rows ? r0 + kAmaxRowsPerWarp : p.rows;
  if (r0 >= r1) return;  // warp-uniform
  auto row_part = [&](int64_t r) -> int64_t {
    if (p.dom_kind == kDomGroup) return group_of_row(p.offsets, p.groups, r);
    if (p.dom_kind == kDomTile128) return r / 128;
    return 0;
  };
  auto dom_of = [&](int64_t part) -> int64_t {
    if (!valid) return -1;
    if (p.dom_kind == kDomTile128) return part * p.tile_cols + c0 / 128;
    return part;
  };
  int64_t part = row_part(r0);
  float acc = num::amax_empty();
  for (int64_t r = r0; r < r1; r += 4) {
    float v[4][16];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (valid && r + k < r1) ld.load(r + k, c0, n, v[k]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (r + k < r1) {  // warp-uniform
        const int64_t pk = row_part(r + k);
        if (pk != part) {
          amax_flush(p.keys, dom_of(part), amax_key(acc));
          acc = num::amax_empty();
          part = pk;
        }
        if (valid) acc = num::fmax_f32(acc, amax16(v[k]));
      }
    }
  }
  amax_flush(p.keys, dom_of(part), amax_key(acc));
}

// fill_f32_kernel is a template only so that every translation unit including this header can
// instantiate it without a duplicate symbol (the finishing kernel lives in quantize_tiles_cuda.cu).
template <class T>
__global__ void fill_f32_kernel(T* p, int64_t n, T v) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

// ---- NVFP4 16x16 blocks: CTA = 16 rows x 16 blocks (256 columns); thread (ty, tx) ------------

template <class Loader>
__global__ void __launch_bounds__(256) quantize_nvfp4_2d_kernel(Loader ld, Nvfp4TileParams p) {
  __shared__ float tile_amax[16][17];
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  const int64_t r = int64_t(blockIdx.y) * 16 + ty;
  const int b = blockIdx.x * 16 + tx;
  const bool valid = b < p.nchunks;
  float v[16];
  float cam = num::amax_empty();
  if (valid) {
    ld.load(r, int64_t(b) * 16, 16, v);
    cam = amax16(v);
  }
  tile_amax[ty][tx] = cam;
  __syncthreads();
  if (!valid) return;
  float ta = num::amax_empty();
#pragma unroll
  for (int i = 0; i < 16; ++i) ta = num::fmax_f32(ta, tile_amax[i][tx]);
  const int64_t r_tile = int64_t(blockIdx.y) * 16;
  const int64_t d = p.dom_kind == kDomGroup ? group_of_row(p.offsets, p.groups, r_tile) : 0;
  const num::TwoLevelOuter outer = num::two_level_outer(p.dom_val[d], num::kE2M1Max);
  const uint8_t s = num::two_level_block_scale(ta, outer);
  const float enc = num::two_level_encode_factor(s, outer);
  const uint64_t idx0 = uint64_t(r * p.cols + int64_t(b) * 16);
  *reinterpret_cast<uint2*>(p.data + (r * p.cols + int64_t(b) * 16) / 2) =
      encode_e2m1x16(v, enc, p.sr, idx0);
  p.scale.store(r, b, s);
}

// ---- MXFP8 rowwise and/or columnwise, one pass: CTA = 32 rows x 256 columns ------------------
// Phase 1: thread (row t/8, 32-column block t%8) loads 32 values, writes the rowwise copy and
// parks the values in shared memory; phase 2: thread t owns column t of the tile for the
// columnwise copy. Shared row stride 272 = 8 * 33 + 8 words: both phases are bank-conflict free.
constexpr int kMxRowStride = 272;

template <class Loader>
__global__ void __launch_bounds__(256) quantize_mxfp8_tile_kernel(Loader ld, MxTileParams p) {
  extern __shared__ float sm[];  // [32][kMxRowStride]
  const int t = threadIdx.x;
  const int rr = t >> 3, cb = t & 7;
  const int64_t r = int64_t(blockIdx.y) * 32 + rr;
  const int64_t c0 = int64_t(blockIdx.x) * 256 + cb * 32;
  float v[32];
  if (c0 < p.cols) {
    const int64_t left = p.cols - c0;
    ld.load(r, c0, int(left < 16 ? left : 16), v);
    ld.load(r, c0 + 16, int(left - 16 < 0 ? 0 : (left - 16 < 16 ? left - 16 : 16)), v + 16);
    if (p.rowwise) {  // cols % 32 == 0 here (validated)
      const float bam = num::fmax_f32(amax16(v), amax16(v + 16));
      const uint8_t e = num::mx_block_exponent(bam, p.elem_max);
      const float f = num::mx_encode_factor(e);
      const uint64_t idx0 = uint64_t(r * p.cols + c0);
      uint4* dst = reinterpret_cast<uint4*>(p.data + r * p.cols + c0);
      dst[0] = encode_fp8x16(v, f, p.e5m2, p.sr, idx0);
      dst[1] = encode_fp8x16(v + 16, f, p.e5m2, p.sr, idx0 + 16);
      p.scale.store(r, c0 / 32, e);
    }
  }
  if (!p.colwise) return;
#pragma unroll
  for (int j = 0; j < 32; ++j) sm[rr * kMxRowStride + cb * 33 + j] = c0 < p.cols ? v[j] : 0.0f;
  __syncthreads();
  const int64_t c = int64_t(blockIdx.x) * 256 + t;
  const int64_t rbase = int64_t(blockIdx.y) * 32;
  const num::MiniFloat m = p.e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
  float a = num::amax_empty();
  if (c < p.cols)
    for (int i = 0; i < 32; ++i)
      a = num::amax_fold_fast(a, sm[i * kMxRowStride + (t >> 5) * 33 + (t & 31)]);
  const uint8_t e = num::mx_block_exponent(a, p.elem_max);
  const float f = num::mx_encode_factor(e);
  if (c < p.cols) p.scale_col[int64_t(blockIdx.y) * p.cols + c] = e;
  if (p.sr.on) {
    // Stochastic rounding: elements 4q .. 4q + 3 of one Philox call are 4 adjacent columns of a row
    // (cols % 32 == 0), so thread (column quad t % 64, rows 8 (t / 64) ..) takes one call per row.
    __shared__ float s_fac[256];
    s_fac[t] = f;
    __syncthreads();
    const int cq = t & 63;
    const int64_t cc = int64_t(blockIdx.x) * 256 + 4 * cq;
    if (cc >= p.cols) return;
    for (int i = 0; i < 8; ++i) {
      const int row = 8 * (t >> 6) + i;
      const int64_t r = rbase + row;
      const num::Philox4x32 w =
          num::philox_quad_words(p.sr.seed, p.sr.stream, uint64_t(r * p.cols + cc) >> 2);
      uint32_t out = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int cl = 4 * cq + j;
        const float x = num::mul_rn(sm[row * kMxRowStride + (cl >> 5) * 33 + (cl & 31)], s_fac[cl]);
        out |= uint32_t(num::encode_minifloat_stochastic(m, x, w.v[j])) << (8 * j);
      }
      *reinterpret_cast<uint32_t*>(p.data_col + r * p.cols + cc) = out;
    }
    return;
  }
  if (c >= p.cols) return;
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const float x0 = num::mul_rn(sm[i * kMxRowStride + (t >> 5) * 33 + (t & 31)], f);
    const float x1 = num::mul_rn(sm[(i + 1) * kMxRowStride + (t >> 5) * 33 + (t & 31)], f);
    const uint32_t pair =
        p.e5m2 ? num::encode_e5m2x2_fast(x0, x1) : num::encode_e4m3x2_fast(x0, x1);
    p.data_col[(rbase + i) * p.cols + c] = uint8_t(pair);
    p.data_col[(rbase + i + 1) * p.cols + c] = uint8_t(pair >> 8);
  }
}

// =================================================================================================
// Fast paths for bf16 input, round to nearest (the generic kernels above serve fp32 input,
// stochastic rounding and shapes the fast paths do not cover). The input is read as raw 16-byte
// vectors (8 bf16), several issued before any is used; |x| maxima are per-halfword unsigned maxima
// of the magnitude bits (__vmaxu2: for non-negative bf16 the bit order is the value order). A
// maximum above 0x7F80 (inf) means a NaN was among the elements: the contract's amax ignores NaN,
// so those (rare) elements take a scalar / fp32 path. Same bytes as the generic kernels.

__device__ __forceinline__ uint32_t absmax_bits_x4(const uint4& x) {
  constexpr uint32_t m = 0x7FFF7FFFu;
  return __vmaxu2(__vmaxu2(x.x & m, x.y & m), __vmaxu2(x.z & m, x.w & m));
}
__device__ __forceinline__ uint32_t halves_max(uint32_t m) { return max(m & 0xFFFFu, m >> 16); }

// fmaxf-fold of |x| over the 8 bf16 of x (NaN ignored; only NaN gives NaN).
__device__ __forceinline__ float absmax_f32_x8(const uint4& x, float a) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a = fmaxf(a, fabsf(__uint_as_float(w[i] << 16)));
    a = fmaxf(a, fabsf(__uint_as_float(w[i] & 0xFFFF0000u)));
  }
  return a;
}

// ---- domain amax, bf16 input with cols % 16 == 0 ---------------------------------------------
// Each lane keeps a running max of |x| bits over non-NaN elements and a "non-NaN seen" flag; the
// key (amax_key) is flushed once per CTA (per tensor: one atomic per CTA) or, per group / 128x128
// tile, per warp when the lane's domain changes (the generic kernel's amax_flush). Every register
// array is indexed with compile-time indices only (loops fully unrolled), so none goes to local
// memory.
struct AbsMaxAcc {
  uint32_t m = 0;    // per-halfword max of |x| bits over non-NaN elements
  uint32_t any = 0;  // a non-NaN element was seen
  // The elements of x, NaN skipped one by one (the rare path).
  __device__ __forceinline__ void add_slow(const uint4& x) {
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t b = (w[i] >> (16 * h)) & 0x7FFFu;
        if (b <= 0x7F80u) m = __vmaxu2(m, b), any = 1;  // b in the low half
      }
  }
  // Rows k < n of v (n >= 1); mm = absmax_bits_x4 folded over all of v (rows past n are zero).
  template <int U>
  __device__ __forceinline__ void add(uint32_t mm, const uint4 (&v)[U], int n) {
    if (__builtin_expect(halves_max(mm) <= 0x7F80u, 1)) {
      m = __vmaxu2(m, mm);
      any = 1;
      return;
    }
#pragma unroll
    for (int k = 0; k < U; ++k)
      if (k < n) add_slow(v[k]);
  }
  __device__ __forceinline__ uint32_t key() const { return any ? (halves_max(m) << 16) + 1u : 0u; }
};

__device__ __forceinline__ void amax_flush_cta(uint32_t* keys, uint32_t key) {
  __shared__ uint32_t red[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t k = __reduce_max_sync(0xFFFFFFFFu, key);
  if (lane == 0) red[warp] = k;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t m = 0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) m = max(m, red[w]);
    if (m != 0) atomicMax(keys, m);
  }
}

// Per tensor: the input as one flat array of n16 16-byte vectors. A CTA step reads 256 x kAmaxFlatU
// consecutive vectors (instruction k: 4 KB contiguous), all issued before any is used; CTAs stride
// over the array (the grid is sized to the resident CTAs, so there is no tail wave).
// (A template only so that no two translation units including this header define the same symbol.)
constexpr int kAmaxFlatU = 8;

template <int U = kAmaxFlatU>
__global__ void __launch_bounds__(256)
    domain_amax_flat_bf16_kernel(const uint4* __restrict__ x, int64_t n16, uint32_t* keys) {
  AbsMaxAcc acc;
  const int t = threadIdx.x;
  for (int64_t base = int64_t(blockIdx.x) * 256 * U; base < n16;
       base += int64_t(gridDim.x) * 256 * U) {
    uint4 v[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t i = base + k * 256 + t;
      v[k] = i < n16 ? x[i] : make_uint4(0, 0, 0, 0);
    }
    uint32_t mm = 0;
#pragma unroll
    for (int k = 0; k < U; ++k) mm = __vmaxu2(mm, absmax_bits_x4(v[k]));
    if (__builtin_expect(halves_max(mm) <= 0x7F80u, 1)) {
      acc.m = __vmaxu2(acc.m, mm);
      acc.any |= uint32_t(base + t < n16);
    } else {
#pragma unroll
      for (int k = 0; k < U; ++k)
        if (base + k * 256 + t < n16) acc.add_slow(v[k]);
    }
  }
  amax_flush_cta(keys, acc.key());
}

// Per group / 128x128 tile: work unit of one warp = 8 rows x 256 columns (lane l: columns 8l ..
// 8l+7, one 16-byte load per row, all 8 issued first); the 8 warps of a CTA take adjacent units
// (a CTA instruction reads 4 KB of one row) and stride over the units.
constexpr int kAmaxFastRows = 8;
constexpr int kAmaxFastCols = 256;

template <int Dom>
__global__ void __launch_bounds__(256)
    domain_amax_bf16_kernel(const uint16_t* __restrict__ x, AmaxParams p) {
  static_assert(Dom == kDomGroup || Dom == kDomTile128, "per tensor: domain_amax_flat_bf16_kernel");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t nspans = uint32_t((p.cols + kAmaxFastCols - 1) / kAmaxFastCols);
  const uint32_t nunits = nspans * uint32_t((p.rows + kAmaxFastRows - 1) / kAmaxFastRows);
  AbsMaxAcc acc;
  int64_t dom = -1;  // the domain acc belongs to
  auto row_part = [&](int64_t r) -> int64_t {
    if constexpr (Dom == kDomGroup)
      return group_of_row(p.offsets, p.groups, r);
    else
      return r / 128;
  };
  for (uint32_t u = blockIdx.x * 8u + uint32_t(warp); u < nunits; u += gridDim.x * 8u) {
    const uint32_t span = u % nspans, band = u / nspans;
    const int64_t r0 = int64_t(band) * kAmaxFastRows, c = int64_t(span) * kAmaxFastCols + lane * 8;
    const bool valid = c < p.cols;
    const int n = int(p.rows - r0 < kAmaxFastRows ? p.rows - r0 : kAmaxFastRows);
    uint4 v[kAmaxFastRows];
    const uint16_t* q = x + r0 * p.cols + c;
#pragma unroll
    for (int k = 0; k < kAmaxFastRows; ++k)
      v[k] =
          valid && k < n ? *reinterpret_cast<const uint4*>(q + k * p.cols) : make_uint4(0, 0, 0, 0);
    uint32_t mm = 0;
#pragma unroll
    for (int k = 0; k < kAmaxFastRows; ++k) mm = __vmaxu2(mm, absmax_bits_x4(v[k]));
    const int64_t part0 = row_part(r0), part1 = row_part(r0 + n - 1);  // warp-uniform
    auto dom_of = [&](int64_t part) -> int64_t {
      if (!valid) return -1;
      if constexpr (Dom == kDomTile128)
        return part * p.tile_cols + c / 128;
      else
        return part;
    };
    if (part0 == part1) {
      const int64_t d = dom_of(part0);
      if (__any_sync(0xFFFFFFFFu, d != dom)) {
        amax_flush(p.keys, dom, acc.key());
        acc = AbsMaxAcc{};
        dom = d;
      }
      if (valid) acc.add(mm, v, n);
    } else {  // the unit straddles a group boundary: row by row
#pragma unroll
      for (int k = 0; k < kAmaxFastRows; ++k) {
        if (k < n) {  // warp-uniform
          const int64_t d = dom_of(row_part(r0 + k));
          if (__any_sync(0xFFFFFFFFu, d != dom)) {
            amax_flush(p.keys, dom, acc.key());
            acc = AbsMaxAcc{};
            dom = d;
          }
          if (valid) {
            const uint32_t mk = absmax_bits_x4(v[k]);
            if (halves_max(mk) <= 0x7F80u)
              acc.m = __vmaxu2(acc.m, mk), acc.any = 1;
            else
              acc.add_slow(v[k]);
          }
        }
      }
    }
  }
  amax_flush(p.keys, dom, acc.key());
}

// ---- NVFP4 16x16 blocks, bf16 input, cols % 16 == 0 -------------------------------------------
// Work unit of one warp: 16 rows x 256 columns = 16 tiles side by side. Lane l holds columns
// 8l .. 8l+7 of all 16 rows (16 loads of 16 bytes issued first), so a tile is lanes 2j, 2j+1: its
// amax is the lane's own max over 16 rows and one shuffle. Each lane writes 4 bytes of codes per
// row (a warp: 128 contiguous bytes). The 16 rows of a tile carry the same scale; with compact
// scales and cols % 256 == 0, lanes 0..15 each write one row's 16 scale bytes as one 16-byte store.
// 2-D blocks always follow a domain amax pass, which reads the input front to back; this kernel
// walks it back to front, so it starts on the part still in L2.
constexpr int kNvfp4TileWarps = 4;

// One warp unit: rows r0 .. r0 + 15 x columns c0 .. c0 + 255 (lane l: columns c0 + 8 l .. + 7) in
// the domain of amax dom_amax. Writes the rowwise codes and tile scales and returns the tile's
// scale code; q16[i] is the lane's code word of row r0 + i (the columnwise kernel transposes them).
template <bool Swz>
__device__ __forceinline__ uint8_t nvfp4_2d_unit(const uint16_t* __restrict__ x,
                                                 const Nvfp4TileParams& p, int64_t r0, int64_t c0,
                                                 float dom_amax, uint32_t (&q16)[16]) {
  const int lane = threadIdx.x & 31;
  const int64_t c = c0 + lane * 8;
  const bool valid = c < p.cols;
  uint4 v[16];
  const uint16_t* q = x + r0 * p.cols + c;
#pragma unroll
  for (int i = 0; i < 16; ++i)
    v[i] = valid ? __ldcs(reinterpret_cast<const uint4*>(q + i * p.cols)) : make_uint4(0, 0, 0, 0);
  uint32_t mm = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) mm = __vmaxu2(mm, absmax_bits_x4(v[i]));
  const bool nan_lane = halves_max(mm) > 0x7F80u;
  float la = __uint_as_float(halves_max(mm) << 16);
  if (__builtin_expect(nan_lane, 0)) {
    la = num::amax_empty();
#pragma unroll
    for (int i = 0; i < 16; ++i) la = absmax_f32_x8(v[i], la);
  }
  if (!valid) la = num::amax_empty();
  const float ta = fmaxf(la, __shfl_xor_sync(0xFFFFFFFFu, la, 1));  // maxNum: NaN ignored
  const num::TwoLevelOuter outer = num::two_level_outer_e2m1(dom_amax);
  const uint8_t s = num::two_level_block_scale_fast(ta, outer);
  const float enc = num::two_level_encode_factor_fast(s, outer);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (__builtin_expect(!nan_lane, 1)) {
      q16[i] = encode_e2m1x8_bf16(v[i].x, v[i].y, v[i].z, v[i].w, enc);
    } else {
      const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
      uint32_t o = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o |= num::encode_e2m1_arith(num::mul_rn(__uint_as_float(w[j] << 16), enc)) << (8 * j);
        o |= num::encode_e2m1_arith(num::mul_rn(__uint_as_float(w[j] & 0xFFFF0000u), enc))
             << (8 * j + 4);
      }
      q16[i] = o;
    }
  }
  if (valid) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(p.data + (r0 * p.cols + c) / 2);
    const int64_t stride = p.cols / 8;  // one row in uint32
#pragma unroll
    for (int i = 0; i < 16; ++i) __stcs(dst + i * stride, q16[i]);
  }
  if (!Swz && p.cols % 256 == 0) {
    // Lane 2j holds tile j's code: gather the 16 codes into one 16-byte row of scales.
    const uint32_t sb = s;
    const uint32_t w = sb | (__shfl_down_sync(0xFFFFFFFFu, sb, 2) << 8) |
                       (__shfl_down_sync(0xFFFFFFFFu, sb, 4) << 16) |
                       (__shfl_down_sync(0xFFFFFFFFu, sb, 6) << 24);  // lane 8k: tiles 4k .. 4k+3
    const uint4 row = make_uint4(__shfl_sync(0xFFFFFFFFu, w, 0), __shfl_sync(0xFFFFFFFFu, w, 8),
                                 __shfl_sync(0xFFFFFFFFu, w, 16), __shfl_sync(0xFFFFFFFFu, w, 24));
    if (lane < 16)
      *reinterpret_cast<uint4*>(p.scale.p + (r0 + lane) * p.scale.cols + c0 / 16) = row;
  } else if (valid && (lane & 1) == 0) {
    for (int i = 0; i < 16; ++i) store_scale<Swz>(p.scale, r0 + i, c / 16, s);
  }
  return s;
}

template <bool Swz>
__global__ void __launch_bounds__(kNvfp4TileWarps * 32)
    quantize_nvfp4_2d_bf16_kernel(const uint16_t* __restrict__ x, Nvfp4TileParams p) {
  const int warp = threadIdx.x >> 5;
  const uint32_t nspans = uint32_t((p.cols + 255) / 256);
  const uint32_t nunits = nspans * uint32_t(p.rows / 16);
  const uint32_t w_id = blockIdx.x * uint32_t(kNvfp4TileWarps) + uint32_t(warp);
  if (w_id >= nunits) return;  // warp-uniform; no barrier below
  // Units in reverse order: the amax pass just before ended on the last rows, maybe still in L2.
  const uint32_t u = nunits - 1 - w_id;
  const uint32_t span = u % nspans, band = u / nspans;
  const int64_t r0 = int64_t(band) * 16;
  const int64_t d = p.dom_kind == kDomGroup ? group_of_row(p.offsets, p.groups, r0) : 0;
  uint32_t q16[16];
  nvfp4_2d_unit<Swz>(x, p, r0, int64_t(span) * 256, p.dom_val[d], q16);
}

// ---- MXFP8 rowwise + columnwise, bf16 input, cols % 32 == 0, rows % 32 == 0 -------------------
// CTA = one tile of 32 rows x kCols columns, kCols / 2 threads (one column pair each in phase 2).
// Phase 1: each thread issues 8 coalesced 16-byte loads (a warp reads 512 contiguous bytes per
//   load), quantizes the rowwise copy (a 32-block is 4 adjacent lanes: amax by 2 shuffles; 8 bytes
//   stored per lane) and parks the raw bf16 tile in shared memory.
// Phase 2: thread t owns columns 2t, 2t+1: one 32-bit word per row holds both, so the packed amax
//   gives two E8M0 exponents and one cvt per row gives both codes, which are adjacent bytes of the
//   row-major columnwise copy; they go to a shared [32][kCols] byte tile.
// Phase 3: the code tile leaves as 16-byte stores (a warp writes 512 contiguous bytes).
// Values known to hold no NaN are encoded by the bare cvt (cvt_fp8x2_nonan). Shared memory:
// 32 * kCols * 3 bytes; consecutive lanes touch consecutive words (conflict-free).
template <int kCols>
constexpr size_t mxfp8_tile_smem() {
  return size_t(32) * kCols * 3;
}

// E4M3 / E5M2 pairs ((hi << 8) | lo) for inputs that are not NaN: encode_e4m3x2_fast /
// encode_e5m2x2_fast without their NaN fix-ups (the same codes for every non-NaN input).
template <bool E5M2>
__device__ __forceinline__ uint32_t cvt_fp8x2_nonan(float lo, float hi) {
  uint16_t r;
  if constexpr (E5M2)
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

template <int kCols, bool Swz, bool E5M2>
__global__ void __launch_bounds__(kCols / 2)
    quantize_mxfp8_tile_bf16_kernel(const uint16_t* __restrict__ x, MxTileParams p) {
  constexpr int T = kCols / 2, kVecRow = kCols / 8;  // threads; 16-byte vectors per input row
  extern __shared__ uint4 smx[];
  uint4* s_in = smx;                                                   // [32][kVecRow]
  uint16_t* s_code = reinterpret_cast<uint16_t*>(smx + 32 * kVecRow);  // [32][kCols / 2]
  const int t = threadIdx.x, lane = t & 31;
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * kCols;
  const float inv_max = num::div_rn(1.0f, p.elem_max);
  auto enc2 = [](float a, float b) -> uint32_t {  // any input (NaN -> 0x7F)
    return E5M2 ? num::encode_e5m2x2_fast(a, b) : num::encode_e4m3x2_fast(a, b);
  };
  // Phase 1.
  uint4 v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int L = k * T + t, row = L / kVecRow;
    const int64_t c = c0 + (L % kVecRow) * 8;
    v[k] = c < p.cols ? __ldcs(reinterpret_cast<const uint4*>(x + (r0 + row) * p.cols + c))
                      : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int L = k * T + t, row = L / kVecRow;
    const int64_t c = c0 + (L % kVecRow) * 8;
    s_in[L] = v[k];
    if (p.rowwise) {  // uniform
      const uint32_t h = halves_max(absmax_bits_x4(v[k]));
      const bool clean =
          h <= 0x7F80u;  // these 8 values hold no NaN (then the block's f is not NaN)
      float la = __uint_as_float(h << 16);
      if (__builtin_expect(!clean, 0)) la = absmax_f32_x8(v[k], num::amax_empty());
      la = fmaxf(la, __shfl_xor_sync(0xFFFFFFFFu, la, 1));
      la = fmaxf(la, __shfl_xor_sync(0xFFFFFFFFu, la, 2));
      if (c < p.cols) {
        const uint8_t e = num::encode_e8m0(num::mul_rn(la, inv_max));  // num::mx_block_exponent
        const float f = num::mx_encode_factor(e);
        const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        uint32_t o[4];
        if (__builtin_expect(clean, 1)) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            o[i] = cvt_fp8x2_nonan<E5M2>(num::mul_rn(__uint_as_float(w[i] << 16), f),
                                         num::mul_rn(__uint_as_float(w[i] & 0xFFFF0000u), f));
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            o[i] = enc2(num::mul_rn(__uint_as_float(w[i] << 16), f),
                        num::mul_rn(__uint_as_float(w[i] & 0xFFFF0000u), f));
        }
        __stcs(reinterpret_cast<uint2*>(p.data + (r0 + row) * p.cols + c),
               make_uint2(o[0] | (o[1] << 16), o[2] | (o[3] << 16)));
        if ((lane & 3) == 0) store_scale<Swz>(p.scale, r0 + row, c / 32, e);
      }
    }
  }
  __syncthreads();
  // Phase 2.
  const int64_t cc = c0 + 2 * t;
  const uint32_t* s_in32 = reinterpret_cast<const uint32_t*>(s_in);
  uint32_t w[32];
  uint32_t mm = 0;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    w[i] = s_in32[i * (kCols / 2) + t];
    mm = __vmaxu2(mm, w[i] & 0x7FFF7FFFu);
  }
  const bool clean = halves_max(mm) <= 0x7F80u;  // neither column holds a NaN
  float a0 = __uint_as_float(mm << 16), a1 = __uint_as_float(mm & 0xFFFF0000u);
  if (__builtin_expect(!clean, 0)) {
    a0 = a1 = num::amax_empty();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      a0 = fmaxf(a0, fabsf(__uint_as_float(w[i] << 16)));
      a1 = fmaxf(a1, fabsf(__uint_as_float(w[i] & 0xFFFF0000u)));
    }
  }
  const uint8_t e0 = num::encode_e8m0(num::mul_rn(a0, inv_max)),
                e1 = num::encode_e8m0(num::mul_rn(a1, inv_max));
  const float f0 = num::mx_encode_factor(e0), f1 = num::mx_encode_factor(e1);
  if (__builtin_expect(clean, 1)) {
#pragma unroll
    for (int i = 0; i < 32; ++i)
      s_code[i * (kCols / 2) + t] =
          uint16_t(cvt_fp8x2_nonan<E5M2>(num::mul_rn(__uint_as_float(w[i] << 16), f0),
                                         num::mul_rn(__uint_as_float(w[i] & 0xFFFF0000u), f1)));
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i)
      s_code[i * (kCols / 2) + t] =
          uint16_t(enc2(num::mul_rn(__uint_as_float(w[i] << 16), f0),
                        num::mul_rn(__uint_as_float(w[i] & 0xFFFF0000u), f1)));
  }
  if (cc < p.cols)
    *reinterpret_cast<uint16_t*>(p.scale_col + int64_t(blockIdx.y) * p.cols + cc) =
        uint16_t(e0 | (e1 << 8));
  __syncthreads();
  // Phase 3.
  constexpr int kOutVecRow = kCols / 16;
  const uint4* s_code4 = reinterpret_cast<const uint4*>(s_code);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int L = k * T + t, row = L / kOutVecRow;
    const int64_t c = c0 + (L % kOutVecRow) * 16;
    if (c < p.cols)
      __stcs(reinterpret_cast<uint4*>(p.data_col + (r0 + row) * p.cols + c), s_code4[L]);
  }
}

// ---- Hadamard transform of each 16-chunk (CONTRACT.md section 6), out bf16 or fp32 ------------
__device__ __forceinline__ void hadamard16(const float in[16], float out[16]) {
  num::hadamard16_chunk(in, out);
}

template <class Loader, class Out>
__global__ void hadamard16_kernel(Loader ld, int64_t rows, int64_t cols, Out* out) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // chunk index
  const int64_t nch = cols / 16;
  if (k >= rows * nch) return;
  const int64_t r = k / nch, c0 = (k % nch) * 16;
  float v[16], h[16];
  ld.load(r, c0, 16, v);
  hadamard16(v, h);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if constexpr (sizeof(Out) == 2)
      out[r * cols + c0 + j] = num::f32_to_bf16(h[j]);
    else
      out[r * cols + c0 + j] = h[j];
  }
}

}  // namespace lockstep::cuda::detail
