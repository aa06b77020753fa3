// NVFP4 16x16 (2-D) blocks on bf16 input with both copies from one read (CONTRACT.md section 12:
// the columnwise copy is the transpose of the rowwise codes and tile scales). The rowwise-only
// kernels and the generic fallback (rowwise kernel, then nvfp4_transpose_kernel) stay in
// quantize_tiles_cuda.cuh / quantize_colwise_cuda.cu; the bytes are the same.
#include "../tensor/cuda_util.h"
#include "quantize_tiles_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

// Transpose of an 8x8 matrix of nibbles: a[i] holds row i (column k in nibble k); afterwards a[k]
// holds column k (row i in nibble i). Three block swaps: 4x4 blocks (half-words), 2x2 (bytes),
// 1x1 (nibbles); 32 instructions for 64 codes.
__device__ __forceinline__ void transpose8x8_nibbles(uint32_t (&a)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t x = a[i], y = a[i + 4];
    a[i] = __byte_perm(x, y, 0x5410), a[i + 4] = __byte_perm(x, y, 0x7632);
  }
#pragma unroll
  for (int i : {0, 1, 4, 5}) {
    const uint32_t x = a[i], y = a[i + 2];
    a[i] = __byte_perm(x, y, 0x6240), a[i + 2] = __byte_perm(x, y, 0x7351);
  }
#pragma unroll
  for (int i : {0, 2, 4, 6}) {
    const uint32_t x = a[i], y = a[i + 1];
    a[i] = (x & 0x0F0F0F0Fu) | ((y << 4) & 0xF0F0F0F0u);
    a[i + 1] = ((x >> 4) & 0x0F0F0F0Fu) | (y & 0xF0F0F0F0u);
  }
}

// Staging of the transposed codes: unit (column j of lane l's 8, lane l, warp w) is a uint2 (the
// 16 rows of warp w of that column) at (j * 32 + l) * 8 + (w ^ ((l >> 1) & 7)): the 16 lanes of a
// half-warp hit 16 different 8-byte banks both when warp w writes (j fixed) and when warp j reads
// (w fixed).
__device__ __forceinline__ int t_unit(int j, int l, int w) { return (j * 32 + l) * 8 + (w ^ ((l >> 1) & 7)); }

// CTA = one band (<= 128 rows of one group, a multiple of 16) x 256 columns, 8 warps. Warp w:
// rows [16 w, 16 w + 16) of the band as quantize_nvfp4_2d_bf16_kernel's unit (lane l holds columns
// 8 l .. 8 l + 7 of all 16 rows: the 16x16 tile is lanes 2m, 2m + 1), the rowwise codes stored
// from registers (a warp writes 128 contiguous bytes per row); the lane's 16 code words transposed
// as two 8x8 nibble matrices into 8 columns x 16 rows, staged in shared memory. Then warp j writes
// columns 8 l + j (lane l): the band's nrows / 2 code bytes of that column of X_g^T (16-byte stores)
// and its nrows / 16 scale bytes. Bands are taken back to front (the amax pass before read the
// input front to back).
template <bool Swz>
__global__ void __launch_bounds__(256, 2)
    nvfp4_2d_both_bf16_kernel(const uint16_t* __restrict__ x, Nvfp4TileParams p, int64_t nspans) {
  __shared__ uint2 s_t[8 * 32 * 8];
  __shared__ uint8_t s_sc[8][16];  // [warp][tile]: the tile scales of the band
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t span = int64_t(blockIdx.x) % nspans;
  const RowBand band = p.bands[p.nbands - 1 - int64_t(blockIdx.x) / nspans];
  const int64_t cols = p.cols, c0 = span * 256, c = c0 + lane * 8;
  const int64_t g = band.group, gr0 = p.offsets[g], grows = p.offsets[g + 1] - gr0;
  const int64_t rr0 = band.row0 - gr0;
  const bool valid = c < cols;
  const bool active = 16 * warp < band.nrows;  // warp-uniform
  const int64_t r0 = band.row0 + 16 * warp;
  if (active) {
    uint4 v[16];
    const uint16_t* q = x + r0 * cols + c;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      v[i] = valid ? __ldcs(reinterpret_cast<const uint4*>(q + i * cols)) : make_uint4(0, 0, 0, 0);
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
    const num::TwoLevelOuter outer = num::two_level_outer_e2m1(p.dom_val[p.dom_kind == kDomGroup ? g : 0]);
    const uint8_t s = num::two_level_block_scale_fast(ta, outer);
    const float enc = num::two_level_encode_factor_fast(s, outer);
    uint32_t q16[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (__builtin_expect(!nan_lane, 1)) {
        q16[i] = encode_e2m1x8_bf16(v[i].x, v[i].y, v[i].z, v[i].w, enc);
      } else {
        const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
        uint32_t o = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          o |= (num::encode_e2m1_arith(num::mul_rn(__uint_as_float(w[j] << 16), enc)) << (8 * j)) |
               (num::encode_e2m1_arith(num::mul_rn(__uint_as_float(w[j] & 0xFFFF0000u), enc)) << (8 * j + 4));
        q16[i] = o;
      }
    }
    if (valid) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(p.data + (r0 * cols + c) / 2);
#pragma unroll
      for (int i = 0; i < 16; ++i) __stcs(dst + i * (cols / 8), q16[i]);
    }
    // Rowwise tile scales: all 16 rows of the tile carry s.
    if (!Swz && cols % 256 == 0) {  // lane 2m holds tile m's code: one 16-byte row of scales
      const uint32_t sb = s;
      const uint32_t w = sb | (__shfl_down_sync(0xFFFFFFFFu, sb, 2) << 8) |
                         (__shfl_down_sync(0xFFFFFFFFu, sb, 4) << 16) | (__shfl_down_sync(0xFFFFFFFFu, sb, 6) << 24);
      const uint4 row = make_uint4(__shfl_sync(0xFFFFFFFFu, w, 0), __shfl_sync(0xFFFFFFFFu, w, 8),
                                   __shfl_sync(0xFFFFFFFFu, w, 16), __shfl_sync(0xFFFFFFFFu, w, 24));
      if (lane < 16) *reinterpret_cast<uint4*>(p.scale.p + (r0 + lane) * p.scale.cols + c0 / 16) = row;
    } else if (valid && (lane & 1) == 0) {
      for (int i = 0; i < 16; ++i) store_scale<Swz>(p.scale, r0 + i, c / 16, s);
    }
    // The columnwise copy: columns 8 l + j, rows 0..7 and 8..15 of the warp.
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) lo[i] = q16[i], hi[i] = q16[8 + i];
    transpose8x8_nibbles(lo);
    transpose8x8_nibbles(hi);
#pragma unroll
    for (int j = 0; j < 8; ++j) s_t[t_unit(j, lane, warp)] = make_uint2(lo[j], hi[j]);
    if ((lane & 1) == 0) s_sc[warp][lane / 2] = s;
  }
  __syncthreads();
  // Warp j writes column 8 l + j of the span (lane l).
  const int j = warp, nb = band.nrows / 16;
  const int64_t cc = c0 + 8 * lane + j;
  if (cc >= cols) return;
  uint8_t* dst = p.data_col + (cols * gr0 + cc * grows + rr0) / 2;  // 8-byte aligned
  const bool al16 = (reinterpret_cast<uintptr_t>(dst) & 15) == 0;
#pragma unroll
  for (int w = 0; w < 8; w += 2) {
    if (w >= nb) break;
    const uint2 a = s_t[t_unit(j, lane, w)];
    if (w + 1 < nb) {
      const uint2 b = s_t[t_unit(j, lane, w + 1)];
      if (al16) {
        __stcs(reinterpret_cast<uint4*>(dst + 8 * w), make_uint4(a.x, a.y, b.x, b.y));
      } else {
        *reinterpret_cast<uint2*>(dst + 8 * w) = a;
        *reinterpret_cast<uint2*>(dst + 8 * w + 8) = b;
      }
    } else {
      *reinterpret_cast<uint2*>(dst + 8 * w) = a;
    }
  }
  // Scales: column cc lies in tile lane / 2 of every warp's 16 rows.
  if (p.scale_col_swizzled) {
    for (int w = 0; w < nb; ++w)
      p.scale_col[swizzled_offset(cc, rr0 / 16 + w, round_up(p.rows / 16, 4))] = s_sc[w][lane / 2];
  } else {
    uint8_t* sdst = p.scale_col + cols * gr0 / 16 + cc * (grows / 16) + rr0 / 16;
    if (nb == 8 && (reinterpret_cast<uintptr_t>(sdst) & 7) == 0) {
      uint32_t w2[2] = {0, 0};
#pragma unroll
      for (int w = 0; w < 8; ++w) w2[w / 4] |= uint32_t(s_sc[w][lane / 2]) << (8 * (w % 4));
      *reinterpret_cast<uint2*>(sdst) = make_uint2(w2[0], w2[1]);
    } else {
      for (int w = 0; w < nb; ++w) sdst[w] = s_sc[w][lane / 2];
    }
  }
}

}  // namespace

bool launch_nvfp4_2d_both(const InputRef& in, const Nvfp4TileParams& p, cudaStream_t st) {
  const int64_t nspans = (p.cols + 255) / 256;
  if (!in.bf16 || p.cols % 16 != 0 || (reinterpret_cast<uintptr_t>(in.p) & 15) != 0 || p.sr.on ||
      p.nbands * nspans >= (int64_t(1) << 31))
    return false;
  if (p.nbands == 0 || p.cols == 0) return true;
  const auto* x = static_cast<const uint16_t*>(in.p);
  const unsigned grid = unsigned(p.nbands * nspans);
  if (p.scale.swizzled)
    nvfp4_2d_both_bf16_kernel<true><<<grid, 256, 0, st>>>(x, p, nspans);
  else
    nvfp4_2d_both_bf16_kernel<false><<<grid, 256, 0, st>>>(x, p, nspans);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace lockstep::cuda::detail
