// The decode kernel of qgemm_decode_cuda.cu (its header comment describes the order and the
// launch): constants, shared-memory layout, the pair / scale tables and decode_kernel itself.
// Included by that one file only (its definitions live in an anonymous namespace).
#pragma once

#include <cooperative_groups.h>

#include "qgemm_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

namespace cg = cooperative_groups;

// A block has nw warps (even, 4..16, chosen per call by the host to fill the GPU in one wave:
// not part of the order), 16 W rows each (swiglu: nw/2 warps of gate rows, the matching up rows).
constexpr int kMaxWarps = 16;
// k blocks in flight per warp (register ring): nvfp4 5, 8-bit codes 3, the fastest on the H200
// (deeper rings spill at the 128-register cap; bench/RESULTS.md).
// bf16 W: 2 (a slot holds twice the bytes of an 8-bit one).
constexpr int kRingNvfp4 = 5, kRing8Bit = 3, kRingBf16 = 2;
// Warps per SM below which the decode loop is latency-bound (the block-size model below).
constexpr int kSaturatingWarps = 10;
constexpr int kSmemLimit = 227 * 1024;  // per block (sm_90)
// Pair table, one copy per lane (conflict-free lookups), in one of two layouts:
// - wide (blocks of more than 8 warps, which run one per SM): entry b at byte offset 256 b, lane
//   l's copy at 8 (l & 15) + 4 (l >> 4) (32 distinct banks; bytes 128..255 of each entry unused):
//   the address is one byte permute (prmt) of the code word and the lane offset, {offset, code
//   byte, 0, 0}, which the lookup adds to the table base in its own addressing; 64 KB.
// - compact (blocks of up to 8 warps, two per SM): entry b at 128 b, lane l's copy at 4 l; address
//   = ((code byte << 8) | (lane << 3)) >> 1: the permute and one shift; 32 KB (two 64 KB tables
//   per SM would leave too little L1 for the W loads in flight).
// The wide table saves one instruction per code byte; the kernel is bound by its table lookups
// (figures in bench/RESULTS.md).
// 8-bit codes use no table: cvt.rn.f16x2.e4m3x2 / .e5m2x2 (exact), f16 -> f32 -> bf16x2 (exact).
// bf16 W (kFmtBf16) is read as it is: its words are the mma's bf16x2 operands.
constexpr int kFmtNvfp4 = 0, kFmtE4m3 = 1, kFmtE5m2 = 2, kFmtBf16 = 3;
__host__ __device__ constexpr bool wide_lut(int fmt, int max_warps) {
  return fmt == kFmtNvfp4 && max_warps > 8;
}
// Bytes before the staged A: pair table (nvfp4) + scale table (bf16x2 {s, s} per scale code), for
// a block of nw warps.
__host__ __device__ constexpr int smem_fixed(int fmt, int nw) {
  return (fmt != kFmtNvfp4 ? 0 : wide_lut(fmt, nw) ? 256 * 256 : 256 * 32 * 4) + 1024;
}
constexpr int kMaxSlices = 8;  // cluster size (portable)
// Register cap 65536 / 512 = 128 (the rings below fit); smaller blocks may share an SM.

// 128-wide k blocks per slice, a function of K alone (nb = K / 128 blocks): K <= 2048: 8 (1024-wide
// slices: MoE experts get two slices, more blocks); else max(16, ceil(nb / 8)): 4096 -> 2 x 2048,
// 8192 -> 4 x 2048, 14336 -> 7 x 2048. At most 8 slices (one portable cluster).
__host__ __device__ constexpr int decode_slice_blocks(int64_t K) {
  const int64_t nb = K / 128;
  if (nb <= 16) return 8;
  const int64_t b = (nb + kMaxSlices - 1) / kMaxSlices;
  return int(b < 16 ? 16 : b);
}
// Staged A row stride in bf16: slice + 16 (row stride = 8 words mod 32 banks: conflict-free).
__host__ __device__ constexpr int a_stride(int slice_blocks) { return slice_blocks * 128 + 16; }
// Gather (see decode_kernel): one group and two slices, where it is faster on the H200 (dense calls
// with two slices; not with more slices or grouped calls: bench/RESULTS.md).
__host__ __device__ constexpr bool decode_gathers(int slices, int groups) {
  return slices == 2 && groups == 1;
}
// Cluster mode: table, kM staged A rows of one slice, partials (two slots with the gather).
constexpr int decode_smem_bytes(int fmt, int nt, int nw, int slice_blocks, int slots = 1) {
  return smem_fixed(fmt, nw) + nt * 8 * a_stride(slice_blocks) * 2 + slots * 16 * nw * nt * 8 * 4;
}
// Whole-block mode (all S slices in one block of nw = S x row warps): the A rows of the group (at
// most `rows`) and one zero row over all of K.
constexpr int decode_block_smem_bytes(int fmt, int nt, int nw, int slice_blocks, int slices,
                                      int rows) {
  return smem_fixed(fmt, nw) + (rows + 1) * a_stride(slices * slice_blocks) * 2 +
         16 * nw * nt * 8 * 4;
}

// 8 bytes global -> shared, asynchronous (both addresses 8-byte aligned); cp_async_wait_all waits
// for this thread's copies (a barrier then publishes them to the block).
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile(
      "cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(uint32_t(__cvta_generic_to_shared(dst))),
      "l"(src)
      : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Four fp8 codes (bytes 0..3 of q) -> bf16x2 {b0, b1} and {b2, b3}, exact (every E4M3 / E5M2 value
// is an f16 normal or subnormal, an fp32 and a bf16 number; NaN stays NaN).
template <bool kE5>
__device__ __forceinline__ void fp8x4_to_bf16x2(uint32_t q, uint32_t& lo, uint32_t& hi) {
  if constexpr (kE5) {
    asm("{\n .reg .b16 l, h;\n .reg .b32 x, y;\n .reg .f16 x0, x1, y0, y1;\n .reg .f32 f0, f1, f2, "
        "f3;\n"
        " mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 x, l;\n cvt.rn.f16x2.e5m2x2 y, h;\n"
        " mov.b32 {x0, x1}, x;\n mov.b32 {y0, y1}, y;\n"
        " cvt.f32.f16 f0, x0;\n cvt.f32.f16 f1, x1;\n cvt.f32.f16 f2, y0;\n cvt.f32.f16 f3, y1;\n"
        " cvt.rn.bf16x2.f32 %0, f1, f0;\n cvt.rn.bf16x2.f32 %1, f3, f2;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(q));
  } else {
    asm("{\n .reg .b16 l, h;\n .reg .b32 x, y;\n .reg .f16 x0, x1, y0, y1;\n .reg .f32 f0, f1, f2, "
        "f3;\n"
        " mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 x, l;\n cvt.rn.f16x2.e4m3x2 y, h;\n"
        " mov.b32 {x0, x1}, x;\n mov.b32 {y0, y1}, y;\n"
        " cvt.f32.f16 f0, x0;\n cvt.f32.f16 f1, x1;\n cvt.f32.f16 f2, y0;\n cvt.f32.f16 f3, y1;\n"
        " cvt.rn.bf16x2.f32 %0, f1, f0;\n cvt.rn.bf16x2.f32 %1, f3, f2;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(q));
  }
}

// One block of nw warps: tile bx of group z (W rows [bx*16nw, +16nw); swiglu: gate rows [bx*8nw,
// +8nw) and up rows [I + bx*8nw, +8nw)), K slice y (cluster rank y of the cluster (1, slices, 1));
// kNT n-tiles of 8 A rows. kMaxW: the largest block the instantiation takes (8: two blocks per SM,
// as register cap 128).
template <int kFmt, int kNT, int kMaxW, bool kBlk>
__global__ void __launch_bounds__(kMaxW * 32, kMaxWarps / kMaxW)
    decode_kernel(GemmOperandView a, GemmOperandView w, int64_t n, const GemmGroupDesc* groups,
                  DeviceEpilogue ep, GemmOutView out, int slice_blocks, int spb_arg) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr bool kNvfp4 = kFmt == kFmtNvfp4, kBf16 = kFmt == kFmtBf16;
  constexpr int kM = kNT * 8;
  constexpr int kRing = kNvfp4 ? kRingNvfp4 : kBf16 ? kRingBf16 : kRing8Bit;
  // 16-byte loads per row per thread per k block, bytes per row per 128-wide k block.
  constexpr int kVec = kNvfp4 ? 1 : kBf16 ? 4 : 2;
  constexpr int kBytesPerBlock = 16 * 4 * kVec;
  constexpr int kScaleStep = kNvfp4 ? 8 : 4;  // scale bytes per row per k block
  const int spb = kBlk ? spb_arg : 1;         // slices per block (whole-block mode: all of them)
  const int AS = a_stride(spb * slice_blocks);
  constexpr int kFixed = smem_fixed(kFmt, kMaxW);  // the wide table for kMaxW 16 (nw > 8)
  constexpr bool kWide = wide_lut(kFmt, kMaxW);
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);                   // pair table (nvfp4)
  uint32_t* slut = reinterpret_cast<uint32_t*>(smem + kFixed - 1024);  // [256]
  uint16_t* As = reinterpret_cast<uint16_t*>(smem + kFixed);  // [staged rows][AS], permuted k

  pdl_launch_dependents();  // the next kernel may start its prologue (it waits before touching
                            // data)
  const GemmGroupDesc G = groups[blockIdx.z];
  if (G.rows == 0) return;  // the whole cluster (same group) returns
  // Gather (one group, two slices, clusters): rank 1 writes its partials into rank 0's shared
  // memory and exits; rank 0 sums and stores everything (decode_gathers). Phase 1 of the cluster
  // barrier says "rank 0 runs" (arrived here, waited before the remote stores), phase 2 carries
  // rank 1's stores (arrive.release, rank 0's wait.acquire).
  const bool gather = !kBlk && decode_gathers(int(gridDim.y), int(gridDim.z));
  if (gather) cluster_arrive_relaxed();
  // Two ways to split K (docs/gemm.md "CUDA decode order"; the same chains and the same sum):
  // - clusters (spb = 1): block y of the cluster (1, slices, 1) runs slice y with all nw warps;
  // - whole block (spb = S slices, gridDim.y = 1): warp w runs row warp w % (nw / S) of slice
  //   w / (nw / S); the partials meet in the block's shared memory.
  const int slices = gridDim.y;  // blocks per row tile (cluster size)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nthreads = int(blockDim.x), nw = nthreads >> 5;
  const int rwarps = nw / spb, rw = kBlk ? warp % rwarps : warp,
            slice = kBlk ? warp / rwarps : int(blockIdx.y);
  const int rows_blk = 16 * rwarps, half = rwarps >> 1;
  const int g = lane >> 2, t = lane & 3;
  const int64_t K = w.cols;
  const int64_t kb0 =
      int64_t(blockIdx.y) * spb * slice_blocks * 128;  // the block's k range (staged A)
  const int64_t kb1 =
      kb0 + int64_t(spb) * slice_blocks * 128 < K ? kb0 + int64_t(spb) * slice_blocks * 128 : K;
  const int ks = int(kb1 - kb0);
  const int64_t k0 = int64_t(slice) * slice_blocks * 128;  // this warp's slice
  const int nblk = int((K - k0) / 128 < slice_blocks ? (K - k0) / 128 : slice_blocks);

  // This warp's 16 W rows (local rows lr0 = warp*16 + g, lr1 = lr0 + 8 of the tile).
  const int64_t oc = ep.swiglu ? n / 2 : n;  // output columns
  int64_t j0, j1;
  bool v0, v1;
  if (ep.swiglu) {
    const int64_t c0 = int64_t(blockIdx.x) * (16 * half) + (rw % half) * 16 + g;
    const int64_t base = (rw / half) * oc;
    v0 = c0 < oc, v1 = c0 + 8 < oc;
    j0 = base + c0, j1 = base + c0 + 8;
  } else {
    j0 = int64_t(blockIdx.x) * rows_blk + rw * 16 + g, j1 = j0 + 8;
    v0 = j0 < n, v1 = j1 < n;
  }
  const int64_t wr0 = G.w_row0 + (v0 ? j0 : 0),
                wr1 = G.w_row0 + (v1 ? j1 : 0);  // clamped; discarded
  const bool mx = !kBf16 && w.format == Format::kMxfp8;
  const uint8_t* wd = static_cast<const uint8_t*>(w.data);

  // Thread (g, t) reads elements [k + 32t, k + 32t + 32) of rows j0 and j1 for each 128-wide k.
  const uint8_t* p0;
  const uint8_t* p1;
  const uint8_t* s0p;
  const uint8_t* s1p;
  if constexpr (kNvfp4) {
    p0 = wd + wr0 * (K / 2) + (k0 + 32 * t) / 2;
    p1 = wd + wr1 * (K / 2) + (k0 + 32 * t) / 2;
    s0p = w.block_scale + wr0 * (K / 16) + (k0 + 32 * t) / 16;
    s1p = w.block_scale + wr1 * (K / 16) + (k0 + 32 * t) / 16;
  } else if constexpr (kBf16) {
    p0 = wd + (wr0 * K + k0 + 32 * t) * 2;
    p1 = wd + (wr1 * K + k0 + 32 * t) * 2;
    s0p = s1p = nullptr;
  } else {
    p0 = wd + wr0 * K + k0 + 32 * t;
    p1 = wd + wr1 * K + k0 + 32 * t;
    s0p = mx ? w.block_scale + wr0 * (K / 32) + (k0 + 32 * t) / 32 : nullptr;
    s1p = mx ? w.block_scale + wr1 * (K / 32) + (k0 + 32 * t) / 32 : nullptr;
  }
  uint4 x0[kRing][kVec], x1[kRing][kVec];
  uint32_t sc0[kRing], sc1[kRing];
  auto load_block = [&](int u, int b) {
    const int64_t off = int64_t(b) * kBytesPerBlock;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      x0[u][v] = ldg_stream16(p0 + off + 16 * v);
      x1[u][v] = ldg_stream16(p1 + off + 16 * v);
    }
    if constexpr (kNvfp4) {
      sc0[u] = __ldg(reinterpret_cast<const uint16_t*>(s0p + b * kScaleStep));
      sc1[u] = __ldg(reinterpret_cast<const uint16_t*>(s1p + b * kScaleStep));
    } else if (mx) {
      sc0[u] = __ldg(s0p + b * kScaleStep);
      sc1[u] = __ldg(s1p + b * kScaleStep);
    } else {
      sc0[u] = sc1[u] = 0;
    }
  };
  // The first ring of W. With w.preload (W is not written by the work still running before this
  // kernel: see GemmOperandView) it is issued before griddepcontrol.wait, so that its memory
  // latency overlaps the table build and the previous kernel's tail; otherwise after the wait. The
  // same loads either way: only the timing differs (the MoE decode graph about 7 % faster on the
  // H200).
  auto load_ring = [&] {
#pragma unroll
    for (int u = 0; u < kRing; ++u)
      if (u < nblk) load_block(u, u);
  };
  const bool preload = w.preload;
  if (preload) load_ring();

  for (int b = tid; b < 256; b += nthreads) {  // one codec call per code, then 32 replicas; the
                                               // rotation keeps a store's 32 lanes on 32 banks
    if constexpr (kNvfp4) {
      const uint32_t v = pair_entry(w.format, w.elem, uint32_t(b));
#pragma unroll 8
      for (int c = 0; c < 32; ++c) {
        const int l = (c + b) & 31;
        if constexpr (kWide)
          lut[b * 64 + (l & 15) * 2 + (l >> 4)] = v;
        else
          lut[b * 32 + l] = v;
      }
    }
    slut[b] = uint32_t(scale_entry(w.format, uint32_t(b))) * 0x10001u;
  }
  pdl_wait();  // the previous kernel's writes (A, and anything it wrote to W or D) are visible now
  if (!preload) load_ring();

  // Stage A[rows of the group, kb0 .. kb1) as exact bf16, permuted so that lane (g, t) of mma
  // step s of k block b reads its 4 elements 128b + 32t + 4s + {0..3} from one 8-byte word at
  // b*128 + s*16 + t*4 (conflict-free). Staged rows past the group are zero: kM rows with clusters;
  // in whole-block mode the group's rows and one zero row, which the lanes of absent rows read.
  const int rows_here = G.rows < kM ? G.rows : kM;
  const int rows_staged = kBlk ? rows_here + 1 : kM;
  float* part =
      reinterpret_cast<float*>(smem + kFixed + rows_staged * AS * 2);  // [spb][16 rwarps][kM]
  {
    const int vec = ks / 8;  // 8-element vectors per row
    // The copies go through cp.async for 8-bit W and in whole-block mode, where that is faster on
    // the H200 than the register-staged loop; nvfp4 W in clusters keeps the register-staged loop.
    constexpr bool kAsyncA = kBlk || !kNvfp4;
    if (a.format == Format::kBf16 && kAsyncA) {
      const uint16_t* ad = static_cast<const uint16_t*>(a.data);
      // Vector c (8 elements) of every staged row: two 8-byte cp.async copies (global -> shared, no
      // registers), so that all of a thread's copies are in flight at once; rows past the group are
      // zero.
      for (int c = tid; c < vec; c += nthreads) {
        const int e = c * 8;  // element e..e+7: block e/128, t (e/32)%4, steps s, s+1
        const int off = (e >> 7) * 128 + ((e >> 2) & 7) * 16 + ((e >> 5) & 3) * 4;
        const uint16_t* src = ad + G.a_row0 * K + kb0 + e;
#pragma unroll(kBlk ? 1 : kM)
        for (int r = 0; r < rows_staged; ++r) {
          uint16_t* dst = As + r * AS + off;
          if (r < rows_here) {
            cp_async8(dst, src + r * K);
            cp_async8(dst + 16, src + r * K + 4);
          } else {
            *reinterpret_cast<uint2*>(dst) = make_uint2(0, 0);
            *reinterpret_cast<uint2*>(dst + 16) = make_uint2(0, 0);
          }
        }
      }
      cp_async_wait_all();
    } else if (a.format == Format::kBf16) {
      const uint16_t* ad = static_cast<const uint16_t*>(a.data);
      // Vector c (8 elements) of rows r0 .. r0 + 7: the 8 loads first, then the stores.
      for (int c = tid; c < vec; c += nthreads) {
        const int e = c * 8;
        const int off = (e >> 7) * 128 + ((e >> 2) & 7) * 16 + ((e >> 5) & 3) * 4;
#pragma unroll(kNT)
        for (int r0 = 0; r0 < rows_staged; r0 += 8) {
          uint4 v[8];
#pragma unroll
          for (int r = 0; r < 8; ++r) {
            v[r] = make_uint4(0, 0, 0, 0);
            if (r0 + r < rows_here)
              v[r] = *reinterpret_cast<const uint4*>(ad + (G.a_row0 + r0 + r) * K + kb0 + e);
          }
#pragma unroll
          for (int r = 0; r < 8; ++r) {
            if (r0 + r >= rows_staged) break;
            uint16_t* dst = As + (r0 + r) * AS + off;
            *reinterpret_cast<uint2*>(dst) = make_uint2(v[r].x, v[r].y);
            *reinterpret_cast<uint2*>(dst + 16) = make_uint2(v[r].z, v[r].w);
          }
        }
      }
    } else {
      for (int i = tid; i < rows_staged * ks; i += nthreads) {
        const int r = i / ks, e = i % ks;
        const int b = e >> 7, tt = (e >> 5) & 3, s = (e >> 2) & 7;
        As[r * AS + b * 128 + s * 16 + tt * 4 + (e & 3)] =
            r < rows_here ? inner_bf16(a, G.a_row0 + r, kb0 + e) : uint16_t(0);
      }
    }
  }
  __syncthreads();

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  // A fragments. With the compact table, only the lanes of present rows load them (predicated;
  // the others keep zeros, and their mma columns are never stored): half the A wavefronts for
  // M <= 4. Only the compact nvfp4 kernel predicates: on the H200 it gains there (nvfp4
  // 4096x14336 M = 1 17.2 against 18.0 us) and costs in the others (fp8 4096x14336 M = 1 6 %
  // slower, MoE decode 1 %).
  constexpr bool kPredA = kNvfp4 && !kWide;
  uint2 bv[kNT];
  bool a_act[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    bv[nt] = make_uint2(0, 0), a_act[nt] = !kPredA || nt * 8 + g < rows_here;
  // Table word for byte k (0..3) of x: wide layout, LDS at {loff, x.byte[k], 0, 0} (selector
  // nibbles 4, k, 5, 5; loff < 128); compact layout, LDS at (x.byte[k] << 7) | lane << 2, as the
  // permute with lane << 3 and one shift.
  const uint32_t loff =
      kWide ? uint32_t(((lane & 15) << 3) | ((lane >> 4) << 2)) : uint32_t(lane) << 3;
#define LS_LUT(x, k)                   \
  (*reinterpret_cast<const uint32_t*>( \
      smem + (__byte_perm((x), loff, 0x5504u | ((k) << 4)) >> (kWide ? 0 : 1))))
  // A row of n-tile nt for this lane: nt * 8 + g (whole-block mode: the zero row if absent), at
  // this warp's slice within the staged range.
  const uint16_t* abase = kBlk ? As + t * 4 + (k0 - kb0) : As + g * AS + t * 4;
  int aoff[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    aoff[nt] = kBlk ? (nt * 8 + g >= rows_here ? rows_here : nt * 8 + g) * AS : nt * 8 * AS;
  for (int b0 = 0; b0 < nblk; b0 += kRing) {
#pragma unroll
    for (int u = 0; u < kRing; ++u) {
      const int b = b0 + u;
      if (b >= nblk) break;
      const uint16_t* arow = abase + b * 128;
      const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&x0[u][0]);
      const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&x1[u][0]);
      uint32_t sA = 0, sB = 0, sA2 = 0, sB2 = 0;
      if constexpr (kNvfp4) {
        sA = slut[sc0[u] & 0xFF], sA2 = slut[sc0[u] >> 8];
        sB = slut[sc1[u] & 0xFF], sB2 = slut[sc1[u] >> 8];
      } else if (mx) {
        sA = slut[sc0[u]], sB = slut[sc1[u]];
      }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        // mma k slots (2t, 2t+1) <- elements 4s, 4s+1 of the thread's 32; (2t+8, 2t+9) <- 4s+2,
        // 4s+3. A (activations) uses the same permutation, so the sum over k is unchanged.
        uint32_t a0, a1, a2, a3;
        if constexpr (kBf16) {  // elements 4s .. 4s+3: words 2s, 2s+1 of the thread's 32
          a0 = w0[2 * s], a2 = w0[2 * s + 1];
          a1 = w1[2 * s], a3 = w1[2 * s + 1];
        } else if constexpr (kNvfp4) {
          const uint32_t q0 = w0[s >> 1], q1 = w1[s >> 1];
          const int k = (s & 1) * 2;  // bytes k, k+1 of the word: elements 4s .. 4s+3
          const uint32_t m0 = s < 4 ? sA : sA2, m1 = s < 4 ? sB : sB2;
          a0 = bf16x2_mul(LS_LUT(q0, k), m0);
          a2 = bf16x2_mul(LS_LUT(q0, k + 1), m0);
          a1 = bf16x2_mul(LS_LUT(q1, k), m1);
          a3 = bf16x2_mul(LS_LUT(q1, k + 1), m1);
        } else {
          const uint32_t q0 = w0[s], q1 = w1[s];
          fp8x4_to_bf16x2<kFmt == kFmtE5m2>(q0, a0, a2);
          fp8x4_to_bf16x2<kFmt == kFmtE5m2>(q1, a1, a3);
          if (mx) {
            a0 = bf16x2_mul(a0, sA), a2 = bf16x2_mul(a2, sA);
            a1 = bf16x2_mul(a1, sB), a3 = bf16x2_mul(a3, sB);
          }
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (a_act[nt]) bv[nt] = *reinterpret_cast<const uint2*>(arow + aoff[nt] + s * 16);
          mma_bf16_16816(acc[nt], a0, a1, a2, a3, bv[nt].x, bv[nt].y);
        }
      }
      // The ring slot is consumed: refill it with block b + kRing (keeps kRing blocks in flight).
      if (b + kRing < nblk) load_block(u, b + kRing);
    }
  }

#undef LS_LUT

  // acc[nt][q]: W row (q < 2 ? j0 : j1), A row nt * 8 + 2t + (q & 1).
  if (!kBlk && slices == 1 && !ep.swiglu) {  // direct
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int tok = nt * 8 + 2 * t + (q & 1);
        const int64_t j = q < 2 ? j0 : j1;
        if (!(q < 2 ? v0 : v1) || tok >= G.rows) continue;
        const int64_t orow = G.a_row0 + tok;
        const float y = tok < G.tokens ? epilogue_value(acc[nt][q], outer_of(a, orow),
                                                        outer_of(w, G.w_row0 + j), ep, G.w_row0 + j)
                                       : 0.0f;
        store_out(out, orow * n + j, y);
      }
    }
    return;
  }
  // Partials of this slice -> shared memory part[slot][local row][token] (slot: the slice in
  // whole-block mode or with the gather, else 0; rank 1 of a gather stores into rank 0's slot 1).
  const int slot = rows_blk * kM;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(blockIdx.y);
  float* dst = part + (kBlk ? slice : 0) * slot;
  if (gather && rank == 1) {
    cluster_wait();  // phase 1: rank 0 has started (its shared memory exists)
    dst = cluster.map_shared_rank(part + slot, 0);
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int lr = rw * 16 + g + (q < 2 ? 0 : 8);
      dst[lr * kM + nt * 8 + 2 * t + (q & 1)] = acc[nt][q];
    }
  }
  if (gather) {
    if (rank == 1) {
      cluster_arrive_release();  // phase 2: the partials are in rank 0; nothing reads this block
      return;  // (no wait: a barrier counts exited threads as arrived, PTX `exit`)
    }
    cluster_wait();
    cluster_arrive_release();
    cluster_wait_acquire();
  } else if (slices > 1) {
    cluster.sync();
  } else {
    __syncthreads();
  }
  const int nparts = kBlk ? spb : slices;
  const float* parts[kMaxSlices];
#pragma unroll
  for (int s = 0; s < kMaxSlices; ++s)
    parts[s] = kBlk || gather ? part + (s < nparts ? s : 0) * slot  // slots of this block
               : s < slices && slices > 1 ? cluster.map_shared_rank(part, s)
                                          : part;
  const int ranks = gather ? 1 : slices;  // blocks sharing the stores
  // value(lr, tok): slices summed in ascending order, then steps 1-3 of the epilogue.
  auto value = [&](int lr, int tok, int64_t j) {
    const int idx = lr * kM + tok;
    float s = parts[0][idx];
#pragma unroll
    for (int q = 1; q < kMaxSlices; ++q)
      if (q < nparts) s = num::add_rn(s, parts[q][idx]);
    const int64_t orow = G.a_row0 + tok;
    return epilogue_value(s, outer_of(a, orow), outer_of(w, G.w_row0 + j), ep, G.w_row0 + j);
  };
  if (ep.swiglu) {
    const float* prob = ep.router_prob;
    const int cols_blk = 16 * half;
    for (int i = rank * nthreads + tid; i < cols_blk * kM; i += ranks * nthreads) {
      const int cl = i / kM, tok = i % kM;
      const int64_t c = int64_t(blockIdx.x) * cols_blk + cl;
      if (tok >= rows_here || c >= oc) continue;
      const int64_t orow = G.a_row0 + tok;
      float y = 0.0f;
      if (tok < G.tokens)
        y = num::swiglu_weighted_f32(value(cl, tok, c), value(cols_blk + cl, tok, oc + c),
                                     prob ? prob[orow] : 1.0f);
      store_out(out, orow * oc + c, y);
    }
  } else {
    for (int i = rank * nthreads + tid; i < rows_blk * kM; i += ranks * nthreads) {
      const int lr = i / kM, tok = i % kM;
      const int64_t j = int64_t(blockIdx.x) * rows_blk + lr;
      if (tok >= rows_here || j >= n) continue;
      const int64_t orow = G.a_row0 + tok;
      store_out(out, orow * n + j, tok < G.tokens ? value(lr, tok, j) : 0.0f);
    }
  }
  if (slices > 1 && !gather)
    cluster.sync();  // keep this block's partials alive until every rank has read them
}

// Raw fp32 D -> output (used by the tiled and cuBLAS paths): see qgemm_cuda.cuh.
__global__ void epilogue_kernel(const float* ws, int slices, int64_t rows_total, GemmOperandView a,
                                GemmOperandView w, int64_t n, const GemmGroupDesc* groups,
                                DeviceEpilogue ep, GemmOutView out) {
  const GemmGroupDesc G = groups[blockIdx.z];
  for (int64_t r = blockIdx.y; r < G.rows; r += gridDim.y) {
    const int64_t orow = G.a_row0 + r;
    const int64_t oc = ep.swiglu ? n / 2 : n;
    const float oa = outer_of(a, orow);
    const float p = ep.router_prob ? ep.router_prob[orow] : 1.0f;
    auto value = [&](int64_t j) {
      float acc = ws[orow * n + j];
      for (int s = 1; s < slices; ++s)
        acc = num::add_rn(acc, ws[(int64_t(s) * rows_total + orow) * n + j]);
      return epilogue_value(acc, oa, outer_of(w, G.w_row0 + j), ep, G.w_row0 + j);
    };
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < oc;
         c += int64_t(gridDim.x) * blockDim.x) {
      float y = 0.0f;
      if (r < G.tokens)
        y = ep.swiglu ? num::swiglu_weighted_f32(value(c), value(oc + c), p) : value(c);
      store_out(out, orow * oc + c, y);
    }
  }
}

}  // namespace
}  // namespace lockstep::cuda::gemm_detail
