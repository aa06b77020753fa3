// The Hopper wgmma GEMM over bf16 operands fed by TMA (part of QgemmKernel::kWgmma, sm_90a).
// Packed operands are first dequantized exactly into bf16 copies (the tiles' decode, one pass each;
// bf16 operands are read in place), then a persistent warp-specialized kernel multiplies them (one
// CTA per SM walking 128 x 256 output tiles): one producer thread issues the TMA loads (128-byte
// swizzled 64-wide k boxes) of a 4-stage shared-memory ring guarded by mbarriers, two consumer
// warpgroups of 64 rows each run wgmma.m64n256k16 and the epilogue. K is walked from 0 to K in fixed 64-wide steps (four k16 wgmma steps
// each, ascending) with no split-K, on fp32 accumulators that start at +0: the chain of each
// output element is the one of the in-loop kernel (qgemm_wgmma_cuda.cu) and depends on K only, so
// the two give the same bits (tested) and the choice between them (staged_wgmma_preferred: the
// bf16 copies must pay for themselves) never changes a result. Outer scales and the epilogue come
// last, from the registers (SwiGLU: through the fp32 workspace and the shared epilogue kernel).
// Tried and measured on the H200 (bf16 8192^3, this kernel ~0.82-0.94 of cuBLAS): 2-CTA clusters
// with the W tile multicast (no faster: the loads-only run gained 8 %, the full run nothing), 32-wide
// k steps with 9 stages (slower: more barrier round trips per byte).
#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)

#include <algorithm>

#include "qgemm_cuda.cuh"
#include "qgemm_wgmma_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kBM = 128, kBN = 256;
constexpr int kThreads = 384;  // warpgroup 0: producer; 1, 2: consumers (64 output rows each)
// A k step: 64 k of the A tile (128 rows) and of the W tile (256 rows), 128-byte swizzled rows.
constexpr int kBK = 64, kATile = kBM * kBK * 2, kWTile = kBN * kBK * 2, kStageBytes = kATile + kWTile;
constexpr int kStages = 4;
// ring + full / empty barriers + the tile's column outer scales and biases + alignment slack
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 2 * kBN * 4 + 1024;
static_assert(kSmemBytes <= 227 * 1024, "fits one CTA per SM");

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
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
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d, (void)da, (void)db;
  __trap();
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Block until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// 2-D TMA tile load (x = k element, y = row) into shared memory, completing bytes on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(dst)),
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

__device__ __forceinline__ void consumer_bar() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// Persistent: one CTA per SM (grid = co-resident CTAs). The tile space is (group z, A row tile y,
// W row tile x) with y below max_rows / 128; a CTA takes the tiles u = blockIdx.x, + gridDim.x,
// ... (x fastest: the CTAs running together share A tiles) and skips those whose rows start past
// their group. Rows of a TMA box past the group belong to the next group or are zero-filled past
// the tensor: they only reach output rows / columns that are not stored (each output element
// depends on its own A row and W row alone). The producer walks the tiles' k steps through the ring
// without a break, so the next tile's loads overlap this tile's epilogue.
struct TileSpace {
  int64_t xtiles, ytiles, units;
};

__global__ void __launch_bounds__(kThreads, 1)
    wgmma_staged_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                        GemmOperandView a, GemmOperandView w, int64_t n, const GemmGroupDesc* groups,
                        DeviceEpilogue ep, GemmOutView out, float* raw, TileSpace ts) {
#if defined(LOCKSTEP_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // the swizzle atom
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  float* s_ow = reinterpret_cast<float*>(empty + kStages);  // [256] column outer scales of the tile
  float* s_bias = s_ow + kBN;                                // [256] column biases
  const int tid = threadIdx.x, wg = tid >> 7;
  const int ktiles = int(a.cols / kBK);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * 128);  // every consumer thread releases the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Tile u -> its group, A row tile and W row tile; false when its rows start past the group.
  auto tile = [&](int64_t u, GemmGroupDesc& G, int64_t& m0, int64_t& n0) {
    const int64_t per_group = ts.xtiles * ts.ytiles;
    const int64_t z = u / per_group, rem = u % per_group;
    G = groups[z];
    m0 = (rem / ts.xtiles) * kBM;
    n0 = (rem % ts.xtiles) * kBN;
    return m0 < G.rows;
  };

  if (wg == 0) {  // producer: one thread issues every TMA load
    setmaxnreg_dec<40>();
    if (tid == 0) {
      int64_t it = 0;  // k steps issued so far (ring position and phase)
      for (int64_t u = blockIdx.x; u < ts.units; u += gridDim.x) {
        GemmGroupDesc G;
        int64_t m0, n0;
        if (!tile(u, G, m0, n0)) continue;
        const int ya = int(G.a_row0 + m0), yw = int(G.w_row0 + n0);
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const int s = int(it % kStages);
          if (it >= kStages) mbar_wait(&empty[s], uint32_t((it / kStages) - 1) & 1u);
          uint8_t* st = smem + s * kStageBytes;
          mbar_expect_tx(&full[s], kStageBytes);
          tma_load(st, &map_a, &full[s], kt * kBK, ya);
          tma_load(st + kATile, &map_w, &full[s], kt * kBK, yw);
        }
      }
    }
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1;  // tile rows [64 c, 64 c + 64)
  int64_t it = 0;
  for (int64_t u = blockIdx.x; u < ts.units; u += gridDim.x) {
    GemmGroupDesc G;
    int64_t m0, n0;
    if (!tile(u, G, m0, n0)) continue;
    float acc[kBN / 2];
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = int(it % kStages);
      mbar_wait(&full[s], uint32_t(it / kStages) & 1u);
      const uint8_t* st = smem + s * kStageBytes;
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kBK / 16; ++j)
        wgmma_m64n256k16(acc, smem_desc(st + c * 64 * 128 + j * 32), smem_desc(st + kATile + j * 32));
      wgmma_commit();
      wgmma_wait<1>();  // step it - 1 has finished reading its stage: release it
      if (kt > 0) mbar_arrive(&empty[(it - 1) % kStages]);
    }
    wgmma_wait<0>();
    mbar_arrive(&empty[(it - 1) % kStages]);
    // The tile's column outer scales and biases into shared memory (both warpgroups are past the
    // previous tile's epilogue at the first barrier).
    consumer_bar();
    stage_columns(tid - 128, n0, n, G, w, ep, s_ow, s_bias);
    consumer_bar();
    if (out.d_bf16)
      wgmma_epilogue<kBN, true>(acc, m0 + c * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow, s_bias);
    else
      wgmma_epilogue<kBN, false>(acc, m0 + c * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow, s_bias);
  }
#else
  (void)map_a, (void)map_w, (void)a, (void)w, (void)n, (void)groups, (void)ep, (void)out, (void)raw, (void)ts;
  __trap();
#endif
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, through the runtime (the library does not link libcuda).
EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    cudaGetLastError();
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// Tensor map of a row-major bf16 [rows, K] matrix, boxes of 64 k x box_rows rows, 128-byte swizzle
// (the wgmma descriptor's layout), zero fill past the matrix.
CUtensorMap bf16_map(const uint16_t* base, int64_t rows, int64_t k, int box_rows) {
  CUtensorMap m{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBK), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(base), dims, strides, box,
                               elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(cat("qgemm wgmma: cuTensorMapEncodeTiled failed (", int(r), ") for a [", rows, ", ", k,
                                 "] bf16 operand"));
  return m;
}

}  // namespace

constexpr int64_t kStagedMinRows = 256;  // average rows per group from which W is staged

bool staged_wgmma_preferred(const GemmOperandView& a, const GemmOperandView& w, const DeviceGroupTable& groups) {
  if (!encoder() || a.rows >= (int64_t(1) << 31) || w.rows >= (int64_t(1) << 31)) return false;
  for (const GemmOperandView* op : {&a, &w})  // TMA needs 16-byte aligned bases (the copies are)
    if (op->format == GemmFormat::kBf16 && reinterpret_cast<uintptr_t>(op->data) % 16 != 0) return false;
  if (w.format == GemmFormat::kBf16) return true;
  // A bf16 copy of W costs about 2.5 bytes per weight per call; the GEMM does 2 x rows flops per
  // weight. Measured on the H200 (grouped, 128 experts): at 128 rows per expert the in-loop kernel
  // is faster (FC1 592-669 us vs 692 us staged; FC2 322-357 vs 388), at 512 the staged one (FC1
  // 1218 vs 2153 us).
  return groups.groups > 0 && groups.total_rows >= kStagedMinRows * int64_t(groups.groups);
}

void launch_wgmma_staged(const GemmOperandView& a, const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                         const DeviceEpilogue& ep, GemmOutView out, DeviceBuffer& workspace, cudaStream_t stream) {
  const int64_t K = a.cols;
  const size_t a_bytes = bf16_copy_bytes(a);
  const size_t w_bytes = bf16_copy_bytes(w);
  const size_t raw_bytes = ep.swiglu ? size_t(groups.total_rows) * size_t(n) * sizeof(float) : 0;
  if (workspace.size() < a_bytes + w_bytes + raw_bytes) workspace.resize(a_bytes + w_bytes + raw_bytes);
  uint8_t* base = workspace.as<uint8_t>();
  const uint16_t* ab = dequantized(a, reinterpret_cast<uint16_t*>(base), stream);
  const uint16_t* wb = dequantized(w, reinterpret_cast<uint16_t*>(base + a_bytes), stream);
  float* raw = ep.swiglu ? reinterpret_cast<float*>(base + a_bytes + w_bytes) : nullptr;
  const CUtensorMap ma = bf16_map(ab, a.rows, K, kBM), mw = bf16_map(wb, w.rows, K, kBN);
  static const int ctas = [] {  // co-resident CTAs (one per SM), once per process (one device)
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(wgmma_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    int dev = 0, sms = 0, per_sm = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, wgmma_staged_kernel, kThreads, kSmemBytes));
    return std::max(1, sms * std::max(1, per_sm));
  }();
  TileSpace ts;
  ts.xtiles = (n + kBN - 1) / kBN;
  ts.ytiles = (groups.max_rows + kBM - 1) / kBM;
  ts.units = ts.xtiles * ts.ytiles * groups.groups;
  const unsigned grid = unsigned(std::min<int64_t>(ctas, ts.units));
  wgmma_staged_kernel<<<grid, kThreads, kSmemBytes, stream>>>(ma, mw, a, w, n, groups.table.as<GemmGroupDesc>(), ep,
                                                               out, raw, ts);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
