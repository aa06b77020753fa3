// Columnwise copies on bf16 input, round to nearest (CONTRACT.md section 12), at copy bandwidth:
// the columnwise tile kernel (NVFP4 1-D, FP8 1x128 / per column / transpose; the rowwise copy from
// the same read where the mode has one) and the column amax pass. The generic kernels of
// quantize_colwise_cuda.cu serve fp32 input, stochastic rounding and unaligned rows; both give the
// CPU reference's bytes (quantize_copies_cpu.cpp).
#include "../tensor/cuda_util.h"
#include "quantize_tiles_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

// ---- tile geometry
// CTA = one band (<= 128 rows of one group) x 128 columns, 256 threads, 4 CTAs per SM.
// Phase 1: thread t issues its 8 loads of 16 bytes (rows 16 k + t / 16, columns 8 (t % 16) ..: a
//   warp instruction reads 2 rows x 256 contiguous bytes) before using any, stores them to the
//   shared tile (row-major, 256-byte rows: 8 lanes store 128 contiguous bytes, conflict-free) and
//   writes the rowwise copy where the mode has one (a block of 16 is lanes 2j, 2j+1; of 128 the
//   16 lanes of a row).
// Phase 2: warp w takes rows [16 w, 16 w + 16) of the band, lane l the column pairs l and l + 32:
//   16 words of the shared tile (row i, columns 2p, 2p + 1; a warp reads 128 contiguous bytes per
//   row) give both columns' block amax by one per-halfword max (__vmaxu2) and their codes; the
//   codes go to a staging area with one row per column of X.
// Phase 3: each staged column leaves as 16-byte stores of contiguous bytes of X_g^T.
constexpr int kVecs = kColTileCols / 8;                    // 16-byte vectors per tile row
constexpr int kInBytes = kColTileRows * kColTileCols * 2;  // the bf16 tile
constexpr int kF4Pitch = kColTileRows / 2 + 8;  // NVFP4 staging row: 64 code bytes, 8 B pad
constexpr int kF8Pitch = kColTileRows + 16;     // FP8 staging row: 128 code bytes, 16 B pad
constexpr int kScPitch = kColTileRows / 16;     // NVFP4 staged scales per column

// Staging row of tile column cl: even columns in rows 0..63, odd ones in 64..127, so the two
// columns of a lane's pair land in rows p and 64 + p and a warp's stores are conflict-free
// (pitches 72 and 144 are odd multiples of 8 and 16 bytes).
__device__ __forceinline__ int stage_row(int cl) {
  return (cl & 1) * (kColTileCols / 2) + (cl >> 1);
}
__device__ __forceinline__ int stage_col(int j) {
  return j < kColTileCols / 2 ? 2 * j : 2 * (j - kColTileCols / 2) + 1;
}

template <ColMode M>
constexpr size_t fast_tile_smem() {
  if (M == ColMode::kNvfp4)  // + scales, 256 floats of per-column or per-code factors
    return size_t(kInBytes) + kColTileCols * (kF4Pitch + kScPitch) + 256 * sizeof(float);
  // FP8: the 1x128 column partial amax [8][128] floats alias the code staging (used before it).
  return size_t(kInBytes) + kColTileCols * kF8Pitch + kColTileCols * sizeof(float);
}

__device__ __forceinline__ float lo_f(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

template <bool E5M2>
__device__ __forceinline__ uint32_t enc_fp8x2(float lo, float hi) {  // any input (NaN -> 0x7F)
  return E5M2 ? num::encode_e5m2x2_fast(lo, hi) : num::encode_e4m3x2_fast(lo, hi);
}

// Bytes a (rows 0..3) and b (rows 4..7) whose bit 7 is each row's sign -> bit 3 of nibble i for
// row i (an E2M1 word's sign bits): even rows by byte 0x6420, odd rows by 0x7531.
__device__ __forceinline__ uint32_t col_signs8(uint32_t a, uint32_t b) {
  const uint32_t ev = __byte_perm(a, b, 0x6420), od = __byte_perm(a, b, 0x7531);
  return ((ev >> 4) & 0x08080808u) | (od & 0x80808080u);
}

// E2M1 codes of rows 0..7 of a column pair (w[i]: row i, column 0 in the low half) times f0 / f1,
// RNE, no NaN among the 16 values: encode_e2m1x8_bf16's method (num::e2m1_code_magic, Horner
// packing, signs from the inputs) down the columns. Row i's code is nibble i.
__device__ __forceinline__ void e2m1_colpair8(const uint32_t* w, float f0, float f1, uint32_t& q0,
                                              uint32_t& q1) {
  constexpr uint32_t kMagic8 = 0x4B000000u + (0x4B000000u << 4);  // the rest shift out
  uint32_t a0 = 0, a1 = 0;
#pragma unroll
  for (int i = 7; i >= 0; --i) {
    a0 = a0 * 16u + num::e2m1_code_magic(num::mul_rn(lo_f(w[i]), f0));
    a1 = a1 * 16u + num::e2m1_code_magic(num::mul_rn(hi_f(w[i]), f1));
  }
  // High bytes of each row's two halves: p = [w0.b1, w1.b1, w0.b3, w1.b3], then per column.
  const uint32_t p01 = __byte_perm(w[0], w[1], 0x7351), p23 = __byte_perm(w[2], w[3], 0x7351);
  const uint32_t p45 = __byte_perm(w[4], w[5], 0x7351), p67 = __byte_perm(w[6], w[7], 0x7351);
  q0 = a0 - kMagic8 + col_signs8(__byte_perm(p01, p23, 0x5410), __byte_perm(p45, p67, 0x5410));
  q1 = a1 - kMagic8 + col_signs8(__byte_perm(p01, p23, 0x7632), __byte_perm(p45, p67, 0x7632));
}

// One column of a pair holding a NaN: the row kernel's NaN path (fp32 amax, encode_e2m1_arith).
__device__ __forceinline__ void e2m1_col16_slow(const uint32_t (&w)[16], bool high,
                                                const num::TwoLevelOuter& o, uint8_t& s,
                                                uint32_t (&q)[2]) {
  float v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = high ? hi_f(w[i]) : lo_f(w[i]);
  s = num::two_level_block_scale_fast(amax16(v), o);
  const float f = num::two_level_encode_factor(s, o);
  q[0] = q[1] = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i)
    q[i / 8] |= num::encode_e2m1_arith(num::mul_rn(v[i], f)) << (4 * (i % 8));
}

// FP8 codes of 16 rows of a column pair (row i is byte i), scales s0 / s1; clean: no NaN.
template <bool E5M2>
__device__ __forceinline__ void fp8_colpair16(const uint32_t (&w)[16], float s0, float s1,
                                              bool clean, uint4& q0, uint4& q1) {
  uint32_t o0[4], o1[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      a[i] = num::mul_rn(lo_f(w[4 * j + i]), s0), b[i] = num::mul_rn(hi_f(w[4 * j + i]), s1);
    if (clean) {
      o0[j] = cvt_fp8x2_nonan<E5M2>(a[0], a[1]) | (cvt_fp8x2_nonan<E5M2>(a[2], a[3]) << 16);
      o1[j] = cvt_fp8x2_nonan<E5M2>(b[0], b[1]) | (cvt_fp8x2_nonan<E5M2>(b[2], b[3]) << 16);
    } else {
      o0[j] = enc_fp8x2<E5M2>(a[0], a[1]) | (enc_fp8x2<E5M2>(a[2], a[3]) << 16);
      o1[j] = enc_fp8x2<E5M2>(b[0], b[1]) | (enc_fp8x2<E5M2>(b[2], b[3]) << 16);
    }
  }
  q0 = make_uint4(o0[0], o0[1], o0[2], o0[3]);
  q1 = make_uint4(o1[0], o1[1], o1[2], o1[3]);
}

// Phase 1, NVFP4 rowwise copy of one 8-element piece (row r, columns c .. c+7; the block's other
// half is lane t ^ 1). enc: encode factor of each scale code of the domain (outer).
__device__ __forceinline__ void nvfp4_row_piece(const ColTileParams& p, const uint4& v, bool ok,
                                                int64_t r, int64_t c, const num::TwoLevelOuter& o,
                                                const float* enc) {
  const uint32_t h = halves_max(absmax_bits_x4(v));
  const bool clean = h <= 0x7F80u;
  float la = num::amax_empty();
  if (ok) la = clean ? __uint_as_float(h << 16) : absmax_f32_x8(v, num::amax_empty());
  const float ba = fmaxf(la, __shfl_xor_sync(0xFFFFFFFFu, la, 1));  // maxNum: NaN ignored
  if (!ok) return;
  uint8_t s;
  float f;
  if (!num::is_nan(ba)) {
    s = num::two_level_block_scale_nonan(ba, o);
    f = enc[s];
  } else {  // all 16 NaN
    s = num::two_level_block_scale_fast(ba, o);
    f = num::two_level_encode_factor(s, o);
  }
  uint32_t word = 0;
  if (clean) {
    word = encode_e2m1x8_bf16(v.x, v.y, v.z, v.w, f);
  } else {
    const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      word |= (num::encode_e2m1_arith(num::mul_rn(lo_f(w4[j]), f)) << (8 * j)) |
              (num::encode_e2m1_arith(num::mul_rn(hi_f(w4[j]), f)) << (8 * j + 4));
  }
  *reinterpret_cast<uint32_t*>(p.data_row + (r * p.cols + c) / 2) = word;  // cols % 16 == 0
  if (((c / 8) & 1) == 0) p.scale_row.store(r, c / 16, s);
}

// Phase 1, FP8 rowwise copy of one 8-element piece with the row's scale (1x128: the amax of the
// 16 lanes of the row; transpose modes: the domain's scale).
template <ColMode M, bool E5M2>
__device__ __forceinline__ void fp8_row_piece(const ColTileParams& p, const uint4& v, bool ok,
                                              int64_t r, int64_t c, int64_t tile, float dom_scale) {
  const uint32_t h = halves_max(absmax_bits_x4(v));
  const bool clean = h <= 0x7F80u;
  float scale = dom_scale;
  if constexpr (M == ColMode::kFp8Block) {
    float a = num::amax_empty();
    if (ok) a = clean ? __uint_as_float(h << 16) : absmax_f32_x8(v, num::amax_empty());
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    a = num::is_nan(a) ? nan_f32() : a;
    scale = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
    if (ok && c % kColTileCols == 0)
      p.scale_inv[r * p.tile_cols + tile] = num::fp8_scale_inv(scale);
  }
  if (!ok) return;
  const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float x0 = num::mul_rn(lo_f(w4[i]), scale), x1 = num::mul_rn(hi_f(w4[i]), scale);
    o[i] = clean ? cvt_fp8x2_nonan<E5M2>(x0, x1) : enc_fp8x2<E5M2>(x0, x1);
  }
  __stcs(reinterpret_cast<uint2*>(p.data + r * p.cols + c),
         make_uint2(o[0] | (o[1] << 16), o[2] | (o[3] << 16)));
}

// n (<= 16) bytes of v to dst: one 16-byte store when aligned and whole, else byte by byte.
__device__ __forceinline__ void store16(uint8_t* dst, const uint4& v, int n) {
  if (n == 16 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    __stcs(reinterpret_cast<uint4*>(dst), v);
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int b = 0; b < 16; ++b)
    if (b < n) dst[b] = uint8_t(w[b / 4] >> (8 * (b % 4)));
}

// ---- the tile kernel
// Bands are taken back to front: the domain or column amax pass just before read the input front
// to back, so the first tiles here find their rows in L2.
template <ColMode M, bool E5M2>
__global__ void __launch_bounds__(256, 4)
    col_tile_bf16_kernel(const uint16_t* __restrict__ x, ColTileParams p, int64_t ntc,
                         int64_t nbands) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint4* s_in = reinterpret_cast<uint4*>(smem);  // [128 rows][kVecs]
  uint8_t* s_code = smem + kInBytes;             // [128 staging rows][pitch]
  constexpr int kCodeBytes = kColTileCols * (M == ColMode::kNvfp4 ? kF4Pitch : kF8Pitch);
  uint8_t* s_sc = s_code + kCodeBytes;  // NVFP4 scales [128 staging rows][8]
  // NVFP4: [0, 128) the encode factor of each scale code (one domain) or S_enc / 6 of each column,
  // [128, 256) S_dec of each column; FP8: the scale of each column.
  float* s_f =
      reinterpret_cast<float*>(s_sc + (M == ColMode::kNvfp4 ? kColTileCols * kScPitch : 0));
  float* s_amax = reinterpret_cast<float*>(s_code);  // FP8 1x128: [8][128] column partial amax

  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t tile = int64_t(blockIdx.x) % ntc;
  const RowBand band = p.bands[nbands - 1 - int64_t(blockIdx.x) / ntc];
  const int64_t cols = p.cols, c0 = tile * kColTileCols;
  const int64_t g = band.group, gr0 = p.offsets[g], grows = p.offsets[g + 1] - gr0;
  const int64_t rr0 = band.row0 - gr0;  // the band's first row within its group
  const int nrows = band.nrows;

  uint4 v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int row = k * 16 + (t >> 4);
    const int64_t c = c0 + (t & 15) * 8;
    v[k] = row < nrows && c < cols
               ? __ldcs(reinterpret_cast<const uint4*>(x + (band.row0 + row) * cols + c))
               : make_uint4(0, 0, 0, 0);
  }
  // Per-CTA constants while the loads are in flight.
  num::TwoLevelOuter outer{};
  float dom_scale = 1.0f;
  if constexpr (M == ColMode::kNvfp4) {
    if (p.col_dom == 2) {
      if (t < kColTileCols) {
        const int64_t c = c0 + t;
        const num::TwoLevelOuter o =
            num::two_level_outer_e2m1(c < cols ? p.col_val[g * cols + c] : 0.0f);
        s_f[t] = o.s_enc_x_inv_max, s_f[kColTileCols + t] = o.s_dec;
      }
    } else {
      outer = num::two_level_outer_e2m1(p.col_val[p.col_dom == 1 ? g : 0]);
      if (t < 128) s_f[t] = num::two_level_encode_factor_fast(uint8_t(t), outer);
    }
  } else if constexpr (M == ColMode::kFp8Col) {
    if (t < kColTileCols) s_f[t] = c0 + t < cols ? p.col_val[g * cols + c0 + t] : 1.0f;
  } else if constexpr (M == ColMode::kFp8Transpose) {
    int64_t d = 0;
    if (p.dom_kind == kDomGroup)
      d = g;
    else if (p.dom_kind == kDomTile128)  // bands of 128x128 scaling start on 128-row blocks
      d = (band.row0 / 128) * p.tile_cols + tile;
    dom_scale = p.dom_val[d];
  }
  __syncthreads();

  // Phase 1.
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int row = k * 16 + (t >> 4);
    const int64_t r = band.row0 + row, c = c0 + (t & 15) * 8;
    const bool ok = row < nrows && c < cols;
    s_in[row * kVecs + (t & 15)] = v[k];
    if constexpr (M == ColMode::kNvfp4) {
      if (p.data_row) nvfp4_row_piece(p, v[k], ok, r, c, outer, s_f);
    } else if constexpr (M == ColMode::kFp8Block || M == ColMode::kFp8Transpose) {
      if (p.data) fp8_row_piece<M, E5M2>(p, v[k], ok, r, c, tile, dom_scale);
    }
  }
  __syncthreads();

  // Phase 2.
  const uint32_t* s32 = reinterpret_cast<const uint32_t*>(s_in);           // [128 rows][64 words]
  const int rb = warp, nvr = nrows - 16 * rb < 16 ? nrows - 16 * rb : 16;  // rows of the strip
  auto strip = [&](int cp, uint32_t(&w)[16]) {  // returns the max |x| bits
    uint32_t mm = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = s32[(16 * rb + i) * (kColTileCols / 2) + cp];  // rows past the band hold zeros
      mm = __vmaxu2(mm, w[i] & 0x7FFF7FFFu);
    }
    return mm;
  };
  if constexpr (M == ColMode::kNvfp4) {
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      const int cl = 2 * (lane + 32 * h);
      if (nvr <= 0 || c0 + cl >= cols) continue;  // (nvr is 16 otherwise: rows % 16 == 0)
      uint32_t w[16];
      const uint32_t mm = strip(lane + 32 * h, w);
      num::TwoLevelOuter o0 = outer, o1 = outer;
      if (p.col_dom == 2) {
        o0.s_enc_x_inv_max = s_f[cl], o0.s_dec = s_f[kColTileCols + cl];
        o1.s_enc_x_inv_max = s_f[cl + 1], o1.s_dec = s_f[kColTileCols + cl + 1];
      }
      uint32_t q0[2], q1[2];
      uint8_t sc0, sc1;
      if (halves_max(mm) <= 0x7F80u) {
        sc0 = num::two_level_block_scale_nonan(__uint_as_float(mm << 16), o0);
        sc1 = num::two_level_block_scale_nonan(__uint_as_float(mm & 0xFFFF0000u), o1);
        const float f0 = p.col_dom == 2 ? num::two_level_encode_factor_fast(sc0, o0) : s_f[sc0];
        const float f1 = p.col_dom == 2 ? num::two_level_encode_factor_fast(sc1, o1) : s_f[sc1];
        e2m1_colpair8(w, f0, f1, q0[0], q1[0]);
        e2m1_colpair8(w + 8, f0, f1, q0[1], q1[1]);
      } else {
        e2m1_col16_slow(w, false, o0, sc0, q0);
        e2m1_col16_slow(w, true, o1, sc1, q1);
      }
      const int j0 = stage_row(cl), j1 = stage_row(cl + 1);
      *reinterpret_cast<uint2*>(s_code + j0 * kF4Pitch + 8 * rb) = make_uint2(q0[0], q0[1]);
      *reinterpret_cast<uint2*>(s_code + j1 * kF4Pitch + 8 * rb) = make_uint2(q1[0], q1[1]);
      s_sc[j0 * kScPitch + rb] = sc0;
      s_sc[j1 * kScPitch + rb] = sc1;
    }
  } else {
    if constexpr (M == ColMode::kFp8Block) {  // the scale of each column's 128-row block first
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        const int cl = 2 * (lane + 32 * h);
        float a0 = num::amax_empty(), a1 = num::amax_empty();
        if (nvr > 0 && c0 + cl < cols) {
          uint32_t w[16];
          const uint32_t mm = strip(lane + 32 * h, w);
          if (halves_max(mm) <= 0x7F80u) {  // zero rows past the band change no maximum here
            a0 = __uint_as_float(mm << 16), a1 = __uint_as_float(mm & 0xFFFF0000u);
          } else {
#pragma unroll
            for (int i = 0; i < 16; ++i)
              if (i < nvr) a0 = fmaxf(a0, fabsf(lo_f(w[i]))), a1 = fmaxf(a1, fabsf(hi_f(w[i])));
          }
        }
        s_amax[rb * kColTileCols + cl] = a0, s_amax[rb * kColTileCols + cl + 1] = a1;
      }
      __syncthreads();
      if (t < kColTileCols) {
        float a = num::amax_empty();
        for (int b = 0; b < (nrows + 15) / 16; ++b) a = fmaxf(a, s_amax[b * kColTileCols + t]);
        a = num::is_nan(a) ? nan_f32() : a;
        const float sc = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
        s_f[t] = sc;
        if (c0 + t < cols)
          p.scale_inv_col[cols * p.col_sbase[g] + (c0 + t) * ((grows + 127) / 128) + rr0 / 128] =
              num::fp8_scale_inv(sc);
      }
      __syncthreads();  // (the partial amax are read; the staging area may be written)
    }
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      const int cl = 2 * (lane + 32 * h);
      if (nvr <= 0 || c0 + cl >= cols) continue;
      uint32_t w[16];
      const uint32_t mm = strip(lane + 32 * h, w);
      const float s0 = M == ColMode::kFp8Transpose ? dom_scale : s_f[cl];
      const float s1 = M == ColMode::kFp8Transpose ? dom_scale : s_f[cl + 1];
      uint4 q0, q1;
      fp8_colpair16<E5M2>(w, s0, s1, halves_max(mm) <= 0x7F80u, q0, q1);
      *reinterpret_cast<uint4*>(s_code + stage_row(cl) * kF8Pitch + 16 * rb) = q0;
      *reinterpret_cast<uint4*>(s_code + stage_row(cl + 1) * kF8Pitch + 16 * rb) = q1;
    }
  }
  __syncthreads();

  // Phase 3: column c of the tile is X_g^T's row c, its bytes for the band's rows contiguous.
  if constexpr (M == ColMode::kNvfp4) {
    const int nbytes = nrows / 2;  // a multiple of 8
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int i = t + 256 * m, j = i >> 2, k = i & 3;
      const int64_t c = c0 + stage_col(j);
      if (c >= cols || 16 * k >= nbytes) continue;
      uint8_t* dst = p.data_col + (cols * gr0 + c * grows + rr0) / 2 + 16 * k;  // 8-aligned
      const uint8_t* src = s_code + j * kF4Pitch + 16 * k;
      const uint2 a = *reinterpret_cast<const uint2*>(src);
      const uint2 b = *reinterpret_cast<const uint2*>(src + 8);
      if (16 * k + 16 <= nbytes && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        __stcs(reinterpret_cast<uint4*>(dst), make_uint4(a.x, a.y, b.x, b.y));
      } else {
        *reinterpret_cast<uint2*>(dst) = a;
        if (16 * k + 8 < nbytes) *reinterpret_cast<uint2*>(dst + 8) = b;
      }
    }
    if (t < kColTileCols) {
      const int64_t c = c0 + stage_col(t);
      const int nb = nrows / 16;
      const uint8_t* src = s_sc + t * kScPitch;
      if (c < cols) {
        if (p.scale_col_swizzled) {
          for (int b = 0; b < nb; ++b)
            p.scale_col[swizzled_offset(c, rr0 / 16 + b, round_up(p.rows / 16, 4))] = src[b];
        } else {
          uint8_t* dst = p.scale_col + cols * gr0 / 16 + c * (grows / 16) + rr0 / 16;
          if (nb == kScPitch && (reinterpret_cast<uintptr_t>(dst) & 7) == 0)
            *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
          else
            for (int b = 0; b < nb; ++b) dst[b] = src[b];
        }
      }
    }
  } else {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int i = t + 256 * m, j = i >> 3, k = i & 7;
      const int64_t c = c0 + stage_col(j);
      if (c >= cols || 16 * k >= nrows) continue;
      store16(p.data_col + cols * gr0 + c * grows + rr0 + 16 * k,
              *reinterpret_cast<const uint4*>(s_code + j * kF8Pitch + 16 * k),
              nrows - 16 * k < 16 ? nrows - 16 * k : 16);
    }
  }
}

// ---- column amax of each group, bf16: keys[g * cols + c]
// Warp unit: 256 columns (lane l: columns 8 l .. 8 l + 7, one 16-byte load per row) x kCaRows
// rows, kCaLoads loads in flight per lane. The loop keeps per-halfword maxima of the |x| bits and
// no NaN test: a NaN's bits exceed 0x7F80, so a maximum past 0x7F80 sends the lane's rows of that
// group through the exact path (NaN ignored) again. One atomicMax per column and group segment.
constexpr int kCaRows = 128, kCaLoads = 8;

__global__ void __launch_bounds__(256)
    col_amax_bf16_kernel(const uint16_t* __restrict__ x, ColAmaxParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t u = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int64_t nspans = (p.cols + 255) / 256;
  const int64_t r0 = u / nspans * kCaRows;
  if (r0 >= p.rows) return;  // warp-uniform; no barrier below
  const int64_t c = u % nspans * 256 + lane * 8;
  const bool valid = c < p.cols;
  const int64_t r1 = r0 + kCaRows < p.rows ? r0 + kCaRows : p.rows;
  int64_t g = group_of_row(p.offsets, p.groups, r0), g_end = p.offsets[g + 1], seg = r0;
  uint32_t m[4] = {0, 0, 0, 0};
  auto flush = [&](int64_t end) {  // rows [seg, end) of group g
    if (!valid || end <= seg) return;
    uint32_t seen = 0xFFu;  // columns with a non-NaN element
    if (halves_max(__vmaxu2(__vmaxu2(m[0], m[1]), __vmaxu2(m[2], m[3]))) > 0x7F80u) {
      seen = 0;
      m[0] = m[1] = m[2] = m[3] = 0;
      for (int64_t r = seg; r < end; ++r) {
        const uint4 v = *reinterpret_cast<const uint4*>(x + r * p.cols + c);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t b = (w[i / 2] >> (16 * (i % 2))) & 0x7FFFu;
          if (b <= 0x7F80u) m[i / 2] = __vmaxu2(m[i / 2], b << (16 * (i % 2))), seen |= 1u << i;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (seen >> i & 1u)
        atomicMax(p.keys + g * p.cols + c + i,
                  (((m[i / 2] >> (16 * (i % 2))) & 0xFFFFu) << 16) + 1u);
    m[0] = m[1] = m[2] = m[3] = 0;
  };
  for (int64_t r = r0; r < r1; r += kCaLoads) {
    uint4 v[kCaLoads];
#pragma unroll
    for (int k = 0; k < kCaLoads; ++k)
      v[k] = valid && r + k < r1 ? *reinterpret_cast<const uint4*>(x + (r + k) * p.cols + c)
                                 : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < kCaLoads; ++k) {
      if (r + k >= r1) break;
      if (r + k >= g_end) {  // warp-uniform: a new group starts at this row
        flush(r + k);
        g = group_of_row(p.offsets, p.groups, r + k), g_end = p.offsets[g + 1], seg = r + k;
      }
      m[0] = __vmaxu2(m[0], v[k].x & 0x7FFF7FFFu), m[1] = __vmaxu2(m[1], v[k].y & 0x7FFF7FFFu);
      m[2] = __vmaxu2(m[2], v[k].z & 0x7FFF7FFFu), m[3] = __vmaxu2(m[3], v[k].w & 0x7FFF7FFFu);
    }
  }
  flush(r1);
}

int current_device() {
  int dev = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

template <ColMode M, bool E5M2>
void col_tiles_bf16_t(const uint16_t* x, const ColTileParams& p, int64_t nbands, int64_t ntc,
                      cudaStream_t st) {
  constexpr auto kernel = col_tile_bf16_kernel<M, E5M2>;
  constexpr size_t smem = fast_tile_smem<M>();
  static bool attr[64] = {};  // the dynamic shared memory limit, once per device
  const int dev = current_device() & 63;
  if (!attr[dev]) {
    LOCKSTEP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr[dev] = true;
  }
  kernel<<<unsigned(nbands * ntc), 256, smem, st>>>(x, p, ntc, nbands);
}

}  // namespace

bool launch_col_tiles_bf16(const InputRef& in, ColMode mode, const ColTileParams& p, int64_t nbands,
                           cudaStream_t st) {
  const int64_t ntc = (p.cols + kColTileCols - 1) / kColTileCols;
  if (!in.bf16 || p.cols % 8 != 0 || (reinterpret_cast<uintptr_t>(in.p) & 15) != 0 || p.sr.on ||
      nbands * ntc >= (int64_t(1) << 31))
    return false;
  const auto* x = static_cast<const uint16_t*>(in.p);
  switch (mode) {
    case ColMode::kNvfp4:
      col_tiles_bf16_t<ColMode::kNvfp4, false>(x, p, nbands, ntc, st);
      break;
    case ColMode::kFp8Block:
      p.e5m2 ? col_tiles_bf16_t<ColMode::kFp8Block, true>(x, p, nbands, ntc, st)
             : col_tiles_bf16_t<ColMode::kFp8Block, false>(x, p, nbands, ntc, st);
      break;
    case ColMode::kFp8Col:
      p.e5m2 ? col_tiles_bf16_t<ColMode::kFp8Col, true>(x, p, nbands, ntc, st)
             : col_tiles_bf16_t<ColMode::kFp8Col, false>(x, p, nbands, ntc, st);
      break;
    case ColMode::kFp8Transpose:
      p.e5m2 ? col_tiles_bf16_t<ColMode::kFp8Transpose, true>(x, p, nbands, ntc, st)
             : col_tiles_bf16_t<ColMode::kFp8Transpose, false>(x, p, nbands, ntc, st);
      break;
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return true;
}

bool launch_col_amax_bf16(const InputRef& in, const ColAmaxParams& p, cudaStream_t st) {
  if (!in.bf16 || p.cols % 8 != 0 || (reinterpret_cast<uintptr_t>(in.p) & 15) != 0) return false;
  const int64_t units = (p.cols + 255) / 256 * ((p.rows + kCaRows - 1) / kCaRows);
  if ((units + 7) / 8 >= (int64_t(1) << 31)) return false;
  col_amax_bf16_kernel<<<unsigned((units + 7) / 8), 256, 0, st>>>(
      static_cast<const uint16_t*>(in.p), p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace lockstep::cuda::detail
