// Kernels that need more than one row at a time: the domain amax pass (per tensor, per group,
// 128x128 tiles, joint), the finishing kernel that turns amax keys into stored statistics, NVFP4
// 16x16 (2-D) blocks, MXFP8 rowwise + columnwise in one pass, and the Hadamard transform.
#pragma once

#include "lockstep/numerics/hadamard.h"
#include "quantize_cuda.cuh"

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

// ---- finish: keys -> per-domain amax (NVFP4) or scale (FP8) and the stored statistics ---------

__global__ void finish_domains_kernel(FinishParams p) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= p.ndom) return;
  const bool nonempty = p.offsets ? (p.offsets[d + 1] > p.offsets[d] && p.cols > 0) : p.tensor_nonempty;
  const float a = amax_from_key(p.keys[d], nonempty);
  if (p.fp8) {
    const float s = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
    p.dom_val[d] = s;
    p.scale_inv_out[d] = num::fp8_scale_inv(s);
  } else {
    p.dom_val[d] = a;
    if (p.amax_out) p.amax_out[d] = a;
  }
}

__global__ void fill_f32_kernel(float* p, int64_t n, float v) {
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
  *reinterpret_cast<uint2*>(p.data + (r * p.cols + int64_t(b) * 16) / 2) = encode_e2m1x16(v, enc, p.sr, idx0);
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
  if (c >= p.cols) return;
  float col[32];
  float a = num::amax_empty();
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    col[i] = sm[i * kMxRowStride + (t >> 5) * 33 + (t & 31)];
    a = num::amax_fold_fast(a, col[i]);
  }
  const uint8_t e = num::mx_block_exponent(a, p.elem_max);
  const float f = num::mx_encode_factor(e);
  const int64_t rbase = int64_t(blockIdx.y) * 32;
  const num::MiniFloat m = p.e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const float x0 = num::mul_rn(col[i], f), x1 = num::mul_rn(col[i + 1], f);
    uint32_t pair;
    if (!p.sr.on) {
      pair = p.e5m2 ? num::encode_e5m2x2_fast(x0, x1) : num::encode_e4m3x2_fast(x0, x1);
    } else {
      const uint64_t i0 = uint64_t((rbase + i) * p.cols + c), i1 = uint64_t((rbase + i + 1) * p.cols + c);
      pair = num::encode_minifloat_stochastic(m, x0, num::philox_element_word(p.sr.seed, p.sr.stream, i0)) |
             (uint32_t(num::encode_minifloat_stochastic(m, x1, num::philox_element_word(p.sr.seed, p.sr.stream, i1))) << 8);
    }
    p.data_col[(rbase + i) * p.cols + c] = uint8_t(pair);
    p.data_col[(rbase + i + 1) * p.cols + c] = uint8_t(pair >> 8);
  }
  p.scale_col[int64_t(blockIdx.y) * p.cols + c] = e;
}

// ---- Hadamard transform of each 16-chunk (CONTRACT.md section 6), out bf16 or fp32 ------------
__device__ __forceinline__ void hadamard16(const float in[16], float out[16]) { num::hadamard16_chunk(in, out); }

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
    if constexpr (sizeof(Out) == 2) out[r * cols + c0 + j] = num::f32_to_bf16(h[j]);
    else out[r * cols + c0 + j] = h[j];
  }
}

}  // namespace lockstep::cuda::detail
