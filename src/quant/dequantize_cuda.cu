// CUDA dequantizer kernels of rowwise and MXFP8 columnwise copies (CONTRACT.md sections 2-4): NVFP4
// rowwise copies by a bandwidth kernel (coalesced 16-byte stores), the other copies one thread per
// 16-element chunk; scales read from the compact or swizzled layout, the same rounding steps as the
// CPU reference (numerics/block_rules.h). Transposed copies: quantize_colwise_cuda.cu.
#include "../tensor/cuda_util.h"
#include "quantize_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

// The n values of o to the output at element `at`: fp32, or bf16 (RNE of the fp32 value).
__device__ __forceinline__ void store(const DequantParams& p, int64_t at, const float (&o)[16],
                                      int n) {
  for (int i = 0; i < n; ++i) {
    if (p.out_bf16)
      p.out_bf16[at + i] = num::f32_to_bf16(o[i]);
    else
      p.out_f32[at + i] = o[i];
  }
}

__global__ void dequantize_kernel(DequantParams p) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= p.rows * p.nchunks) return;
  const int64_t r = k / p.nchunks, c0 = (k % p.nchunks) * 16;
  const int n = int(p.cols - c0 < 16 ? p.cols - c0 : 16);
  float o[16];
  if (p.format == Format::kNvfp4) {
    int64_t d = 0;
    if (p.scaling == Scaling::kPerRow)
      d = r;
    else if (p.scaling == Scaling::kPerGroup)
      d = group_of_row(p.offsets, p.groups, r);
    const float s_dec = num::two_level_outer(p.amax[d], num::kE2M1Max).s_dec;
    const uint8_t s = p.scale.load(r, c0 / 16);
    const uint8_t* q = p.data + (r * p.cols + c0) / 2;
    for (int i = 0; i < 16; ++i) {
      const uint8_t byte = q[i / 2];
      o[i] =
          num::two_level_dequant(num::decode_e2m1((i & 1) ? (byte >> 4) : (byte & 0xF)), s, s_dec);
    }
    store(p, r * p.cols + c0, o, n);
    return;
  }
  const num::MiniFloat m = p.e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
  const uint8_t* q = p.data + r * p.cols + c0;
  if (p.format == Format::kMxfp8) {
    for (int i = 0; i < n; ++i) {
      const uint8_t e =
          p.colwise ? p.scale_col[(r / 32) * p.cols + c0 + i] : p.scale.load(r, (c0 + i) / 32);
      o[i] = num::mx_dequant(num::decode_minifloat(m, q[i]), e);
    }
    store(p, r * p.cols + c0, o, n);
    return;
  }
  for (int i = 0; i < n; ++i) {
    const int64_t c = c0 + i;
    int64_t si;
    switch (p.scaling) {
      case Scaling::kBlock1x128:
        si = r * p.scale_inv_cols + c / 128;
        break;
      case Scaling::kBlock128x128:
        si = r / 128 * p.scale_inv_cols + c / 128;
        break;
      case Scaling::kPerRow:
        si = r;
        break;
      case Scaling::kPerGroup:
        si = group_of_row(p.offsets, p.groups, r);
        break;
      default:
        si = 0;
        break;
    }
    o[i] = num::mul_rn(num::decode_minifloat(m, q[i]), p.scale_inv[si]);
  }
  store(p, r * p.cols + c0, o, n);
}

// ---- NVFP4 rowwise copy, the bandwidth kernel
// ---------------------------------------------------- Per element: 0.5 code bytes + 1/16 scale
// byte in, 4 (fp32) or 2 (bf16) bytes out, so the writes decide. The tensor is a flat array of
// quads (4 elements, 2 code bytes; cols % 16 == 0 keeps a quad inside one row and one block). Warp
// w takes the 256 quads [256 w, 256 w + 256); lane l takes quads 256 w + 32 k + l, k = 0..7: each
// store instruction of the warp writes 512 contiguous bytes of fp32 (256 of bf16) and each code
// load reads 64 contiguous bytes; all 16 loads of a lane are issued before the first use.
constexpr int kDqQuadsPerLane = 8;

// E2M1 code (4 bits) to its fp32 value: magnitudes 2..7 are (m << 22) + bits(0.5), 1 is 0.5.
__device__ __forceinline__ float e2m1_value(uint32_t nib) {
  const uint32_t m = nib & 7u;
  const uint32_t mag = m >= 2u ? (m << 22) + 0x3F000000u : (m == 1u ? 0x3F000000u : 0u);
  return __uint_as_float(mag | ((nib & 8u) << 28));
}

__global__ void __launch_bounds__(256) dequantize_nvfp4_kernel(DequantParams p, int64_t nquads) {
  const int lane = threadIdx.x & 31;
  const int64_t q0 = (int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5)) * (32 * kDqQuadsPerLane) + lane;
  if (q0 >= nquads) return;  // no barrier or shuffle below
  uint32_t code[kDqQuadsPerLane];
  uint8_t sc[kDqQuadsPerLane];
  int64_t row[kDqQuadsPerLane];
  int64_t r = 4 * q0 / p.cols, rs = r * p.cols;  // the current row and its first element
#pragma unroll
  for (int k = 0; k < kDqQuadsPerLane; ++k) {
    const int64_t q = q0 + 32 * k, e = 4 * q;
    row[k] = -1;
    if (q < nquads) {
      while (e >= rs + p.cols) ++r, rs += p.cols;  // quads advance 128 elements: rarely a new row
      row[k] = r;
      code[k] = *reinterpret_cast<const uint16_t*>(p.data + 2 * q);
      sc[k] = p.scale.load(r, (e - rs) / 16);
    }
  }
  int64_t dom = -1;
  float s_dec = 0.0f;
#pragma unroll
  for (int k = 0; k < kDqQuadsPerLane; ++k) {
    if (row[k] < 0) continue;
    int64_t d = 0;
    if (p.scaling == Scaling::kPerRow)
      d = row[k];
    else if (p.scaling == Scaling::kPerGroup)
      d = group_of_row(p.offsets, p.groups, row[k]);
    if (d != dom) s_dec = num::two_level_outer(p.amax[d], num::kE2M1Max).s_dec, dom = d;
    const float ds = num::decode_e4m3_fast(sc[k]);  // the inner product below is exact
    float o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[i] = num::mul_rn(num::mul_rn(e2m1_value(code[k] >> (4 * i)), ds), s_dec);
    const int64_t e = 4 * (q0 + 32 * k);
    if (p.out_f32) {
      *reinterpret_cast<float4*>(p.out_f32 + e) = make_float4(o[0], o[1], o[2], o[3]);
    } else {
      *reinterpret_cast<uint2*>(p.out_bf16 + e) =
          make_uint2(uint32_t(num::f32_to_bf16(o[0])) | (uint32_t(num::f32_to_bf16(o[1])) << 16),
                     uint32_t(num::f32_to_bf16(o[2])) | (uint32_t(num::f32_to_bf16(o[3])) << 16));
    }
  }
}

}  // namespace

void launch_dequantize(const DequantParams& p, cudaStream_t st) {
  const int64_t n = p.rows * p.nchunks;
  if (n == 0) return;
  if (p.format == Format::kNvfp4 && !p.colwise && p.cols % 16 == 0) {
    const int64_t nquads = p.rows * p.cols / 4, per_cta = 8 * 32 * kDqQuadsPerLane;
    dequantize_nvfp4_kernel<<<unsigned((nquads + per_cta - 1) / per_cta), 256, 0, st>>>(p, nquads);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  dequantize_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda::detail
