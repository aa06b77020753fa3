// Kernels of the columnwise copies (CONTRACT.md section 12): the column amax of each group, the
// Hadamard transform down columns, the tile kernel that writes a columnwise copy (and, for FP8, the
// rowwise copy from the same read), the NVFP4 2-D transpose, the FP8 128x128 scale transpose and
// the dequantize of a transposed copy. Same bytes as the CPU reference (quantize_copies_cpu.cpp).
#include "../tensor/cuda_util.h"
#include "lockstep/numerics/hadamard.h"
#include "quantize_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

__device__ __forceinline__ float in_f32(uint16_t v) { return num::bf16_to_f32(v); }
__device__ __forceinline__ float in_f32(float v) { return v; }

// ---- column amax: keys[g * cols + c]
// ------------------------------------------------------------- Lane l of warp w of block (x, y)
// owns the 16 columns of chunk 32 x + l and the rows
// [(8 y + w) * kColAmaxRowsPerWarp, +kColAmaxRowsPerWarp); its 16 running maxima are flushed
// (atomicMax of order-preserving keys: any order gives the same result) when the group changes.
template <class Loader>
__global__ void __launch_bounds__(256) col_amax_kernel(Loader ld, ColAmaxParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x * 32 + lane;
  const int64_t r0 = (int64_t(blockIdx.y) * 8 + warp) * kColAmaxRowsPerWarp;
  const int64_t r1 = r0 + kColAmaxRowsPerWarp < p.rows ? r0 + kColAmaxRowsPerWarp : p.rows;
  if (b >= p.nchunks || r0 >= r1) return;  // no barrier below
  const int64_t c0 = int64_t(b) * 16;
  const int n = int(p.cols - c0 < 16 ? p.cols - c0 : 16);
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = num::amax_empty();
  int64_t g = group_of_row(p.offsets, p.groups, r0), g_end = p.offsets[g + 1];
  auto flush = [&] {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t k = amax_key(acc[i]);
      if (i < n && k != 0) atomicMax(p.keys + g * p.cols + c0 + i, k);
      acc[i] = num::amax_empty();
    }
  };
  for (int64_t r = r0; r < r1; ++r) {
    if (r >= g_end) {
      flush();
      g = group_of_row(p.offsets, p.groups, r);
      g_end = p.offsets[g + 1];
    }
    float v[16];
    ld.load(r, c0, n, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = num::amax_fold_fast(acc[i], v[i]);
  }
  flush();
}

// ---- Hadamard transform of 16-row chunks down each column, bf16 out
// ------------------------------
template <class In>
__global__ void hadamard_cols_kernel(const In* __restrict__ x, int64_t rows, int64_t cols,
                                     uint16_t* out) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (chunk row, column)
  if (k >= rows / 16 * cols) return;
  const int64_t rb = k / cols, c = k % cols;
  float v[16], h[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = in_f32(x[(rb * 16 + i) * cols + c]);
  num::hadamard16_chunk(v, h);
#pragma unroll
  for (int i = 0; i < 16; ++i) out[(rb * 16 + i) * cols + c] = num::f32_to_bf16(h[i]);
}

// ---- helpers of the tile kernels
// ----------------------------------------------------------------- n (<= 64) bytes held in words w
// (byte i in word i / 4) to dst: 16-byte stores where dst and n allow, else 4-byte, else bytes.
template <int kWords>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint32_t (&w)[kWords], int n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  if ((a & 15) == 0 && (n & 15) == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i)
      if (16 * i < n)
        reinterpret_cast<uint4*>(dst)[i] =
            make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  } else if ((a & 3) == 0 && (n & 3) == 0) {
#pragma unroll
    for (int i = 0; i < kWords; ++i)
      if (4 * i < n) reinterpret_cast<uint32_t*>(dst)[i] = w[i];
  } else {
#pragma unroll
    for (int i = 0; i < 4 * kWords; ++i)
      if (i < n) dst[i] = uint8_t(w[i / 4] >> (8 * (i % 4)));
  }
}

// One FP8 code of v * f (RNE, or stochastic with the element's Philox word r).
__device__ __forceinline__ uint32_t fp8_code(float v, float f, bool e5m2, bool sr, uint32_t r) {
  const float x = num::mul_rn(v, f);
  if (sr) {
    const num::MiniFloat m = e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
    return num::encode_minifloat_stochastic(m, x, r);
  }
  return e5m2 ? uint32_t(num::encode_e5m2x2_fast(x, 0.0f) & 0xFFu)
              : uint32_t(num::encode_e4m3x2_fast(x, 0.0f) & 0xFFu);
}

// One E2M1 code of v * f.
__device__ __forceinline__ uint32_t e2m1_code(float v, float f, bool sr, uint32_t r) {
  const float x = num::mul_rn(v, f);
  if (sr) return num::encode_minifloat_stochastic(kFmtE2M1, x, r);
  return num::encode_e2m1_arith(x);
}

// The Philox words of n consecutive elements from idx0 when sr.on (sr_words: one call per quad).
template <int N>
__device__ __forceinline__ void words_if(const SrParams& sr, uint64_t idx0, uint32_t (&w)[N]) {
  if (sr.on) {
    sr_words(sr, idx0, w);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = 0;
  }
}

template <class In>
constexpr int tile_row_elems() {
  return kColTileCols + 16 / int(sizeof(In));  // one 16-byte pad per row: conflict-free stores
}
constexpr int kCodeStride = kColTileCols + 8;  // FP8 code tile row (bytes)

template <class In>
constexpr size_t col_tile_smem(ColMode m) {
  return size_t(kColTileRows) * tile_row_elems<In>() * sizeof(In) +
         (m == ColMode::kFp8Transpose ? size_t(kColTileRows) * kCodeStride : 0) +
         2 * kColTileCols * sizeof(float);
}

// ---- the columnwise tile kernel
// ------------------------------------------------------------------ CTA = one band (<= 128 rows of
// one group) x 128 columns, 256 threads. Phase 1: piece (16 k + t / 16, t % 16) of 8 consecutive
// elements per thread and k (a warp reads 2
//   rows x 256 bytes of bf16), parked raw in shared memory. FP8 1x128 / domain modes also encode
//   the rowwise copy here (a 128-wide block is the 16 lanes of one row: amax by 4 shuffles).
// Phase 2: thread t owns column t % 128 and rows [64 (t / 128), +64) of the band: the columnwise
//   copy, contiguous bytes of row c of X_g^T.
template <class In, ColMode M>
__global__ void __launch_bounds__(256)
    col_tile_kernel(const In* __restrict__ x, ColTileParams p, bool vec) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kRE = tile_row_elems<In>();
  In* s_in = reinterpret_cast<In*>(smem);
  uint8_t* s_code = smem + size_t(kColTileRows) * kRE * sizeof(In);
  float* s_red = reinterpret_cast<float*>(
      s_code + (M == ColMode::kFp8Transpose ? kColTileRows * kCodeStride : 0));
  const RowBand band = p.bands[blockIdx.x];
  const int64_t c0 = int64_t(blockIdx.y) * kColTileCols;
  const int t = threadIdx.x;
  const int64_t g = band.group, gr0 = p.offsets[g], grows = p.offsets[g + 1] - gr0;
  const int64_t rr0 = band.row0 - gr0;  // the band's first row within its group

  // Phase 1: the 8 loads of a thread first (all in flight), then each piece.
  alignas(16) In raw_all[8][8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int row = k * 16 + (t >> 4), chunk = t & 15;
    const int64_t r = band.row0 + row, c = c0 + chunk * 8;
    const int n = row < band.nrows && c < p.cols ? int(p.cols - c < 8 ? p.cols - c : 8) : 0;
    const In* src = x + r * p.cols + c;
    if (vec && n == 8) {
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
#pragma unroll
      for (int i = 0; i < int(sizeof(In)) / 2; ++i) reinterpret_cast<uint4*>(raw_all[k])[i] = s4[i];
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) raw_all[k][i] = i < n ? src[i] : In(0);
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int row = k * 16 + (t >> 4), chunk = t & 15;
    const int64_t r = band.row0 + row, c = c0 + chunk * 8;
    const bool ok = row < band.nrows && c < p.cols;
    const int n = ok ? int(p.cols - c < 8 ? p.cols - c : 8) : 0;
    const In* raw = raw_all[k];
    if (ok) {
      uint4* dst = reinterpret_cast<uint4*>(s_in + row * kRE + chunk * 8);  // 16-byte aligned
#pragma unroll
      for (int i = 0; i < int(sizeof(In)) / 2; ++i) dst[i] = reinterpret_cast<const uint4*>(raw)[i];
    }
    if constexpr (M == ColMode::kNvfp4) {
      if (p.data_row) {  // rowwise blocks of 16: lanes 2j and 2j + 1 of a row
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = i < n ? in_f32(raw[i]) : nan_f32();
        float a = num::amax_empty();
#pragma unroll
        for (int i = 0; i < 8; ++i) a = num::amax_fold(a, v[i]);
        a = num::fmax_f32(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
        const num::TwoLevelOuter outer =
            num::two_level_outer(p.col_val[p.col_dom == 1 ? g : 0], num::kE2M1Max);
        if (ok) {
          const uint8_t sb = num::two_level_block_scale(num::is_nan(a) ? nan_f32() : a, outer);
          const float f = num::two_level_encode_factor(sb, outer);
          uint32_t word = 0, rw[8];
          words_if(p.sr, uint64_t(r * p.cols + c), rw);
#pragma unroll
          for (int i = 0; i < 8; ++i) word |= e2m1_code(v[i], f, p.sr.on, rw[i]) << (4 * i);
          *reinterpret_cast<uint32_t*>(p.data_row + (r * p.cols + c) / 2) = word;  // cols % 16 == 0
          if ((chunk & 1) == 0) p.scale_row.store(r, c / 16, sb);
        }
      }
    }
    if constexpr (M == ColMode::kFp8Block || M == ColMode::kFp8Transpose) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = i < n ? in_f32(raw[i]) : nan_f32();
      float scale;
      if constexpr (M == ColMode::kFp8Block) {
        float a = num::amax_empty();
#pragma unroll
        for (int i = 0; i < 8; ++i) a = num::amax_fold_fast(a, v[i]);
        for (int o = 1; o < 16; o <<= 1) a = num::fmax_f32(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
        a = num::is_nan(a) ? nan_f32() : a;
        scale = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
        if (ok && chunk == 0 && p.data)
          p.scale_inv[r * p.tile_cols + blockIdx.y] = num::fp8_scale_inv(scale);
      } else {
        int64_t d = 0;
        if (p.dom_kind == kDomGroup)
          d = g;
        else if (p.dom_kind == kDomTile128)
          d = (r / 128) * p.tile_cols + int64_t(blockIdx.y);
        scale = ok ? p.dom_val[d] : 1.0f;
      }
      if (ok) {
        uint32_t w[2] = {0, 0}, rw[8];
        words_if(p.sr, uint64_t(r * p.cols + c), rw);
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (i < n) w[i / 4] |= fp8_code(v[i], scale, p.e5m2, p.sr.on, rw[i]) << (8 * (i % 4));
        if (p.data) store_bytes(p.data + r * p.cols + c, w, n);
        if constexpr (M == ColMode::kFp8Transpose)
          *reinterpret_cast<uint2*>(s_code + row * kCodeStride + chunk * 8) =
              make_uint2(w[0], w[1]);
      }
    }
  }
  __syncthreads();

  // Phase 2.
  const int cl = t & 127, h = t >> 7;
  const int64_t c = c0 + cl;
  const bool col_ok = c < p.cols;
  const int rbeg = 64 * h, rend = band.nrows < rbeg + 64 ? band.nrows : rbeg + 64;
  const int cnt = rend > rbeg ? rend - rbeg : 0;
  auto val = [&](int row) { return in_f32(s_in[row * kRE + cl]); };
  if constexpr (M == ColMode::kNvfp4) {
    if (!col_ok || cnt == 0) return;
    int64_t d = 0;
    if (p.col_dom == 1)
      d = g;
    else if (p.col_dom == 2)
      d = g * p.cols + c;
    const num::TwoLevelOuter outer = num::two_level_outer(p.col_val[d], num::kE2M1Max);
    uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 64 codes: 32 bytes
    const uint64_t idx0 = uint64_t(p.cols * gr0 + c * grows + rr0 + rbeg);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (16 * j >= cnt) break;
      float a = num::amax_empty();
#pragma unroll
      for (int i = 0; i < 16; ++i) a = num::amax_fold(a, val(rbeg + 16 * j + i));
      const uint8_t s = num::two_level_block_scale(a, outer);
      const float f = num::two_level_encode_factor(s, outer);
      uint32_t rw[16];
      words_if(p.sr, idx0 + 16 * j, rw);
#pragma unroll
      for (int i = 0; i < 16; ++i)
        w[2 * j + i / 8] |= e2m1_code(val(rbeg + 16 * j + i), f, p.sr.on, rw[i]) << (4 * (i % 8));
      const int64_t jb = (rr0 + rbeg) / 16 + j;  // block index within the group's piece
      const int64_t so = p.scale_col_swizzled ? swizzled_offset(c, jb, round_up(p.rows / 16, 4))
                                              : p.cols * gr0 / 16 + c * (grows / 16) + jb;
      p.scale_col[so] = s;
    }
    store_bytes(p.data_col + (p.cols * gr0 + c * grows + rr0 + rbeg) / 2, w, cnt / 2);
    return;
  } else {
    float scale = 1.0f;
    if constexpr (M == ColMode::kFp8Block) {
      float a = num::amax_empty();
      if (col_ok)
        for (int i = rbeg; i < rend; ++i) a = num::amax_fold_fast(a, val(i));
      s_red[h * kColTileCols + cl] = a;
      __syncthreads();
      a = num::fmax_f32(s_red[cl], s_red[kColTileCols + cl]);
      a = num::is_nan(a) ? nan_f32() : a;
      scale = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
      if (col_ok && h == 0) {
        const int64_t nb = (grows + 127) / 128;
        p.scale_inv_col[p.cols * p.col_sbase[g] + c * nb + rr0 / 128] = num::fp8_scale_inv(scale);
      }
    } else if constexpr (M == ColMode::kFp8Col) {
      if (col_ok) scale = p.col_val[g * p.cols + c];
    }
    if (!col_ok || cnt == 0) return;
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = 0;
    const uint64_t idx0 = uint64_t(p.cols * gr0 + c * grows + rr0 + rbeg);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (16 * j >= cnt) break;
      uint32_t rw[16];
      if constexpr (M != ColMode::kFp8Transpose) words_if(p.sr, idx0 + 16 * j, rw);
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int i = 16 * j + k;
        if (i < cnt) {
          uint32_t code;
          if constexpr (M == ColMode::kFp8Transpose)
            code = s_code[(rbeg + i) * kCodeStride + cl];
          else
            code = fp8_code(val(rbeg + i), scale, p.e5m2, p.sr.on, rw[k]);
          w[i / 4] |= code << (8 * (i % 4));
        }
      }
    }
    store_bytes(p.data_col + p.cols * gr0 + c * grows + rr0 + rbeg, w, cnt);
  }
}

// ---- NVFP4 2-D: the transpose of the rowwise codes and tile scales, per band x 128 columns
// -------
__global__ void __launch_bounds__(256) nvfp4_transpose_kernel(Nvfp4TransposeParams p) {
  __shared__ __align__(16) uint8_t s[kColTileRows][64 + 16];  // rowwise code bytes of the tile
  const RowBand band = p.bands[blockIdx.x];
  const int64_t c0 = int64_t(blockIdx.y) * kColTileCols;
  const int t = threadIdx.x;
  const int64_t g = band.group, gr0 = p.offsets[g], grows = p.offsets[g + 1] - gr0,
                rr0 = band.row0 - gr0;
  const int64_t row_bytes = p.cols / 2;
  for (int i = t; i < kColTileRows * 64; i += 256) {
    const int row = i / 64, byte = i % 64;
    const int64_t cb = c0 / 2 + byte;
    if (row < band.nrows && cb < row_bytes)
      s[row][byte] = p.data[(band.row0 + row) * row_bytes + cb];
  }
  __syncthreads();
  const int cl = t & 127, h = t >> 7;
  const int64_t c = c0 + cl;
  const int rbeg = 64 * h, rend = band.nrows < rbeg + 64 ? band.nrows : rbeg + 64;
  if (c >= p.cols || rend <= rbeg) return;
  const int cnt = rend - rbeg;  // a multiple of 16
  uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 64; ++i)
    if (i < cnt)
      w[i / 8] |= uint32_t((s[rbeg + i][cl / 2] >> (4 * (cl & 1))) & 0xF) << (4 * (i % 8));
  store_bytes(p.data_col + (p.cols * gr0 + c * grows + rr0 + rbeg) / 2, w, cnt / 2);
  for (int j = 0; j < cnt / 16; ++j) {
    const int64_t jb = (rr0 + rbeg) / 16 + j;
    const uint8_t sc = p.scale.load(band.row0 + rbeg + 16 * j, c / 16);
    const int64_t so = p.scale_col_swizzled ? swizzled_offset(c, jb, round_up(p.rows / 16, 4))
                                            : p.cols * gr0 / 16 + c * (grows / 16) + jb;
    p.scale_col[so] = sc;
  }
}

// One thread per rowwise 128x128 tile (tr, bj): group g's piece [nbc, ntr_g] starts at nbc * tr0_g.
__global__ void fp8_tile_scale_transpose_kernel(const float* si, int64_t nbc, int64_t ntiles_r,
                                                const int64_t* offsets, int64_t groups,
                                                float* out) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= ntiles_r * nbc) return;
  const int64_t tr = k / nbc, bj = k % nbc;
  const int64_t g = group_of_row(offsets, groups, tr * 128);
  const int64_t tr0 = offsets[g] / 128, ntr = (offsets[g + 1] - offsets[g] + 127) / 128;
  out[nbc * tr0 + bj * ntr + (tr - tr0)] = si[tr * nbc + bj];
}

// ---- dequantize a transposed columnwise copy: one thread per element of X
// ------------------------
__global__ void dequantize_colwise_kernel(DequantColParams p) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= p.rows * p.cols) return;
  const int64_t r = k / p.cols, c = k % p.cols;
  const int64_t g = group_of_row(p.offsets, p.groups, r), gr0 = p.offsets[g],
                grows = p.offsets[g + 1] - gr0;
  const int64_t rr = r - gr0,
                e = p.cols * gr0 + c * grows + rr;  // element index of the piece's code
  float v;
  if (p.format == Format::kNvfp4) {
    const uint8_t byte = p.data[e / 2];
    const uint8_t code = (e & 1) ? (byte >> 4) : (byte & 0xF);
    const int64_t so = p.scale_swizzled ? swizzled_offset(c, rr / 16, round_up(p.rows / 16, 4))
                                        : p.cols * gr0 / 16 + c * (grows / 16) + rr / 16;
    int64_t d = 0;
    if (p.scaling == Scaling::kPerGroup)
      d = g;
    else if (p.scaling == Scaling::kPerRow && !p.block2d)
      d = g * p.cols + c;
    const float s_dec = num::two_level_outer(p.amax[d], num::kE2M1Max).s_dec;
    v = num::two_level_dequant(num::decode_e2m1(code), p.scale[so], s_dec);
  } else {
    int64_t si = 0;
    switch (p.scaling) {
      case Scaling::kBlock1x128:
        si = p.cols * p.col_sbase[g] + c * ((grows + 127) / 128) + rr / 128;
        break;
      case Scaling::kBlock128x128: {
        const int64_t nbc = (p.cols + 127) / 128;
        si = nbc * (gr0 / 128) + (c / 128) * ((grows + 127) / 128) + rr / 128;
        break;
      }
      case Scaling::kPerRow:
        si = g * p.cols + c;
        break;
      case Scaling::kPerGroup:
        si = g;
        break;
      default:
        break;
    }
    const num::MiniFloat m = p.e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
    v = num::mul_rn(num::decode_minifloat(m, p.data[e]), p.scale_inv[si]);
  }
  if (p.out_bf16)
    p.out_bf16[k] = num::f32_to_bf16(v);
  else
    p.out_f32[k] = v;
}

template <class In, ColMode M>
void col_tiles_t(const In* x, const ColTileParams& p, int64_t nbands, bool vec, cudaStream_t st) {
  constexpr auto kernel = col_tile_kernel<In, M>;
  constexpr size_t smem = col_tile_smem<In>(M);
  static bool attr = false;  // once per instantiation (per process)
  if (!attr) {
    LOCKSTEP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = true;
  }
  const dim3 grid(unsigned(nbands), unsigned((p.cols + kColTileCols - 1) / kColTileCols));
  kernel<<<grid, 256, smem, st>>>(x, p, vec);
}

template <class In>
void col_tiles_mode(const In* x, ColMode m, const ColTileParams& p, int64_t nbands, bool vec,
                    cudaStream_t st) {
  switch (m) {
    case ColMode::kNvfp4:
      return col_tiles_t<In, ColMode::kNvfp4>(x, p, nbands, vec, st);
    case ColMode::kFp8Block:
      return col_tiles_t<In, ColMode::kFp8Block>(x, p, nbands, vec, st);
    case ColMode::kFp8Col:
      return col_tiles_t<In, ColMode::kFp8Col>(x, p, nbands, vec, st);
    case ColMode::kFp8Transpose:
      return col_tiles_t<In, ColMode::kFp8Transpose>(x, p, nbands, vec, st);
  }
}

}  // namespace

void launch_col_amax(const InputRef& in, const ColAmaxParams& p, cudaStream_t st) {
  if (p.rows == 0 || p.cols == 0) return;
  if (launch_col_amax_bf16(in, p, st)) return;
  const int64_t warps = (p.rows + kColAmaxRowsPerWarp - 1) / kColAmaxRowsPerWarp;
  const dim3 grid(unsigned((p.nchunks + 31) / 32), unsigned((warps + 7) / 8));
  with_loader(in, [&](auto ld) { col_amax_kernel<<<grid, 256, 0, st>>>(ld, p); });
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_hadamard_cols(const InputRef& in, int64_t rows, int64_t cols, uint16_t* out,
                          cudaStream_t st) {
  const int64_t n = rows / 16 * cols;
  if (n == 0) return;
  const unsigned grid = unsigned((n + 255) / 256);
  if (in.bf16)
    hadamard_cols_kernel<<<grid, 256, 0, st>>>(static_cast<const uint16_t*>(in.p), rows, cols, out);
  else
    hadamard_cols_kernel<<<grid, 256, 0, st>>>(static_cast<const float*>(in.p), rows, cols, out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_col_tiles(const InputRef& in, ColMode mode, const ColTileParams& p, int64_t nbands,
                      cudaStream_t st) {
  if (nbands == 0 || p.cols == 0) return;
  if (launch_col_tiles_bf16(in, mode, p, nbands, st)) return;
  // 16-byte loads of 8 elements: rows start aligned when cols % 8 == 0 and the base is (16 bytes
  // for bf16, 32 for fp32).
  const bool vec =
      p.cols % 8 == 0 && (reinterpret_cast<uintptr_t>(in.p) & (in.bf16 ? 15u : 31u)) == 0;
  if (in.bf16)
    col_tiles_mode(static_cast<const uint16_t*>(in.p), mode, p, nbands, vec, st);
  else
    col_tiles_mode(static_cast<const float*>(in.p), mode, p, nbands, vec, st);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_nvfp4_transpose(const Nvfp4TransposeParams& p, int64_t nbands, cudaStream_t st) {
  if (nbands == 0 || p.cols == 0) return;
  const dim3 grid(unsigned(nbands), unsigned((p.cols + kColTileCols - 1) / kColTileCols));
  nvfp4_transpose_kernel<<<grid, 256, 0, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_fp8_tile_scale_transpose(const float* scale_inv, int64_t rows, int64_t nbc,
                                     const int64_t* offsets, int64_t groups, float* out,
                                     cudaStream_t st) {
  const int64_t n = (rows + 127) / 128 * nbc;  // rowwise tiles
  if (n == 0) return;
  fp8_tile_scale_transpose_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(
      scale_inv, nbc, (rows + 127) / 128, offsets, groups, out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_dequantize_colwise(const DequantColParams& p, cudaStream_t st) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return;
  dequantize_colwise_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda::detail
