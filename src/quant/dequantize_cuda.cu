// CUDA dequantizer kernel of rowwise and MXFP8 columnwise copies (CONTRACT.md sections 2-4): one
// thread per 16-element chunk, scales read from the compact or swizzled layout, the same rounding
// steps as the CPU reference (numerics/block_rules.h). Transposed copies: quantize_colwise_cuda.cu.
#include "../tensor/cuda_util.h"
#include "quantize_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

// The n values of o to the output at element `at`: fp32, or bf16 (RNE of the fp32 value).
__device__ __forceinline__ void store(const DequantParams& p, int64_t at, const float (&o)[16], int n) {
  for (int i = 0; i < n; ++i) {
    if (p.out_bf16) p.out_bf16[at + i] = num::f32_to_bf16(o[i]);
    else p.out_f32[at + i] = o[i];
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
    if (p.scaling == Scaling::kPerRow) d = r;
    else if (p.scaling == Scaling::kPerGroup) d = group_of_row(p.offsets, p.groups, r);
    const float s_dec = num::two_level_outer(p.amax[d], num::kE2M1Max).s_dec;
    const uint8_t s = p.scale.load(r, c0 / 16);
    const uint8_t* q = p.data + (r * p.cols + c0) / 2;
    for (int i = 0; i < 16; ++i) {
      const uint8_t byte = q[i / 2];
      o[i] = num::two_level_dequant(num::decode_e2m1((i & 1) ? (byte >> 4) : (byte & 0xF)), s, s_dec);
    }
    store(p, r * p.cols + c0, o, n);
    return;
  }
  const num::MiniFloat m = p.e5m2 ? num::MiniFloat(kFmtE5M2) : num::MiniFloat(kFmtE4M3);
  const uint8_t* q = p.data + r * p.cols + c0;
  if (p.format == Format::kMxfp8) {
    for (int i = 0; i < n; ++i) {
      const uint8_t e = p.colwise ? p.scale_col[(r / 32) * p.cols + c0 + i] : p.scale.load(r, (c0 + i) / 32);
      o[i] = num::mx_dequant(num::decode_minifloat(m, q[i]), e);
    }
    store(p, r * p.cols + c0, o, n);
    return;
  }
  for (int i = 0; i < n; ++i) {
    const int64_t c = c0 + i;
    int64_t si;
    switch (p.scaling) {
      case Scaling::kBlock1x128: si = r * p.scale_inv_cols + c / 128; break;
      case Scaling::kBlock128x128: si = r / 128 * p.scale_inv_cols + c / 128; break;
      case Scaling::kPerRow: si = r; break;
      case Scaling::kPerGroup: si = group_of_row(p.offsets, p.groups, r); break;
      default: si = 0; break;
    }
    o[i] = num::mul_rn(num::decode_minifloat(m, q[i]), p.scale_inv[si]);
  }
  store(p, r * p.cols + c0, o, n);
}

}  // namespace

void launch_dequantize(const DequantParams& p, cudaStream_t st) {
  const int64_t n = p.rows * p.nchunks;
  if (n == 0) return;
  dequantize_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda::detail
