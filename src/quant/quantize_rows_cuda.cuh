// The row quantizer kernel: one CTA per row, 16-element chunks per thread, rows up to
// kRegChunks * blockDim.x chunks held in registers between the amax pass and the encode pass (so
// per-row amax needs no second read of the input). One kernel serves NVFP4 (1-D blocks), MXFP8
// rowwise and FP8 (per tensor / row / group / 1x128 / 128x128); the loader decides where the
// elements come from (plain fp32/bf16, gathered rows, weighted SwiGLU).
#pragma once

#include "quantize_cuda.cuh"

namespace lockstep::cuda::detail {



template <RowFmt F>
__device__ __forceinline__ void row_process_chunk(const RowParams& p, int64_t r, int b, const float v[16], float cam,
                                                  float rowA, const num::TwoLevelOuter& outer) {
  const bool valid = b < p.nchunks;
  const int64_t c0 = int64_t(b) * 16;
  const int lane = threadIdx.x & 31;
  const uint64_t idx0 = uint64_t(r * p.cols + c0);
  if constexpr (F == RowFmt::kNvfp4) {
    if (!valid) return;
    const uint8_t s = num::two_level_block_scale(cam, outer);
    const float enc = num::two_level_encode_factor(s, outer);
    const uint2 q = encode_e2m1x16(v, enc, p.sr, idx0);
    *reinterpret_cast<uint2*>(p.data + (r * p.cols + c0) / 2) = q;
    p.scale.store(r, b, s);
  } else if constexpr (F == RowFmt::kMxfp8) {
    const float bam = num::fmax_f32(cam, __shfl_xor_sync(0xFFFFFFFFu, cam, 1));  // block of 32 = 2 chunks
    if (!valid) return;
    const uint8_t e = num::mx_block_exponent(bam, p.elem_max);
    const uint4 q = encode_fp8x16(v, num::mx_encode_factor(e), p.e5m2, p.sr, idx0);
    *reinterpret_cast<uint4*>(p.data + r * p.cols + c0) = q;
    if ((b & 1) == 0) p.scale.store(r, b / 2, e);
  } else {
    float scale;
    if (p.amax_mode == kAmaxLanes8) {
      float a = cam;  // 1x128: chunks b .. b+7 of an aligned group of 8 lanes
      for (int o = 1; o < 8; o <<= 1) a = num::fmax_f32(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
      if (!valid) return;
      a = num::is_nan(a) ? nan_f32() : a;
      scale = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
      if ((lane & 7) == 0) p.scale_inv_out[r * p.tile_cols + b / 8] = num::fp8_scale_inv(scale);
    } else if (p.amax_mode == kAmaxRow) {
      if (!valid) return;
      scale = num::fp8_scale(rowA, p.elem_max, p.eps, p.type_max, p.pow2);
    } else {
      if (!valid) return;
      int64_t d = 0;
      if (p.dom_kind == kDomGroup) d = group_of_row(p.offsets, p.groups, r);
      else if (p.dom_kind == kDomTile128) d = (r / 128) * p.tile_cols + c0 / 128;
      scale = p.dom_val[d];
    }
    const int n = int(p.cols - c0 < 16 ? p.cols - c0 : 16);
    if (n == 16 && (p.cols & 15) == 0) {
      *reinterpret_cast<uint4*>(p.data + r * p.cols + c0) = encode_fp8x16(v, scale, p.e5m2, p.sr, idx0);
    } else {
      for (int i = 0; i < n; ++i) {
        const float x = num::mul_rn(v[i], scale);
        const num::MiniFloat m = p.e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
        p.data[r * p.cols + c0 + i] =
            p.sr.on ? num::encode_minifloat_stochastic(m, x, num::philox_element_word(p.sr.seed, p.sr.stream, idx0 + i))
                    : num::encode_minifloat(m, x);
      }
    }
  }
}

template <class Loader, RowFmt F>
__global__ void __launch_bounds__(256) quantize_rows_kernel(Loader ld, RowParams p) {
  __shared__ float red[33];
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x, T = blockDim.x;
  const int iters = (p.nchunks + T - 1) / T;
  float v[kRegChunks][16];
  float cam[kRegChunks];
  float acc = num::amax_empty();
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i) {
    cam[i] = num::amax_empty();
    if (i < iters) {
      const int b = t + i * T;
      if (b < p.nchunks) {
        const int64_t c0 = int64_t(b) * 16;
        ld.load(r, c0, int(p.cols - c0 < 16 ? p.cols - c0 : 16), v[i]);
        cam[i] = amax16(v[i]);
        acc = num::fmax_f32(acc, cam[i]);
      }
    }
  }
  float rowA = 0.0f;
  num::TwoLevelOuter outer{};
  if (p.amax_mode == kAmaxRow) {
    for (int i = kRegChunks; i < iters; ++i) {
      const int b = t + i * T;
      if (b < p.nchunks) {
        float tmp[16];
        const int64_t c0 = int64_t(b) * 16;
        ld.load(r, c0, int(p.cols - c0 < 16 ? p.cols - c0 : 16), tmp);
        acc = num::fmax_f32(acc, amax16(tmp));
      }
    }
    rowA = block_fmax(acc, red);
    if (t == 0) {
      if constexpr (F == RowFmt::kNvfp4) p.amax_out[r] = rowA;
      if constexpr (F == RowFmt::kFp8)
        p.scale_inv_out[r] = num::fp8_scale_inv(num::fp8_scale(rowA, p.elem_max, p.eps, p.type_max, p.pow2));
    }
  } else if constexpr (F == RowFmt::kNvfp4) {
    int64_t d = 0;
    if (p.dom_kind == kDomGroup) d = group_of_row(p.offsets, p.groups, r);
    rowA = p.dom_val[d];
  }
  if constexpr (F == RowFmt::kNvfp4) outer = num::two_level_outer(rowA, num::kE2M1Max);
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i)
    if (i < iters) row_process_chunk<F>(p, r, t + i * T, v[i], cam[i], rowA, outer);
  for (int i = kRegChunks; i < iters; ++i) {
    const int b = t + i * T;
    float tmp[16];
    float ca = num::amax_empty();
    if (b < p.nchunks) {
      const int64_t c0 = int64_t(b) * 16;
      ld.load(r, c0, int(p.cols - c0 < 16 ? p.cols - c0 : 16), tmp);
      ca = amax16(tmp);
    }
    row_process_chunk<F>(p, r, b, tmp, ca, rowA, outer);
  }
}

// Threads per CTA for a row of `nchunks` chunks: enough for kRegChunks chunks each, 32..256.
inline int row_threads(int64_t nchunks) {
  int64_t t = (nchunks + kRegChunks - 1) / kRegChunks;
  t = (t + 31) / 32 * 32;
  return int(t < 32 ? 32 : (t > 256 ? 256 : t));
}

}  // namespace lockstep::cuda::detail
