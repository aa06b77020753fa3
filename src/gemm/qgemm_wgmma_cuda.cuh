// Hopper (sm_90a) wgmma primitives and the accumulator epilogue shared by the wgmma GEMM kernels
// (qgemm_wgmma_cuda.cu and qgemm_wgmma_smallm_cuda.cu: operands dequantized inside the main loop;
// qgemm_wgmma_tma_cuda.cu and qgemm_wgmma_wreg_cuda.cu: bf16 operands through TMA). Internal to
// src/gemm.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)

#include <algorithm>
#include <cstdint>

#include "../tensor/cuda_async.cuh"
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
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// Byte offset of 16-byte chunk c (0..7, k = 8c .. 8c + 7) of tile row r in the 128-byte swizzled
// layout (the layout TMA's CU_TENSOR_MAP_SWIZZLE_128B writes for a 64-element bf16 box row).
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
}

// Outer scales and the epilogue from the accumulators of one warpgroup's m64 x kBN wgmma tile
// (rows row0 .. row0 + 63 of group G, columns n0 .. n0 + kBN - 1; t = thread in the warpgroup), per
// element the
// steps of epilogue_value (RN(RN(oa * ow) * acc), RN(alpha * .), + bias) in the same order. The
// tile's column outer scales and biases are staged in shared memory (s_ow, s_bias: kBN each), so
// no element waits on a global load; the code is a straight line of a few instructions per element
// (a large unrolled epilogue does not fit the instruction cache and costs more than the main loop).
// acc[4i + q]: row 16 (warp in group) + lane / 4 (+ 8 for q >= 2), column 8i + 2 (lane % 4) + (q &
// 1).
template <int kBN, bool kBf16Out>
__device__ __forceinline__ void wgmma_epilogue(const float (&acc)[kBN / 2], int64_t row0, int t,
                                               int64_t n0, const GemmGroupDesc& G,
                                               const GemmOperandView& a, int64_t n,
                                               const DeviceEpilogue& ep, const GemmOutView& out,
                                               float* raw, const float* s_ow, const float* s_bias) {
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
                                              const GemmOperandView& w, const DeviceEpilogue& ep,
                                              float* s_ow, float* s_bias) {
  const int64_t col = n0 + c;
  s_ow[c] = col < n ? outer_of(w, G.w_row0 + col) : 1.0f;
  s_bias[c] = ep.bias && col < n ? ep.bias[G.w_row0 + col] : 0.0f;
}

// --- mbarriers, TMA and register rebalancing (the warp-specialized kernels) ---

// (smem_addr, mbar_init, mbar_expect_tx, mbar_try_wait, mbar_wait, mbar_wait_backoff, mbar_arrive:
// tensor/cuda_async.cuh)
using namespace lockstep::cuda::async;

// One arrival per warp (the barrier counts warps): lane 0 arrives once the warp's lanes are past
// __syncwarp. Used only to release stages that wgmma reads (each warp's wgmma.wait_group has seen
// those reads complete); a stage the threads read themselves is released by every thread, since
// compute-sanitizer racecheck does not order the other lanes' reads before lane 0's arrival.
__device__ __forceinline__ void mbar_arrive_warp(uint64_t* bar) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}
// 2-D TMA tile load (x = k element, y = row) into shared memory, completing bytes on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int x,
                                         int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Named barrier of the two consumer warpgroups (threads 128 .. 383).
__device__ __forceinline__ void consumer_bar() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// The output tiles of the persistent kernels: the row tiles of the groups in table order (a group
// of r rows has ceil(r / bm) of them, bm A rows each), each with xtiles W row tiles of bn rows.
// Unit u is row tile u / xtiles of that walk and W row tile u % xtiles (x fastest: the CTAs running
// together share A tiles). `units` bounds the count on the host, which may not know the groups'
// rows (device offsets): at most max_rows / bm row tiles per group, and at most (total_rows +
// groups (bm - 1)) / bm in all, since the groups' rows sum to at most total_rows. The second bound
// keeps the walk short when max_rows is loose (device offsets bounded only by the total).
struct TileSpace {
  int64_t xtiles, units;
  int bm, bn, groups;
};
inline TileSpace tile_space(const DeviceGroupTable& groups, int64_t n, int bm, int bn) {
  TileSpace ts;
  ts.xtiles = (n + bn - 1) / bn;
  const int64_t per_group = (groups.max_rows + bm - 1) / bm;
  const int64_t in_all = (groups.total_rows + int64_t(groups.groups) * (bm - 1)) / bm;
  ts.units = ts.xtiles * std::min(per_group * groups.groups, in_all);
  ts.bm = bm, ts.bn = bn, ts.groups = groups.groups;
  return ts;
}
// A CTA's walk over its units, which come in increasing order (u = blockIdx.x, + gridDim.x, ...):
// the cursor only moves forward through the group table, so a CTA reads each entry once. Each
// output tile is computed whole by one CTA, so the walk decides where a tile is computed, never
// its bits.
struct TileCursor {
  int z = -1;              // the group of the last tile found
  int64_t t0 = 0, tz = 0;  // row tiles before group z; row tiles of group z
  GemmGroupDesc g{};
  // Unit u -> its group, first A row m0 and first W row n0 (in the group); false past the last
  // tile (and for every later unit).
  __device__ __forceinline__ bool next(int64_t u, const GemmGroupDesc* groups, const TileSpace& ts,
                                       GemmGroupDesc& G, int64_t& m0, int64_t& n0) {
    const int64_t t = u / ts.xtiles;
    while (t >= t0 + tz) {
      if (z + 1 >= ts.groups) return false;
      t0 += tz;
      g = groups[++z];
      tz = (int64_t(g.rows) + ts.bm - 1) / ts.bm;
    }
    G = g;
    m0 = (t - t0) * ts.bm;
    n0 = (u % ts.xtiles) * ts.bn;
    return true;
  }
};

// Host: a 2-D tensor map (qgemm_wgmma_tma_cuda.cu) of a row-major [rows, cols] matrix of
// `elem_bytes` elements (bf16 or bytes), boxes of box_cols x box_rows, the given swizzle, zero fill
// past the matrix; throws GemmError when the driver refuses. tensor_maps_available(): the driver's
// encoder was found.
bool tensor_maps_available();
CUtensorMap tensor_map_2d(const void* base, int elem_bytes, int64_t rows, int64_t cols,
                          int box_cols, int box_rows, CUtensorMapSwizzle swizzle);
// Co-resident CTAs of a one-CTA-per-SM kernel with `smem` bytes of dynamic shared memory (sets the
// kernel's shared-memory limit).
int persistent_ctas(const void* kernel, int threads, int smem);

// The 128 "+f" operands of an m64n256 fp32 accumulator (the wgmma inline-asm wrappers).
#define LOCKSTEP_ACC128(d)                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),  \
      "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),  \
      "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),  \
      "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),  \
      "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),  \
      "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),          \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),         \
      "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),         \
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]),         \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// "%0, ..., %127": the accumulator list of those wrappers.
#define LOCKSTEP_ACC128_LIST                                                                    \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                       \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// wgmma.m64n128k16, bf16 x bf16 -> fp32, both operands K-major in shared memory; accumulate = 0
// starts from +0 (scale-d off).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db,
                                                 int accumulate) {
#if defined(LOCKSTEP_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
}

// wgmma.m64n32k16 with the operand layouts and accumulate flag of wgmma_m64n128k16 (the small-M
// kernel's narrower W tiles).
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t da, uint64_t db,
                                                int accumulate) {
#if defined(LOCKSTEP_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
}

// wgmma.m64n256k16, bf16 x bf16 -> fp32, both operands K-major in shared memory (descriptors).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
#if defined(LOCKSTEP_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" LOCKSTEP_ACC128_LIST
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : LOCKSTEP_ACC128(d)
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d, (void)da, (void)db;
  __trap();
#endif
}

}  // namespace lockstep::cuda::gemm_detail
