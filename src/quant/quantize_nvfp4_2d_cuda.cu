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
__device__ __forceinline__ int t_unit(int j, int l, int w) {
  return (j * 32 + l) * 8 + (w ^ ((l >> 1) & 7));
}

// CTA = one band (<= 128 rows of one group, a multiple of 16) x 256 columns, 8 warps. Warp w:
// rows [16 w, 16 w + 16) of the band as quantize_nvfp4_2d_bf16_kernel's unit (lane l holds columns
// 8 l .. 8 l + 7 of all 16 rows: the 16x16 tile is lanes 2m, 2m + 1), the rowwise codes stored
// from registers (a warp writes 128 contiguous bytes per row); the lane's 16 code words transposed
// as two 8x8 nibble matrices into 8 columns x 16 rows, staged in shared memory. Then warp j writes
// columns 8 l + j (lane l): the band's nrows / 2 code bytes of that column of X_g^T (16-byte
// stores) and its nrows / 16 scale bytes. Bands are taken back to front (the amax pass before read
// the input front to back).
template <bool Swz>
__global__ void __launch_bounds__(256, 2)
    nvfp4_2d_both_bf16_kernel(const uint16_t* __restrict__ x, Nvfp4TileParams p, int64_t nspans) {
  __shared__ uint2 s_t[8 * 32 * 8];
  __shared__ uint8_t s_sc[8][16];  // [warp][tile]: the tile scales of the band
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t span = int64_t(blockIdx.x) % nspans;
  const RowBand band = p.bands[p.nbands - 1 - int64_t(blockIdx.x) / nspans];
  const int64_t cols = p.cols, c0 = span * 256;
  const int64_t g = band.group, gr0 = p.offsets[g], grows = p.offsets[g + 1] - gr0;
  const int64_t rr0 = band.row0 - gr0;
  const bool active = 16 * warp < band.nrows;  // warp-uniform
  const int64_t r0 = band.row0 + 16 * warp;
  if (active) {
    uint32_t q16[16];
    const uint8_t s =
        nvfp4_2d_unit<Swz>(x, p, r0, c0, p.dom_val[p.dom_kind == kDomGroup ? g : 0], q16);
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
