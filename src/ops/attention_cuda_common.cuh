// Device helpers shared by the CUDA attention kernels (private to ops/): the packed-batch schedule
// built on the device from cu_seqlens (never read on the host), bf16 tensor-core primitives
// (mma.sync m16n8k16, ldmatrix, cp.async) and the launch plumbing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../tensor/cuda_util.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::ops::attention_cuda::detail {

// Query / key tile of the flash kernels: the packed schedule counts tiles of this many tokens.
inline constexpr int kTile = 64;

// cu_seqlens made safe on the device: c[0] = 0, c[s] = min(max(cu[0..s]), T) for 0 < s < b,
// c[b] = T (a malformed cu gives other sequence bounds, never an access out of range, and every
// token belongs to exactly one sequence); tiles[s] = sum over s' < s of ceil(len(s') / kTile),
// tiles[b] the total. cu: I32 or I64 [b + 1].
struct PackedSchedule {
  const int64_t* cu = nullptr;     // [b + 1] sanitized
  const int64_t* tiles = nullptr;  // [b + 1]
  int64_t num_seqs = 0, tokens = 0;
  int64_t max_tiles = 0;  // grid bound: ceil(T / kTile) + b >= tiles[b]
};
PackedSchedule make_schedule(const Tensor& cu, int64_t tokens, cuda::Scratch& scratch);

// The sequence holding token t (largest s with cu[s] <= t, among non-empty sequences).
__device__ __forceinline__ int64_t seq_of_token(const PackedSchedule& p, int64_t t) {
  int64_t lo = 0, hi = p.num_seqs - 1;  // cu[lo] <= t < cu[hi + 1]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Tile `id` of the schedule: false when id is past the last tile; else its sequence and tile index
// inside the sequence.
__device__ __forceinline__ bool tile_of(const PackedSchedule& p, int64_t id, int64_t& seq,
                                        int64_t& tile) {
  if (id >= p.tiles[p.num_seqs]) return false;
  int64_t lo = 0, hi = p.num_seqs - 1;  // tiles[lo] <= id < tiles[hi + 1]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.tiles[mid] <= id)
      lo = mid;
    else
      hi = mid - 1;
  }
  seq = lo;
  tile = id - p.tiles[lo];
  return true;
}

// Entry r of an I64 (i64) or I32 index array on the device.
__device__ __forceinline__ int64_t index_at(const void* p, bool i64, int64_t r) {
  return i64 ? static_cast<const int64_t*>(p)[r] : int64_t(static_cast<const int32_t*>(p)[r]);
}

// ---- bf16 tensor-core primitives (PTX fragment layouts of mma.m16n8k16) -------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// The same, each matrix transposed (lane gets rows 2 (l % 4), 2 (l % 4) + 1 of column l / 4).
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// D[16x8] += A[16x16] B[16x8]: bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values RNE to bf16, `lo` in the low half (the lower column of an mma fragment pair).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 16 bytes global -> shared, asynchronous; `valid` false zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 2^x, the hardware approximation (relative error below 2^-22; docs/ops.md bounds the fast path
// with it). Used only by the tensor-core paths, never by a row function.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- bf16 operand copies of the flash kernels ---------------------------------------------------

// The flash kernels' head dim: D rounded up to 32, 64, 128 or 256.
inline int flash_head_dim(int64_t D) { return D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : 256; }

// src F32 [T, H, D] -> dst bf16 [H, T, kd] (RNE), dims D .. kd - 1 zero: each head's rows
// contiguous and padded to the kernel's head dim, so tiles load as whole 16-byte chunks.
void to_bf16_heads(const float* src, uint16_t* dst, int64_t tokens, int64_t heads, int64_t D,
                   int kd, cudaStream_t stream);

// Dynamic shared memory above 48 KiB, granted once per kernel (first launch).
template <class Kernel>
void allow_smem(Kernel k, size_t bytes) {
  if (bytes > 48 * 1024)
    LOCKSTEP_CUDA_CHECK(
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

int sm_count();

}  // namespace lockstep::ops::attention_cuda::detail
