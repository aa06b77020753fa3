// The row quantizer kernel: one CTA per row, 16-element chunks per thread, rows up to
// kRegChunks * blockDim.x chunks held in registers between the amax pass and the encode pass (so
// per-row amax needs no second read of the input). One kernel serves NVFP4 (1-D blocks), MXFP8
// rowwise and FP8 (per tensor / row / group / 1x128 / 128x128); the loader decides where the
// elements come from (plain fp32/bf16, gathered rows, weighted SwiGLU).
#pragma once

#include "quantize_cuda.cuh"

namespace lockstep::cuda::detail {

template <RowFmt F>
__device__ __forceinline__ void row_process_chunk(const RowParams& p, int64_t r, int b,
                                                  const float v[16], float cam, float rowA,
                                                  const num::TwoLevelOuter& outer) {
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
    const float bam =
        num::fmax_f32(cam, __shfl_xor_sync(0xFFFFFFFFu, cam, 1));  // block of 32 = 2 chunks
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
      if (p.dom_kind == kDomGroup)
        d = group_of_row(p.offsets, p.groups, r);
      else if (p.dom_kind == kDomTile128)
        d = (r / 128) * p.tile_cols + c0 / 128;
      scale = p.dom_val[d];
    }
    const int n = int(p.cols - c0 < 16 ? p.cols - c0 : 16);
    if (n == 16 && (p.cols & 15) == 0) {
      *reinterpret_cast<uint4*>(p.data + r * p.cols + c0) =
          encode_fp8x16(v, scale, p.e5m2, p.sr, idx0);
    } else {
      uint32_t rw[16] = {};
      if (p.sr.on) sr_words(p.sr, idx0, rw);
      const num::MiniFloat m = p.e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        if (i >= n) break;
        const float x = num::mul_rn(v[i], scale);
        p.data[r * p.cols + c0 + i] =
            p.sr.on ? num::encode_minifloat_stochastic(m, x, rw[i]) : num::encode_minifloat(m, x);
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
        p.scale_inv_out[r] =
            num::fp8_scale_inv(num::fp8_scale(rowA, p.elem_max, p.eps, p.type_max, p.pow2));
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

// Threads per CTA for a row of `nchunks` chunks: enough for kRegChunks chunks each, 32..256. With
// fewer than kFewRows rows (a decode step) a thread takes one chunk, up to 256 threads, so that a
// lone row is not the serial work of one warp on one SM. Bytes never depend on the thread count:
// chunks encode independently and the row amax is an exact max.
inline constexpr int64_t kFewRows = 128;
inline int row_threads(int64_t nchunks, int64_t rows) {
  const int64_t per = rows < kFewRows ? 1 : kRegChunks;
  int64_t t = (nchunks + per - 1) / per;
  t = (t + 31) / 32 * 32;
  return int(t < 32 ? 32 : (t > 256 ? 256 : t));
}

// ---- the specialized row kernel
// ------------------------------------------------------------------ quantize_rows_kernel with
// every runtime choice made at compile time, for the common case: bf16 rows (plain or gathered),
// cols % 16 == 0, round to nearest, E4M3 elements (FP8/MXFP8), the whole row in registers (nchunks
// <= kRegChunks * 256). The row is held as packed bf16 (8 registers per 16-element chunk instead of
// 16), so the kernel fits 64 registers (8 CTAs of 128 threads per SM). Same arithmetic as
// quantize_rows_kernel, element by element (the harness compares bytes).
struct RawChunk {
  uint4 a, b;
};

// Start of row r's bf16 elements; a gather padding row reads a row of zeros (never a null pointer,
// so the kernels load unconditionally and keep no zero-filled copy).
static __device__ const uint16_t kZeroRow[kRegChunks * 256 * 16] = {};
__device__ __forceinline__ const uint16_t* raw_row(const LoadBf16& ld, int64_t r) {
  return ld.p + r * ld.cols;
}
__device__ __forceinline__ const uint16_t* raw_row(const LoadGather<LoadBf16>& ld, int64_t r) {
  const int32_t s = ld.source(r);
  return s < 0 ? kZeroRow : ld.in.p + int64_t(s) * ld.in.cols;
}

__device__ __forceinline__ void unpack16(const RawChunk& x, float v[16]) {
  const uint32_t w[8] = {x.a.x, x.a.y, x.a.z, x.a.w, x.b.x, x.b.y, x.b.z, x.b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// |x| max of 16 packed bf16 as bf16 bits: per-halfword unsigned max of the magnitudes (for
// non-negative bf16 the bit order is the value order). A result above 0x7F80 (inf) means the chunk
// holds a NaN, which the amax must ignore: the caller then takes the fp32 path.
__device__ __forceinline__ uint32_t absmax_bits16(const RawChunk& x) {
  constexpr uint32_t m = 0x7FFF7FFFu;
  const uint32_t a = __vmaxu2(x.a.x & m, x.a.y & m), b = __vmaxu2(x.a.z & m, x.a.w & m);
  const uint32_t c = __vmaxu2(x.b.x & m, x.b.y & m), d = __vmaxu2(x.b.z & m, x.b.w & m);
  const uint32_t e = __vmaxu2(__vmaxu2(a, b), __vmaxu2(c, d));
  return max(e & 0xFFFFu, e >> 16);
}

// The sign bits of 8 bf16 (packed in w0..w3) at bit 3 of nibbles 0..7 (an E2M1 word's sign bits).
__device__ __forceinline__ uint32_t e2m1_signs8(uint32_t w0, uint32_t w1, uint32_t w2,
                                                uint32_t w3) {
  const uint32_t g01 = __byte_perm(w0, w1, 0x7531),
                 g23 = __byte_perm(w2, w3, 0x7531);  // high bytes
  uint32_t ev,
      od;  // byte j: 0xFF where element 2j (ev) / 2j+1 (od) is negative (prmt sign replication)
  asm("prmt.b32 %0, %1, %2, 0xECA8;" : "=r"(ev) : "r"(g01), "r"(g23));
  asm("prmt.b32 %0, %1, %2, 0xFDB9;" : "=r"(od) : "r"(g01), "r"(g23));
  return (ev & 0x08080808u) | (od & 0x80808080u);
}

// 8 packed bf16 (w0..w3) times f to one word of E2M1 codes, RNE, for inputs without NaN: the
// magnitude codes by num::e2m1_code_magic (2^23 + code), packed by shift-adds (Horner, nibble 7
// first; the 2^23 parts add up to the constant kMagic8 modulo 2^32), the sign bits from the inputs
// (RN(x f) has the sign of x: f > 0). Per element: 4 FMA-pipe ops (FMUL, 2 FFMA, FADD), 2 integer
// mins, about 2 more integer ops for unpacking, packing and signs.
__device__ __forceinline__ uint32_t encode_e2m1x8_bf16(uint32_t w0, uint32_t w1, uint32_t w2,
                                                       uint32_t w3, float f) {
  constexpr uint32_t kMagic8 = 0x4B000000u + (0x4B000000u << 4);  // the rest shift out
  const uint32_t w[4] = {w3, w2, w1, w0};
  uint32_t acc = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t hi = num::e2m1_code_magic(num::mul_rn(__uint_as_float(w[j] & 0xFFFF0000u), f));
    const uint32_t lo = num::e2m1_code_magic(num::mul_rn(__uint_as_float(w[j] << 16), f));
    acc = (acc * 16u + hi) * 16u + lo;
  }
  return acc - kMagic8 +
         e2m1_signs8(w0, w1, w2, w3);  // the sign bits are free in the codes: + is |
}

__device__ __forceinline__ uint2 encode_e2m1x16_bf16(const RawChunk& x, float f) {
  return make_uint2(encode_e2m1x8_bf16(x.a.x, x.a.y, x.a.z, x.a.w, f),
                    encode_e2m1x8_bf16(x.b.x, x.b.y, x.b.z, x.b.w, f));
}

// encode_e2m1x16_bf16 with stochastic rounding (CONTRACT.md section 5): element i of the chunk has
// index idx0 + i with idx0 % 4 == 0, so the chunk takes four Philox calls (one per quad, contract
// 1.1); the magnitude codes by num::e2m1_sr_code_magic (0x4B000001 + code), packed by shift-adds
// whose constant parts sum to kBase8 modulo 2^32; the sign bits from the inputs. No NaN among the
// 16 values.
__device__ __forceinline__ uint2 encode_e2m1x16_bf16_sr(const RawChunk& x, float f,
                                                        const num::PhiloxKeys& keys,
                                                        uint32_t stream, uint64_t idx0) {
  constexpr uint32_t kBase8 = uint32_t(0x4B000001ull * 0x11111111ull);
  const uint32_t w[8] = {x.a.x, x.a.y, x.a.z, x.a.w, x.b.x, x.b.y, x.b.z, x.b.w};
  uint32_t acc[2] = {0, 0};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const num::Philox4x32 r = num::philox_quad_words_keyed(keys, stream, (idx0 >> 2) + uint64_t(q));
    const float e[4] = {__uint_as_float(w[2 * q] << 16), __uint_as_float(w[2 * q] & 0xFFFF0000u),
                        __uint_as_float(w[2 * q + 1] << 16),
                        __uint_as_float(w[2 * q + 1] & 0xFFFF0000u)};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      acc[q >> 1] += num::e2m1_sr_code_magic(num::mul_rn(e[j], f), r.v[j])
                     << (4 * (4 * (q & 1) + j));
  }
  return make_uint2(acc[0] - kBase8 + e2m1_signs8(w[0], w[1], w[2], w[3]),
                    acc[1] - kBase8 + e2m1_signs8(w[4], w[5], w[6], w[7]));
}

// 16 scaled values v[i] * f to 8 E2M1 bytes, RNE (encode_e2m1_arith per element).
__device__ __forceinline__ uint2 encode_e2m1x16_rn(const float v[16], float f) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    w[i / 8] |= num::encode_e2m1_arith(num::mul_rn(v[i], f)) << (4 * (i % 8));
  return make_uint2(w[0], w[1]);
}

// The sign bits of 8 fp32 values at bit 3 of nibbles 0..7 (as e2m1_signs8 for bf16): bytes of 0xFF
// or 0 by prmt sign replication of each value's top byte, even elements (ev) and odd ones (od).
__device__ __forceinline__ uint32_t e2m1_signs8_f32(const float v[8]) {
  auto rep2 = [](float a, float b) {  // bytes 0, 1: sign of a, b replicated
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, 0xFB;" : "=r"(r) : "r"(__float_as_uint(a)), "r"(__float_as_uint(b)));
    return r;
  };
  const uint32_t ev = __byte_perm(rep2(v[0], v[2]), rep2(v[4], v[6]), 0x5410);
  const uint32_t od = __byte_perm(rep2(v[1], v[3]), rep2(v[5], v[7]), 0x5410);
  return (ev & 0x08080808u) | (od & 0x80808080u);
}

// 8 fp32 values without NaN times f (> 0) to one word of E2M1 codes (element 0 in nibble 0), RNE:
// encode_e2m1x8_bf16's method (num::e2m1_code_magic, Horner packing, signs from the inputs) on
// fp32 inputs. Equal to encode_e2m1x16_rn's codes for every non-NaN input.
__device__ __forceinline__ uint32_t encode_e2m1x8_f32_nonan(const float v[8], float f) {
  constexpr uint32_t kMagic8 = 0x4B000000u + (0x4B000000u << 4);  // the rest shift out
  uint32_t acc = 0;
#pragma unroll
  for (int j = 7; j >= 0; --j) acc = acc * 16u + num::e2m1_code_magic(num::mul_rn(v[j], f));
  return acc - kMagic8 + e2m1_signs8_f32(v);  // the sign bits are free in the codes: + is |
}

__device__ __forceinline__ uint2 encode_e2m1x16_f32_nonan(const float v[16], float f) {
  return make_uint2(encode_e2m1x8_f32_nonan(v, f), encode_e2m1x8_f32_nonan(v + 8, f));
}

__device__ __forceinline__ uint4 encode_e4m3x16_rn(const float v[16], float f) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] =
        uint32_t(num::encode_e4m3x2_fast(num::mul_rn(v[4 * i], f), num::mul_rn(v[4 * i + 1], f))) |
        (uint32_t(
             num::encode_e4m3x2_fast(num::mul_rn(v[4 * i + 2], f), num::mul_rn(v[4 * i + 3], f)))
         << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <bool Swz>
__device__ __forceinline__ void store_scale(const ScaleOut& s, int64_t r, int64_t c, uint8_t code) {
  s.p[Swz ? swizzled_offset(r, c, s.padded_cols) : r * s.cols + c] = code;
}

// F and Mode: (kMxfp8, kAmaxDomain), (kFp8, kAmaxRow | kAmaxDomain | kAmaxLanes8). Swz: swizzled
// block scales (MXFP8). NVFP4 has its own kernel below.
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
    if (b < p.nchunks) {
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
    if constexpr (F == RowFmt::kFp8)
      if (t == 0)
        p.scale_inv_out[r] =
            num::fp8_scale_inv(num::fp8_scale(rowA, p.elem_max, p.eps, p.type_max, p.pow2));
  }
  if constexpr (F == RowFmt::kMxfp8) {
    const float inv_max = num::div_rn(1.0f, p.elem_max);
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
      const int b = t + i * T;
      const float bam =
          num::fmax_f32(cam[i], __shfl_xor_sync(0xFFFFFFFFu, cam[i], 1));  // block of 32 = 2 chunks
      if (b >= p.nchunks) continue;
      const uint8_t e = num::encode_e8m0(num::mul_rn(bam, inv_max));  // num::mx_block_exponent
      float v[16];
      unpack16(x[i], v);
      *reinterpret_cast<uint4*>(p.data + r * p.cols + int64_t(b) * 16) =
          encode_e4m3x16_rn(v, num::mx_encode_factor(e));
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
        if (p.dom_kind == kDomGroup)
          d = group_of_row(p.offsets, p.groups, r);
        else if (p.dom_kind == kDomTile128)
          d = (r / 128) * p.tile_cols + b / 8;
        scale = p.dom_val[d];
      }
      float v[16];
      unpack16(x[i], v);
      *reinterpret_cast<uint4*>(p.data + r * p.cols + int64_t(b) * 16) =
          encode_e4m3x16_rn(v, scale);
    }
  }
}

// ---- the NVFP4 row kernel --------------------------------------------------------------------
// quantize_rows_fast_kernel's conditions, NVFP4 (kAmaxRow: per row; kAmaxDomain: per tensor / group
// / joint amax given), with the element work cut to what an H200 can issue at copy speed:
// - chunk amax on packed bf16 (absmax_bits16); a chunk holding a NaN takes the fp32 path (amax16,
//   encode_e2m1_arith), the rest encode 8 elements at a time with encode_e2m1x8_bf16;
// - the encode factor of each scale code from a per-row table, the block scale without NaN checks;
// SR: stochastic rounding (p.sr), one Philox call per 4 elements (encode_e2m1x16_bf16_sr).
template <int Mode, bool Swz, bool SR, class Loader>
__device__ __forceinline__ void nvfp4_row(const Loader& ld, const RowParams& p, int64_t r) {
  __shared__ float red[34];
  __shared__ float enc_of[128];
  const int t = threadIdx.x, T = blockDim.x, lane = t & 31, warp = t >> 5;
  const uint16_t* rowp = raw_row(ld, r);
  RawChunk x[kRegChunks];
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i)
    if (t + i * T < p.nchunks) {  // chunks past the row end are never used
      const uint4* q = reinterpret_cast<const uint4*>(rowp + int64_t(t + i * T) * 16);
      x[i].a = q[0];
      x[i].b = q[1];
    }
  // Chunk amax on packed bf16. A thread whose chunks hold a NaN takes the fp32 path for all of
  // them.
  float cam[kRegChunks];
  uint32_t mmax = 0;
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i) {
    // A chunk past the row end has seen nothing: the amax sentinel (NaN, ignored by fmaxf), not 0,
    // or an all-NaN row would reduce to 0 instead of NaN.
    const bool has = t + i * T < p.nchunks;
    const uint32_t m = has ? absmax_bits16(x[i]) : 0u;
    cam[i] = has ? __uint_as_float(m << 16) : num::amax_empty();
    mmax = max(mmax, m);
  }
  const bool nan_path = mmax > 0x7F80u;
  if (__builtin_expect(nan_path, 0)) {
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
      float v[16];
      unpack16(x[i], v);
      cam[i] = t + i * T < p.nchunks ? amax16(v) : num::amax_empty();
    }
  }
  float acc = num::amax_empty();
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i) acc = fmaxf(acc, cam[i]);  // maxNum, as amax_fold_fast
  // Row (or domain) amax, then warp 0 computes the outer scales and the encode factor of every
  // scale code a chunk without NaN can get (0 .. 0x7E) into shared memory, once per row instead of
  // a decode and a division per chunk; one more barrier publishes them. fmaxf (maxNum, one FMNMX)
  // where fmax_f32 spells the same rule out; all-NaN is made canonical below.
  auto warp_max = [](float a) {
    for (int o = 1; o < 32; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    return a;
  };
  if constexpr (Mode == kAmaxRow) {
    acc = warp_max(acc);
    if (lane == 0) red[warp] = acc;
    __syncthreads();
  }
  if (warp == 0) {
    float a;
    if constexpr (Mode == kAmaxRow) {
      a = warp_max(lane < (T >> 5) ? red[lane] : nan_f32());
      a = num::is_nan(a) ? nan_f32() : a;
      if (lane == 0) p.amax_out[r] = a;
    } else {
      int64_t d = 0;
      if (p.dom_kind == kDomGroup) d = group_of_row(p.offsets, p.groups, r);
      a = p.dom_val[d];
    }
    const num::TwoLevelOuter o = num::two_level_outer_e2m1(a);
    for (int k = lane; k < 128; k += 32)
      enc_of[k] = num::two_level_encode_factor_fast(uint8_t(k), o);
    if (lane == 0) red[32] = a, red[33] = o.s_enc_x_inv_max;
  }
  __syncthreads();
  uint8_t* const drow = p.data + r * (p.cols / 2);
  if (__builtin_expect(nan_path, 0)) {
    const num::TwoLevelOuter outer = num::two_level_outer_e2m1(red[32]);
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
      const int b = t + i * T;
      if (b >= p.nchunks) continue;
      const uint8_t s = num::two_level_block_scale_fast(cam[i], outer);
      float v[16];
      unpack16(x[i], v);
      const float f = num::two_level_encode_factor(s, outer);
      *reinterpret_cast<uint2*>(drow + int64_t(b) * 8) =
          SR ? encode_e2m1x16(v, f, p.sr, uint64_t(r * p.cols + int64_t(b) * 16))
             : encode_e2m1x16_rn(v, f);
      store_scale<Swz>(p.scale, r, b, s);
    }
  } else {
    num::TwoLevelOuter outer{};
    outer.s_enc_x_inv_max = red[33];
    [[maybe_unused]] num::PhiloxKeys keys{};
    if constexpr (SR) keys = num::philox_keys(p.sr.seed);
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
      const int b = t + i * T;
      if (b >= p.nchunks) continue;
      const uint8_t s = num::two_level_block_scale_nonan(cam[i], outer);
      if constexpr (SR)
        *reinterpret_cast<uint2*>(drow + int64_t(b) * 8) = encode_e2m1x16_bf16_sr(
            x[i], enc_of[s], keys, p.sr.stream, uint64_t(r * p.cols + int64_t(b) * 16));
      else
        *reinterpret_cast<uint2*>(drow + int64_t(b) * 8) = encode_e2m1x16_bf16(x[i], enc_of[s]);
      store_scale<Swz>(p.scale, r, b, s);
    }
  }
}

// Stochastic rounding holds the round keys and Philox state beside the row: 128 registers, no
// spills.
template <class Loader, int Mode, bool Swz, bool SR>
__global__ void __launch_bounds__(256, SR ? 2 : 4)
    quantize_rows_nvfp4_kernel(Loader ld, RowParams p) {
  nvfp4_row<Mode, Swz, SR>(ld, p, blockIdx.x);
}

}  // namespace lockstep::cuda::detail
