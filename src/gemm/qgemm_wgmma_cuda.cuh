// Hopper (sm_90a) wgmma primitives and the accumulator epilogue shared by the two wgmma GEMM kernels (qgemm_wgmma_cuda.cu:
// operands dequantized inside the main loop; qgemm_wgmma_tma_cuda.cu: bf16 operands through TMA).
// Internal to src/gemm.
#pragma once

#include <cstdint>

#include "qgemm_cuda.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOCKSTEP_WGMMA 1
#endif

namespace lockstep::cuda::gemm_detail {

__device__ __forceinline__ void wgmma_fence() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() { wgmma_wait<0>(); }
// Shared-memory writes of the generic proxy become visible to wgmma / TMA (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// wgmma shared-memory descriptor of a K-major bf16 tile with 128-byte swizzle: rows of 128 bytes,
// 8-row atoms of 1024 bytes (stride byte offset), start address >> 4 in bits 0-13, leading byte
// offset (unused by this layout) 16 B, layout type 1 (128B swizzle) in bits 62-63. The tile base
// must be 1024-byte aligned; +32 B steps k by 16 inside the 64-wide row.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Byte offset of 16-byte chunk c (0..7, k = 8c .. 8c + 7) of tile row r in the 128-byte swizzled
// layout (the layout TMA's CU_TENSOR_MAP_SWIZZLE_128B writes for a 64-element bf16 box row).
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// Outer scales and the epilogue from the accumulators of one warpgroup's m64 x kBN wgmma tile
// (rows row0 .. row0 + 63 of group G, columns n0 .. n0 + kBN - 1; t = thread in the warpgroup), per
// element the
// steps of epilogue_value (RN(RN(oa * ow) * acc), RN(alpha * .), + bias) in the same order. The
// tile's column outer scales and biases are staged in shared memory (s_ow, s_bias: kBN each), so
// no element waits on a global load; the code is a straight line of a few instructions per element
// (a large unrolled epilogue does not fit the instruction cache and costs more than the main loop).
// acc[4i + q]: row 16 (warp in group) + lane / 4 (+ 8 for q >= 2), column 8i + 2 (lane % 4) + (q & 1).
template <int kBN, bool kBf16Out>
__device__ __forceinline__ void wgmma_epilogue(const float (&acc)[kBN / 2], int64_t row0, int t, int64_t n0,
                                               const GemmGroupDesc& G, const GemmOperandView& a, int64_t n,
                                               const DeviceEpilogue& ep, const GemmOutView& out, float* raw,
                                               const float* s_ow, const float* s_bias) {
  const int lane = t & 31;
  const int64_t rbase = row0 + (t >> 5) * 16 + (lane >> 2);
  const bool full_cols = n0 + kBN <= n && n % 2 == 0;  // pair stores, 4 / 8-byte aligned
  const bool has_bias = ep.bias != nullptr;
  const float alpha = ep.alpha;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = rbase + h * 8;
    if (r >= G.rows) continue;
    const int64_t orow = G.a_row0 + r;
    const float oa = outer_of(a, orow);
    const bool token = r < G.tokens;  // padding rows: +0
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) {
      const int cl = i * 8 + 2 * (lane & 3);
      const int64_t c0 = n0 + cl;
      float y[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = acc[4 * i + 2 * h + e];
        if (raw) {
          y[e] = v;
        } else {
          float d = num::mul_rn(alpha, num::mul_rn(num::mul_rn(oa, s_ow[cl + e]), v));
          if (has_bias) d = num::add_rn(d, s_bias[cl + e]);
          y[e] = token ? d : 0.0f;
        }
      }
      if (full_cols) {
        if (raw)
          *reinterpret_cast<float2*>(raw + orow * n + c0) = make_float2(y[0], y[1]);
        else if constexpr (kBf16Out)
          *reinterpret_cast<uint32_t*>(out.d_bf16 + orow * n + c0) =
              uint32_t(num::f32_to_bf16(y[0])) | (uint32_t(num::f32_to_bf16(y[1])) << 16);
        else
          *reinterpret_cast<float2*>(out.d_f32 + orow * n + c0) = make_float2(y[0], y[1]);
      } else {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (c0 + e >= n) continue;
          if (raw)
            raw[orow * n + c0 + e] = y[e];
          else if constexpr (kBf16Out)
            out.d_bf16[orow * n + c0 + e] = num::f32_to_bf16(y[e]);
          else
            out.d_f32[orow * n + c0 + e] = y[e];
        }
      }
    }
  }
}

// Column c of the tile starting at n0: s_ow[c] = outer scale of W row c (1 past N), s_bias[c] = its
// bias (0 when absent or past N; the epilogue adds it only when a bias is given).
__device__ __forceinline__ void stage_columns(int c, int64_t n0, int64_t n, const GemmGroupDesc& G,
                                              const GemmOperandView& w, const DeviceEpilogue& ep, float* s_ow,
                                              float* s_bias) {
  const int64_t col = n0 + c;
  s_ow[c] = col < n ? outer_of(w, G.w_row0 + col) : 1.0f;
  s_bias[c] = ep.bias && col < n ? ep.bias[G.w_row0 + col] : 0.0f;
}

}  // namespace lockstep::cuda::gemm_detail
