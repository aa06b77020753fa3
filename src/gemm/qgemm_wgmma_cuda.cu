// The Hopper tensor-core CUDA GEMM (QgemmKernel::kWgmma, sm_90a): 128 x kBN output tiles, K walked
// from 0 to K in fixed 64-wide steps (four k16 wgmma steps each, ascending), no split-K, so every
// output element's fp32 chain depends on K only: batch-invariant for every M, like the tiled
// kernel (but a different chain from it). Both operands are dequantized exactly into bf16 (the
// tiles' decode of qgemm_cuda.cuh) into 128-byte-swizzled shared memory, two stages: while the
// asynchronous wgmma of stage k runs, the threads load and dequantize stage k + 1. Two warpgroups,
// each owning 64 rows of the tile. Outer scales and the epilogue are applied last, as everywhere.
#include "qgemm_cuda.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOCKSTEP_WGMMA 1
#endif

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kBM = 128, kBK = 64;
constexpr int kThreads = 256;
constexpr int kRowBytes = kBK * 2;  // 128 B: one swizzle row

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
#if defined(LOCKSTEP_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
#if defined(LOCKSTEP_WGMMA)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(accumulate));
#else
  (void)d, (void)da, (void)db, (void)accumulate;
  __trap();
#endif
}

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
__device__ __forceinline__ void wgmma_wait_all() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Shared-memory writes of the generic proxy become visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(LOCKSTEP_WGMMA)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// wgmma shared-memory descriptor of a K-major bf16 tile with 128-byte swizzle: rows of 128 bytes,
// 8-row atoms of 1024 bytes (stride byte offset), start address >> 4 in bits 0-13, leading byte
// offset (unused by this layout) 16 B, layout type 1 (128B swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Byte offset of 16-byte chunk c (0..7, k = 8c .. 8c + 7) of tile row r in the swizzled layout.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * kRowBytes + ((c ^ (r & 7)) << 4)); }

// ---- raw stages: packed bytes of one 64-wide k step of the A and W tiles, copied with cp.async
// (kStages - 1 steps in flight), then dequantized from shared memory into the swizzled bf16 tiles.
constexpr int kStages = 4;

__device__ __forceinline__ void cp_async(void* dst, const void* src, int src_bytes, int bytes_const16) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  if (bytes_const16 == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Bytes of one tile row's 64 k-values, and the elements one block scale covers (0: none).
__device__ __host__ inline int raw_row_bytes(GemmFormat f) {
  return f == GemmFormat::kNvfp4 ? 32 : f == GemmFormat::kBf16 ? 128 : 64;
}
__device__ __host__ inline int scale_block(GemmFormat f) {
  return f == GemmFormat::kNvfp4 ? 16 : f == GemmFormat::kMxfp8 ? 32 : 0;
}
// Raw stage of one operand tile: [rows][row bytes] data, then [rows][4] scale words.
__device__ __host__ inline int raw_tile_bytes(GemmFormat f, int rows) {
  return rows * raw_row_bytes(f) + (scale_block(f) ? rows * 4 : 0);
}

// Issue the cp.async copies of tile rows [0, rows) (global rows row0 + r, valid below `valid`)
// for k in [k0, k0 + 64). Rows past `valid` are zero-filled. A block-scale word is the aligned 4
// bytes holding the row's scales (nvfp4: exactly its 4; mxfp8: its 2 at byte (offset & 3)).
__device__ __forceinline__ void issue_raw(const GemmOperandView& op, int rows, int64_t row0, int64_t valid,
                                          int64_t k0, uint8_t* dst, int tid) {
  const int rb = raw_row_bytes(op.format), cpr = rb / 16;
  const int64_t K = op.cols;
  const uint8_t* base = static_cast<const uint8_t*>(op.data);
  const int64_t row_stride = K * rb / 64, k_off = k0 * rb / 64;
  for (int i = tid; i < rows * cpr; i += kThreads) {
    const int r = i / cpr, c = i % cpr;
    const bool ok = r < valid;
    cp_async(dst + r * rb + c * 16, base + (row0 + (ok ? r : 0)) * row_stride + k_off + c * 16, ok ? 16 : 0, 16);
  }
  const int sb = scale_block(op.format);
  if (sb) {
    uint8_t* sdst = dst + rows * rb;
    const int64_t spr = K / sb, total = op.rows * spr;
    for (int r = tid; r < rows; r += kThreads) {
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

// Dequantize the thread's 32 k-values [32 half, +32) of tile row `row` from the raw stage into
// the swizzled bf16 tile.
__device__ __forceinline__ void dequant_row(const GemmOperandView& op, const OperandLuts& lut, const uint8_t* raw,
                                            int rows, int64_t grow, int64_t k0, uint8_t* tile, int row, int half) {
  const int rb = raw_row_bytes(op.format);
  const uint8_t* rd = raw + row * rb;
  uint32_t sw = 0;
  int sshift = 0;
  if (scale_block(op.format)) {
    sw = *reinterpret_cast<const uint32_t*>(raw + rows * rb + row * 4);
    if (op.format == GemmFormat::kMxfp8) sshift = int(((grow * (op.cols / 32)) + k0 / 32) & 3);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int kk = half * 32 + i * 16;  // first k of the 16-value piece within the step
    RawTile t;
    t.valid = true;
    t.v[0] = t.v[1] = make_uint4(0, 0, 0, 0);
    t.scale = 0;
    if (op.format == GemmFormat::kNvfp4) {
      const uint2 x = *reinterpret_cast<const uint2*>(rd + kk / 2);
      t.v[0].x = x.x, t.v[0].y = x.y;
      t.scale = (sw >> (8 * (kk / 16))) & 0xFF;
    } else if (op.format == GemmFormat::kBf16) {
      t.v[0] = *reinterpret_cast<const uint4*>(rd + kk * 2);
      t.v[1] = *reinterpret_cast<const uint4*>(rd + kk * 2 + 16);
    } else {
      t.v[0] = *reinterpret_cast<const uint4*>(rd + kk);
      if (op.format == GemmFormat::kMxfp8) t.scale = (sw >> (8 * (sshift + kk / 32))) & 0xFF;
    }
    uint32_t o[8];
    dequant16(op, lut, t, o);
    const int c = half * 4 + i * 2;
    *reinterpret_cast<uint4*>(tile + swz(row, c)) = make_uint4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<uint4*>(tile + swz(row, c + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

template <int kBN>
constexpr int wgmma_tile_bytes() {
  return 2 * (kBM + kBN) * kRowBytes;  // two bf16 stages
}
template <int kBN>
int wgmma_smem_bytes(GemmFormat fa, GemmFormat fw) {
  return wgmma_tile_bytes<kBN>() + kStages * (raw_tile_bytes(fa, kBM) + raw_tile_bytes(fw, kBN)) +
         2 * int(sizeof(OperandLuts)) + 1024;  // + alignment slack
}

template <int kBN>
__device__ __forceinline__ void wgmma_step(float (&acc)[kBN / 2], uint64_t da, uint64_t db) {
  if constexpr (kBN == 128)
    wgmma_m64n128k16(acc, da, db, 1);
  else
    wgmma_m64n256k16(acc, da, db, 1);
}

// grid: x = W row tiles of a group, y = A row tiles of a group, z = group.
template <int kBN>
__global__ void __launch_bounds__(kThreads, 1) wgmma_kernel(GemmOperandView a, GemmOperandView w, int64_t n,
                                                            const GemmGroupDesc* groups, DeviceEpilogue ep,
                                                            GemmOutView out, float* raw) {
  extern __shared__ uint8_t smem_raw[];
  const GemmGroupDesc G = groups[blockIdx.z];
  const int64_t m0 = int64_t(blockIdx.y) * kBM;
  if (m0 >= G.rows) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  // bf16 tiles on a 1024-byte boundary (the swizzle atom): [2][A 128 rows | W kBN rows] x 128 B,
  // then the raw stages [kStages][A raw | W raw], then the lookup tables.
  uint8_t* smem = smem_raw + ((1024 - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
  const int raw_a = raw_tile_bytes(a.format, kBM), raw_stage = raw_a + raw_tile_bytes(w.format, kBN);
  uint8_t* raws = smem + wgmma_tile_bytes<kBN>();
  OperandLuts& lut_a = *reinterpret_cast<OperandLuts*>(raws + kStages * raw_stage);
  OperandLuts& lut_w = *reinterpret_cast<OperandLuts*>(raws + kStages * raw_stage + sizeof(OperandLuts));
  const int tid = threadIdx.x;
  lut_a.pair[tid] = pair_entry(a.format, a.elem, uint32_t(tid));
  lut_w.pair[tid] = pair_entry(w.format, w.elem, uint32_t(tid));
  lut_a.scale[tid] = scale_entry(a.format, uint32_t(tid));
  lut_w.scale[tid] = scale_entry(w.format, uint32_t(tid));

  const int64_t K = a.cols;
  const int ktiles = int(K / kBK);
  const int64_t a_valid = G.rows - m0, w_valid = n - n0;
  auto issue = [&](int kt) {
    if (kt < ktiles) {
      uint8_t* st = raws + (kt % kStages) * raw_stage;
      issue_raw(a, kBM, G.a_row0 + m0, a_valid, int64_t(kt) * kBK, st, tid);
      issue_raw(w, kBN, G.w_row0 + n0, w_valid, int64_t(kt) * kBK, st + raw_a, tid);
    }
    cp_async_commit();  // possibly empty: keeps one group per step
  };
  constexpr int kWRows = kBN / 128;  // W rows per thread per step
  const int lr = tid >> 1, half = tid & 1;
  auto dequant = [&](int kt, uint8_t* tile) {
    const uint8_t* st = raws + (kt % kStages) * raw_stage;
    dequant_row(a, lut_a, st, kBM, G.a_row0 + m0 + lr, int64_t(kt) * kBK, tile, lr, half);
#pragma unroll
    for (int p = 0; p < kWRows; ++p)
      dequant_row(w, lut_w, st + raw_a, kBN, G.w_row0 + n0 + p * 128 + lr, int64_t(kt) * kBK, tile + kBM * kRowBytes,
                  p * 128 + lr, half);
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  cp_async_wait<kStages - 2>();
  __syncthreads();  // luts, raw step 0
  dequant(0, smem);
  fence_proxy_async();
  __syncthreads();

  const int wg = tid >> 7;  // warpgroup: tile rows [64 wg, 64 wg + 64)
  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;

  for (int kt = 0; kt < ktiles; ++kt) {
    uint8_t* st = smem + (kt & 1) * kStageBytes;
    issue(kt + kStages - 1);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kBK / 16; ++j)
      wgmma_step<kBN>(acc, smem_desc(st + wg * 64 * kRowBytes + j * 32), smem_desc(st + kBM * kRowBytes + j * 32));
    wgmma_commit();
    if (kt + 1 < ktiles) {
      cp_async_wait<kStages - 2>();  // this thread's copies of step kt + 1 have landed
      __syncthreads();               // and everyone's
      dequant(kt + 1, smem + ((kt + 1) & 1) * kStageBytes);
      fence_proxy_async();
    }
    wgmma_wait_all();
    __syncthreads();
  }
  cp_async_wait<0>();

  // acc[4i + q]: row 16 (warp in group) + lane / 4 (+ 8 for q >= 2), column 8i + 2 (lane % 4) + (q & 1).
  const int t = tid & 127, lane = t & 31;
  const int64_t rbase = m0 + wg * 64 + (t >> 5) * 16 + (lane >> 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = rbase + h * 8;
    if (r >= G.rows) continue;
    const int64_t orow = G.a_row0 + r;
    const float oa = outer_of(a, orow);
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t c = n0 + i * 8 + 2 * (lane & 3) + e;
        if (c >= n) continue;
        const float v = acc[4 * i + 2 * h + e];
        if (raw) {
          raw[orow * n + c] = v;
        } else {
          const float y = r < G.tokens ? epilogue_value(v, oa, outer_of(w, G.w_row0 + c), ep, G.w_row0 + c) : 0.0f;
          store_out(out, orow * n + c, y);
        }
      }
    }
  }
}

template <int kBN>
void launch_wgmma_t(dim3 grid, cudaStream_t stream, const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                    const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out, float* raw) {
  static bool attr_set = false;  // once per instantiation (per process; one device): the largest case
  const int smem = wgmma_smem_bytes<kBN>(a.format, w.format);
  if (!attr_set) {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(wgmma_kernel<kBN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             wgmma_smem_bytes<kBN>(GemmFormat::kBf16, GemmFormat::kBf16)));
    attr_set = true;
  }
  wgmma_kernel<kBN><<<grid, kThreads, smem, stream>>>(a, w, n, groups.table.as<GemmGroupDesc>(), ep, out, raw);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool wgmma_supported(int64_t k) {
  if (k % kBK != 0) return false;
  static const int cc = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major * 10 + minor;
  }();
  return cc == 90;
}

void launch_wgmma(const GemmOperandView& a, const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                  const DeviceEpilogue& ep, GemmOutView out, DeviceBuffer& workspace, cudaStream_t stream) {
  const int64_t K = a.cols;
  if (!wgmma_supported(K))
    throw GemmError(cat("qgemm wgmma kernel: needs an sm_90 GPU and K % ", kBK, " == 0 (K = ", K, ")"));
  if (groups.groups == 0 || groups.max_rows == 0 || n == 0) return;
  if ((groups.max_rows + kBM - 1) / kBM > 65535)
    throw GemmError(cat("qgemm wgmma kernel: ", groups.max_rows, " rows per group is too many (max ", 65535 * kBM, ")"));
  float* raw = nullptr;
  if (ep.swiglu) {  // SwiGLU pairs columns c and N/2 + c, which live in different tiles
    const size_t need = size_t(groups.total_rows) * size_t(n) * sizeof(float);
    if (workspace.size() < need) workspace.resize(need);
    raw = workspace.as<float>();
  }
  constexpr int kBN = 128;
  const dim3 grid(unsigned((n + kBN - 1) / kBN), unsigned((groups.max_rows + kBM - 1) / kBM), unsigned(groups.groups));
  launch_wgmma_t<kBN>(grid, stream, a, w, n, groups, ep, out, raw);
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
