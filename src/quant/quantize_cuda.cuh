// Internals shared by the CUDA quantizer kernels: input loaders (16 consecutive elements of a row
// widened to fp32), NaN-aware amax reductions, element encoders and the kernel parameter blocks.
// All scalar arithmetic goes through numerics/ (block_rules.h, codecs.h, fast_codecs.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/fast_codecs.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/numerics/transcendental.h"
#include "lockstep/quant/scale_access.h"
#include "quantize_cuda_params.h"

namespace lockstep::cuda::detail {

constexpr uint32_t kCanonicalNan = 0x7FC00000u;
// Device-usable copies of the codec descriptors (device code cannot reference num::kE2M1 & co).
#define kFmtE2M1 (num::MiniFloat{2, 1, 0x7u, 0x7u, false, false})
#define kFmtE4M3 (num::MiniFloat{4, 3, 0x7Eu, 0x7Fu, true, false})
#define kFmtE5M2 (num::MiniFloat{5, 2, 0x7Bu, 0x7Fu, true, true})
__device__ __forceinline__ float nan_f32() { return __uint_as_float(kCanonicalNan); }

// ---- loaders: v[0..15] = x[r, c0 .. c0+15] as fp32; elements at or past `n` read as NaN -------
// (NaN is the identity of the amax fold, and those elements are never stored.)
struct LoadBf16 {
  const uint16_t* p;
  int64_t cols;
  bool vec;  // cols % 16 == 0: rows start 32-byte aligned, so 16-byte vector loads are legal
  __device__ __forceinline__ void load(int64_t r, int64_t c0, int n, float v[16]) const {
    const uint16_t* q = p + r * cols + c0;
    if (vec && n == 16) {
      uint4 a = *reinterpret_cast<const uint4*>(q);
      uint4 b = *reinterpret_cast<const uint4*>(q + 8);
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = i < n ? num::bf16_to_f32(q[i]) : nan_f32();
    }
  }
};

struct LoadF32 {
  const float* p;
  int64_t cols;
  bool vec;
  __device__ __forceinline__ void load(int64_t r, int64_t c0, int n, float v[16]) const {
    const float* q = p + r * cols + c0;
    if (vec && n == 16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float4 a = *reinterpret_cast<const float4*>(q + 4 * i);
        v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = i < n ? q[i] : nan_f32();
    }
  }
};

// Producer fusion 1: output row r is input row src[r] (src[r] < 0: a padding row of zeros). An
// index at or past `tokens` traps (the device cannot throw; the CPU path throws QuantError).
template <class Inner>
struct LoadGather {
  Inner in;
  const int32_t* src;
  int64_t tokens;
  __device__ __forceinline__ int32_t source(int64_t r) const {
    const int32_t s = src[r];
    if (s >= tokens) __trap();
    return s;
  }
  __device__ __forceinline__ void load(int64_t r, int64_t c0, int n, float v[16]) const {
    const int32_t s = source(r);
    if (s < 0) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = i < n ? 0.0f : nan_f32();
      return;
    }
    in.load(s, c0, n, v);
  }
};

// Producer fusion 2: x[r, c] = swiglu_weighted(gate[r, c], up[r, c], prob[r]) with the FC1 output
// [rows, 2H] holding gate in columns [0, H) and up in [H, 2H) (`in` indexes that [rows, 2H]
// matrix).
template <class Inner>
struct LoadSwiglu {
  Inner in;
  const float* prob;
  int64_t half;  // H
  __device__ __forceinline__ void load(int64_t r, int64_t c0, int n, float v[16]) const {
    float g[16], u[16];
    in.load(r, c0, n, g);
    in.load(r, c0 + half, n, u);
    const float pr = prob[r];
#pragma unroll
    for (int i = 0; i < 16; ++i)
      v[i] = i < n ? num::swiglu_weighted_f32(g[i], u[i], pr) : nan_f32();
  }
};

// ---- reductions --------------------------------------------------------------------------------
__device__ __forceinline__ float amax16(const float v[16]) {
  float a = num::amax_empty();
#pragma unroll
  for (int i = 0; i < 16; ++i) a = num::amax_fold_fast(a, v[i]);
  return a;
}

__device__ __forceinline__ float warp_fmax(float a, int width = 32) {
  for (int o = 1; o < width; o <<= 1) a = num::fmax_f32(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  return a;
}

// fmax over the CTA (blockDim.x a multiple of 32); every thread gets the result. NaN is canonical.
__device__ __forceinline__ float block_fmax(float a, float* red /* [32] shared */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  a = warp_fmax(a);
  if (lane == 0) red[warp] = a;
  __syncthreads();
  if (warp == 0) {
    float b = lane < nw ? red[lane] : nan_f32();
    b = warp_fmax(b);
    if (lane == 0) red[32] = b;
  }
  __syncthreads();
  const float r = red[32];
  return num::is_nan(r) ? nan_f32() : r;
}

// Domain amax as an order-independent integer key: 0 = nothing but NaN seen, else bits(|x|) + 1
// (|x| >= 0, so the integer order of the bits is the float order).
__device__ __forceinline__ uint32_t amax_key(float a) {
  return num::is_nan(a) ? 0u : __float_as_uint(a) + 1u;
}
// Finish a key: the amax, NaN for a non-empty domain of only NaN, 0 for an empty domain.
__device__ __forceinline__ float amax_from_key(uint32_t k, bool nonempty) {
  if (k != 0) return __uint_as_float(k - 1u);
  return nonempty ? nan_f32() : 0.0f;
}

// ---- stochastic rounding words -----------------------------------------------------------------
// The Philox words of the N consecutive elements idx0 .. idx0 + N - 1 (N % 4 == 0): contract 1.1
// gives element i word i % 4 of the call for quad i / 4, so an aligned run takes N / 4 calls and
// any other run N / 4 + 1 (then each word is picked with compile-time indices: no local memory).
template <int N>
__device__ __forceinline__ void sr_words(const SrParams& sr, uint64_t idx0, uint32_t (&w)[N]) {
  static_assert(N % 4 == 0, "whole quads");
  const uint64_t q0 = idx0 >> 2;
  const uint32_t s = uint32_t(idx0) & 3u;
  uint32_t a[N + 4];
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const num::Philox4x32 r = num::philox_quad_words(sr.seed, sr.stream, q0 + uint64_t(q));
#pragma unroll
    for (int j = 0; j < 4; ++j) a[4 * q + j] = r.v[j];
  }
  if (s == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = a[i];
    return;
  }
  const num::Philox4x32 r = num::philox_quad_words(sr.seed, sr.stream, q0 + uint64_t(N / 4));
#pragma unroll
  for (int j = 0; j < 4; ++j) a[N + j] = r.v[j];
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = s == 1u ? a[i + 1] : (s == 2u ? a[i + 2] : a[i + 3]);
}

// ---- element encoding --------------------------------------------------------------------------

// Pack 16 scaled values v[i] * f into 8 E2M1 bytes (two uint32), RNE or stochastic (element i of
// the run has index idx0 + i).
__device__ __forceinline__ uint2 encode_e2m1x16(const float v[16], float f, const SrParams& sr,
                                                uint64_t idx0) {
  uint32_t w[2] = {0, 0};
  if (!sr.on) {
#pragma unroll
    for (int i = 0; i < 16; i += 2)
      w[i / 8] |= uint32_t(num::encode_e2m1x2_fast(num::mul_rn(v[i], f), num::mul_rn(v[i + 1], f)))
                  << (8 * ((i / 2) % 4));
    return make_uint2(w[0], w[1]);
  }
  uint32_t r[16];
  sr_words(sr, idx0, r);
#pragma unroll
  for (int i = 0; i < 16; ++i)
    w[i / 8] |= uint32_t(num::encode_minifloat_stochastic(kFmtE2M1, num::mul_rn(v[i], f), r[i]))
                << (4 * (i % 8));
  return make_uint2(w[0], w[1]);
}

// 16 scaled values to 16 E4M3 or E5M2 bytes (RNE or stochastic, as encode_e2m1x16).
__device__ __forceinline__ uint4 encode_fp8x16(const float v[16], float f, bool e5m2,
                                               const SrParams& sr, uint64_t idx0) {
  uint32_t w[4] = {0, 0, 0, 0};
  if (!sr.on) {
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const float a = num::mul_rn(v[i], f), b = num::mul_rn(v[i + 1], f);
      const uint32_t pair = e5m2 ? num::encode_e5m2x2_fast(a, b) : num::encode_e4m3x2_fast(a, b);
      w[i / 4] |= pair << (16 * ((i / 2) % 2));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
  uint32_t r[16];
  sr_words(sr, idx0, r);
  const num::MiniFloat m = e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
#pragma unroll
  for (int i = 0; i < 16; ++i)
    w[i / 4] |= uint32_t(num::encode_minifloat_stochastic(m, num::mul_rn(v[i], f), r[i]))
                << (8 * (i % 4));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Calls f with the plain loader of `in` (bf16 or fp32): the launchers' one dispatch on the input
// type.
template <class F>
void with_loader(const InputRef& in, F&& f) {
  const bool vec = in.cols % 16 == 0;
  if (in.bf16)
    f(LoadBf16{static_cast<const uint16_t*>(in.p), in.cols, vec});
  else
    f(LoadF32{static_cast<const float*>(in.p), in.cols, vec});
}

}  // namespace lockstep::cuda::detail
