// Raw stages of the wgmma kernels that dequantize inside their main loop (qgemm_wgmma_cuda.cu, the
// 128-row in-loop kernel; qgemm_wgmma_smallm_cuda.cu, the 64-row small-M kernel): the packed bytes
// of one 64-wide k step of an operand tile are copied by cp.async into a shared-memory stage, then
// dequantized exactly into a 128-byte-swizzled bf16 tile. Both kernels use these functions, so
// they feed the tensor cores the same bf16 operand values. Internal to src/gemm.
#pragma once

#include <cstdint>

#include "qgemm_cuda.cuh"
#include "qgemm_wgmma_cuda.cuh"

namespace lockstep::cuda::gemm_detail {

__device__ __forceinline__ void cp_async(void* dst, const void* src, int src_bytes,
                                         int bytes_const16) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  if (bytes_const16 == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Bytes of one tile row's 64 k-values, and the elements one block scale covers (0: none).
constexpr int raw_row_bytes(Format f) {
  return f == Format::kNvfp4 ? 32 : f == Format::kBf16 ? 128 : 64;
}
constexpr int scale_block(Format f) {
  return f == Format::kNvfp4 ? 16 : f == Format::kMxfp8 ? 32 : 0;
}
// Raw stage of one operand tile: [rows][row bytes] data, then [rows][4] scale words.
constexpr int raw_tile_bytes(Format f, int rows) {
  return rows * raw_row_bytes(f) + (scale_block(f) ? rows * 4 : 0);
}

// Issue the cp.async copies of tile rows [0, kRows) (global rows row0 + r, valid below `valid`)
// for k in [k0, k0 + 64), by kThreads threads. Rows past `valid` are zero-filled. A block-scale
// word is the aligned 4 bytes holding the row's scales (nvfp4: exactly its 4; mxfp8: its 2 at byte
// (offset & 3)).
template <Format F, int kRows, int kThreads>
__device__ __forceinline__ void issue_raw(const GemmOperandView& op, int64_t row0, int64_t valid,
                                          int64_t k0, uint8_t* dst, int tid) {
  constexpr int rb = raw_row_bytes(F), cpr = rb / 16, sb = scale_block(F);
  constexpr int kChunks = kRows * cpr, kRounds = (kChunks + kThreads - 1) / kThreads;
  const int64_t K = op.cols;
  const uint8_t* base = static_cast<const uint8_t*>(op.data);
  const int64_t row_stride = K * rb / 64, k_off = k0 * rb / 64;
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const int i = tid + j * kThreads, r = i / cpr, c = i % cpr;
    if (kChunks % kThreads != 0 && i >= kChunks) break;
    const bool ok = r < valid;
    cp_async(dst + r * rb + c * 16, base + (row0 + (ok ? r : 0)) * row_stride + k_off + c * 16,
             ok ? 16 : 0, 16);
  }
  if constexpr (sb != 0) {
    uint8_t* sdst = dst + kRows * rb;
    const int64_t spr = K / sb, total = op.rows * spr;
#pragma unroll
    for (int r = tid; r < kRows; r += kThreads) {
      const bool ok = r < valid;
      const int64_t off = (row0 + (ok ? r : 0)) * spr + k0 / sb, al = off & ~int64_t(3);
      if (ok && al + 4 > total) {  // the last word of the buffer: read the bytes that exist
        uint32_t wv = 0;
        for (int64_t b = al; b < total; ++b) wv |= uint32_t(op.block_scale[b]) << (8 * (b - al));
        *reinterpret_cast<uint32_t*>(sdst + r * 4) = wv;
      } else {
        cp_async(sdst + r * 4, op.block_scale + al, ok ? 4 : 0, 4);
      }
    }
  }
}

// Dequantize the raw stage of a kRows x 64 tile into the swizzled bf16 tile: 16-value pieces,
// piece p = tid + kThreads j is row p / 4, k [16 (p % 4), +16), so the lanes of a warp read
// contiguous raw bytes (no bank conflicts) and write 4 distinct 16-byte positions per row.
// `rep`: the pair table replicated once per lane ([256][32], entry b of lane l at 32 b + l), so the
// 32 lanes' random lookups never share a bank; `scale`: the block-scale table. kSkipDead: pieces
// of rows at or past `live` are not written (their bf16 rows keep what they hold: the small-M
// kernel zeroes them once; they only reach outputs that are never stored).
template <Format F, int kRows, int kThreads, bool kSkipDead = false>
__device__ __forceinline__ void dequant_tile(const GemmOperandView& op, const uint32_t* rep,
                                             const uint16_t* scale, const uint8_t* raw,
                                             int64_t grow0, int64_t k0, uint8_t* tile, int tid,
                                             int64_t live = kRows) {
  const uint32_t* my = rep + (tid & 31);
  constexpr int rb = raw_row_bytes(F);
  static_assert((kRows * 4) % kThreads == 0, "whole pieces per thread");
#pragma unroll
  for (int j = 0; j < kRows * 4 / kThreads; ++j) {
    const int p = tid + j * kThreads, row = p >> 2, q = p & 3;
    if (kSkipDead && row >= live) continue;
    const uint8_t* rd = raw + row * rb;
    RawTile t;
    t.valid = true;
    t.scale = 0;
    if constexpr (F == Format::kNvfp4) {
      const uint2 x = *reinterpret_cast<const uint2*>(rd + q * 8);
      t.v[0].x = x.x, t.v[0].y = x.y;
      t.scale = raw[kRows * rb + row * 4 + q];
    } else if constexpr (F == Format::kBf16) {
      t.v[0] = *reinterpret_cast<const uint4*>(rd + q * 32);
      t.v[1] = *reinterpret_cast<const uint4*>(rd + q * 32 + 16);
    } else {
      t.v[0] = *reinterpret_cast<const uint4*>(rd + q * 16);
      if constexpr (F == Format::kMxfp8) {
        const int sshift = int((((grow0 + row) * (op.cols / 32)) + k0 / 32) & 3);
        t.scale = raw[kRows * rb + row * 4 + sshift + q / 2];
      }
    }
    uint32_t o[8];
    dequant16_p<F>([&](uint32_t b) { return my[b * 32]; }, scale, t, o);
    *reinterpret_cast<uint4*>(tile + swz(row, 2 * q)) = make_uint4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<uint4*>(tile + swz(row, 2 * q + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

constexpr int kRepLutBytes = 256 * 32 * 4;
constexpr int rep_lut_bytes(Format f) { return f == Format::kBf16 ? 0 : kRepLutBytes; }

// The lane-replicated pair tables (rep_a, rep_w: rep_lut_bytes each, absent for bf16) and the
// block-scale tables of both operands, filled by the block's kThreads threads from the codecs: one
// codec call per entry, 32 replicas; the rotation spreads a store over 32 banks.
template <Format FA, Format FW, int kThreads>
__device__ __forceinline__ void fill_luts(const GemmOperandView& a, const GemmOperandView& w,
                                          uint32_t* rep_a, uint32_t* rep_w, OperandLuts& lut_a,
                                          OperandLuts& lut_w, int tid) {
  static_assert(256 % kThreads == 0, "whole table entries per thread");
#pragma unroll
  for (int e = tid; e < 256; e += kThreads) {
    lut_a.scale[e] = scale_entry(a.format, uint32_t(e));
    lut_w.scale[e] = scale_entry(w.format, uint32_t(e));
    const uint32_t va = pair_entry(a.format, a.elem, uint32_t(e)),
                   vw = pair_entry(w.format, w.elem, uint32_t(e));
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      if constexpr (FA != Format::kBf16) rep_a[e * 32 + ((c + e) & 31)] = va;
      if constexpr (FW != Format::kBf16) rep_w[e * 32 + ((c + e) & 31)] = vw;
    }
  }
}

}  // namespace lockstep::cuda::gemm_detail
