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

// ---- the specialized row kernel ------------------------------------------------------------------
// quantize_rows_kernel with every runtime choice made at compile time, for the common case: bf16
// rows (plain or gathered), cols % 16 == 0, round to nearest, E4M3 elements (FP8/MXFP8), the whole
// row in registers (nchunks <= kRegChunks * 256). The row is held as packed bf16 (8 registers per
// 16-element chunk instead of 16), so the kernel fits 64 registers (8 CTAs of 128 threads per SM).
// Same arithmetic as quantize_rows_kernel, element by element (the harness compares bytes).
struct RawChunk {
  uint4 a, b;
};

// Start of row r's bf16 elements, or nullptr for a zero row (a gather padding row).
__device__ __forceinline__ const uint16_t* raw_row(const LoadBf16& ld, int64_t r) { return ld.p + r * ld.cols; }
__device__ __forceinline__ const uint16_t* raw_row(const LoadGather<LoadBf16>& ld, int64_t r) {
  const int32_t s = ld.src[r];
  return s < 0 ? nullptr : ld.in.p + int64_t(s) * ld.in.cols;
}

__device__ __forceinline__ void unpack16(const RawChunk& x, float v[16]) {
  const uint32_t w[8] = {x.a.x, x.a.y, x.a.z, x.a.w, x.b.x, x.b.y, x.b.z, x.b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// 16 scaled values v[i] * f to 8 E2M1 bytes, RNE (encode_e2m1_arith per element).
__device__ __forceinline__ uint2 encode_e2m1x16_rn(const float v[16], float f) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i) w[i / 8] |= num::encode_e2m1_arith(num::mul_rn(v[i], f)) << (4 * (i % 8));
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ uint4 encode_e4m3x16_rn(const float v[16], float f) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = uint32_t(num::encode_e4m3x2_fast(num::mul_rn(v[4 * i], f), num::mul_rn(v[4 * i + 1], f))) |
           (uint32_t(num::encode_e4m3x2_fast(num::mul_rn(v[4 * i + 2], f), num::mul_rn(v[4 * i + 3], f))) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <bool Swz>
__device__ __forceinline__ void store_scale(const ScaleOut& s, int64_t r, int64_t c, uint8_t code) {
  s.p[Swz ? swizzled_offset_d(r, c, s.padded_cols) : r * s.cols + c] = code;
}

// F and Mode: (kNvfp4, kAmaxRow | kAmaxDomain), (kMxfp8, kAmaxDomain), (kFp8, kAmaxRow | kAmaxDomain |
// kAmaxLanes8). Swz: swizzled block scales (NVFP4 / MXFP8).
template <class Loader, RowFmt F, int Mode, bool Swz>
__global__ void __launch_bounds__(256, 4) quantize_rows_fast_kernel(Loader ld, RowParams p) {
  __shared__ float red[33];
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x, T = blockDim.x;
  const uint16_t* rowp = raw_row(ld, r);
  RawChunk x[kRegChunks];
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i) {
    const int b = t + i * T;
    if (rowp != nullptr && b < p.nchunks) {
      const uint4* q = reinterpret_cast<const uint4*>(rowp + int64_t(b) * 16);
      x[i].a = q[0];
      x[i].b = q[1];
    } else {
      x[i].a = make_uint4(0, 0, 0, 0);
      x[i].b = make_uint4(0, 0, 0, 0);
    }
  }
  float cam[kRegChunks];
  float acc = num::amax_empty();
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i) {
    cam[i] = num::amax_empty();
    if (t + i * T < p.nchunks) {
      float v[16];
      unpack16(x[i], v);
      cam[i] = amax16(v);
      acc = num::fmax_f32(acc, cam[i]);
    }
  }
  float rowA = 0.0f;
  if constexpr (Mode == kAmaxRow) {
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
  if constexpr (F == RowFmt::kNvfp4) {
    const num::TwoLevelOuter outer = num::two_level_outer(rowA, num::kE2M1Max);
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
      const int b = t + i * T;
      if (b >= p.nchunks) continue;
      const int64_t c0 = int64_t(b) * 16;
      const uint8_t s = num::two_level_block_scale_fast(cam[i], outer);
      const float enc = num::two_level_encode_factor(s, outer);
      float v[16];
      unpack16(x[i], v);
      *reinterpret_cast<uint2*>(p.data + (r * p.cols + c0) / 2) = encode_e2m1x16_rn(v, enc);
      store_scale<Swz>(p.scale, r, b, s);
    }
  } else if constexpr (F == RowFmt::kMxfp8) {
    const float inv_max = num::div_rn(1.0f, p.elem_max);
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
      const int b = t + i * T;
      const float bam = num::fmax_f32(cam[i], __shfl_xor_sync(0xFFFFFFFFu, cam[i], 1));  // block of 32 = 2 chunks
      if (b >= p.nchunks) continue;
      const uint8_t e = num::encode_e8m0(num::mul_rn(bam, inv_max));  // num::mx_block_exponent
      float v[16];
      unpack16(x[i], v);
      *reinterpret_cast<uint4*>(p.data + r * p.cols + int64_t(b) * 16) = encode_e4m3x16_rn(v, num::mx_encode_factor(e));
      if ((b & 1) == 0) store_scale<Swz>(p.scale, r, b / 2, e);
    }
  } else {
    const int lane = t & 31;
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
      const int b = t + i * T;
      float scale;
      if constexpr (Mode == kAmaxLanes8) {
        float a = cam[i];  // 1x128: chunks b .. b+7 of an aligned group of 8 lanes
        for (int o = 1; o < 8; o <<= 1) a = num::fmax_f32(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
        if (b >= p.nchunks) continue;
        a = num::is_nan(a) ? nan_f32() : a;
        scale = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
        if ((lane & 7) == 0) p.scale_inv_out[r * p.tile_cols + b / 8] = num::fp8_scale_inv(scale);
      } else if constexpr (Mode == kAmaxRow) {
        if (b >= p.nchunks) continue;
        scale = num::fp8_scale(rowA, p.elem_max, p.eps, p.type_max, p.pow2);
      } else {
        if (b >= p.nchunks) continue;
        int64_t d = 0;
        if (p.dom_kind == kDomGroup) d = group_of_row(p.offsets, p.groups, r);
        else if (p.dom_kind == kDomTile128) d = (r / 128) * p.tile_cols + b / 8;
        scale = p.dom_val[d];
      }
      float v[16];
      unpack16(x[i], v);
      *reinterpret_cast<uint4*>(p.data + r * p.cols + int64_t(b) * 16) = encode_e4m3x16_rn(v, scale);
    }
  }
}

}  // namespace lockstep::cuda::detail
