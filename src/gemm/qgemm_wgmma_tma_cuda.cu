// The Hopper wgmma GEMM over bf16 operands fed by TMA (GemmVariant::kWgmmaStaged, sm_90a).
// Packed operands are first dequantized exactly into bf16 copies (the tiles' decode, one pass each;
// bf16 operands are read in place), then a persistent warp-specialized kernel multiplies them (one
// CTA per SM walking 128 x 256 output tiles): one producer thread issues the TMA loads (128-byte
// swizzled 64-wide k boxes) of a 4-stage shared-memory ring guarded by mbarriers, two consumer
// warpgroups of 64 rows each run wgmma.m64n256k16 and the epilogue. K is walked from 0 to K in
// fixed 64-wide steps (four k16 wgmma steps each, ascending) with no split-K, on fp32 accumulators
// that start at +0: the chain of each output element is the one of the in-loop kernel
// (qgemm_wgmma_cuda.cu) and depends on K only, so the two give the same bits (tested) and the
// choice between them (staged_wgmma_preferred: the bf16 copies must pay for themselves) never
// changes a result. Outer scales and the epilogue come last, from the registers (SwiGLU: through
// fp32 scratch and the shared epilogue kernel).
#include <algorithm>

#include "qgemm_cuda.cuh"
#include "qgemm_wgmma_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kBM = 128, kBN = 256;
constexpr int kThreads = 384;  // warpgroup 0: producer; 1, 2: consumers (64 output rows each)
// A k step: 64 k of the A tile (128 rows) and of the W tile (256 rows), 128-byte swizzled rows.
constexpr int kBK = 64, kATile = kBM * kBK * 2, kWTile = kBN * kBK * 2,
              kStageBytes = kATile + kWTile;
constexpr int kStages = 4;
// ring + full / empty barriers + the tile's column outer scales and biases + alignment slack
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 2 * kBN * 4 + 1024;
static_assert(kSmemBytes <= 227 * 1024, "fits one CTA per SM");

// Persistent: one CTA per SM (grid = co-resident CTAs). A CTA takes the units u = blockIdx.x,
// + gridDim.x, ... of tile_space(groups, n, 128, 256) (x fastest: the CTAs running together share
// A tiles) and walks them with a TileCursor. Rows of a TMA box past the group belong to the next
// group or are zero-filled past the tensor: they only reach output rows / columns that are not
// stored (each output element depends on its own A row and W row alone). The producer walks the
// tiles' k steps through the ring without a break, so the next tile's loads overlap this tile's
// epilogue.

__global__ void __launch_bounds__(kThreads, 1)
    wgmma_staged_kernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_w, GemmOperandView a,
                        GemmOperandView w, int64_t n, const GemmGroupDesc* groups,
                        DeviceEpilogue ep, GemmOutView out, float* raw, TileSpace ts) {
#if defined(LOCKSTEP_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // the swizzle atom
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  float* s_ow = reinterpret_cast<float*>(empty + kStages);  // [256] column outer scales of the tile
  float* s_bias = s_ow + kBN;                               // [256] column biases
  const int tid = threadIdx.x, wg = tid >> 7;
  const int ktiles = int(a.cols / kBK);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * 4);  // every consumer warp releases the stage
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  pdl_launch_dependents();
  pdl_wait();  // the bf16 copies (and the group table) come from earlier work in the stream

  if (wg == 0) {  // producer: one thread issues every TMA load
    setmaxnreg_dec<40>();
    if (tid == 0) {
      int64_t it = 0;  // k steps issued so far (ring position and phase)
      TileCursor tiles;
      for (int64_t u = blockIdx.x; u < ts.units; u += gridDim.x) {
        GemmGroupDesc G;
        int64_t m0, n0;
        if (!tiles.next(u, groups, ts, G, m0, n0)) continue;
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
  TileCursor tiles;
  for (int64_t u = blockIdx.x; u < ts.units; u += gridDim.x) {
    GemmGroupDesc G;
    int64_t m0, n0;
    if (!tiles.next(u, groups, ts, G, m0, n0)) continue;
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
        wgmma_m64n256k16(acc, smem_desc(st + c * 64 * 128 + j * 32),
                         smem_desc(st + kATile + j * 32));
      wgmma_commit();
      wgmma_wait<1>();  // step it - 1 has finished reading its stage: release it
      if (kt > 0) mbar_arrive_warp(&empty[(it - 1) % kStages]);
    }
    wgmma_wait<0>();
    mbar_arrive_warp(&empty[(it - 1) % kStages]);
    // The tile's column outer scales and biases into shared memory (both warpgroups are past the
    // previous tile's epilogue at the first barrier).
    consumer_bar();
    stage_columns(tid - 128, n0, n, G, w, ep, s_ow, s_bias);
    consumer_bar();
    if (out.d_bf16)
      wgmma_epilogue<kBN, true>(acc, m0 + c * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow,
                                s_bias);
    else
      wgmma_epilogue<kBN, false>(acc, m0 + c * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow,
                                 s_bias);
  }
#else
  (void)map_a, (void)map_w, (void)a, (void)w, (void)n, (void)groups, (void)ep, (void)out, (void)raw,
      (void)ts;
  __trap();
#endif
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, through the runtime (the library does not link libcuda).
EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    cudaGetLastError();
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

}  // namespace

bool tensor_maps_available() { return encoder() != nullptr; }

CUtensorMap tensor_map_2d(const void* base, int elem_bytes, int64_t rows, int64_t cols,
                          int box_cols, int box_rows, CUtensorMapSwizzle swizzle) {
  CUtensorMap m{};
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * cuuint64_t(elem_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encoder()(
      &m, elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
      const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw GemmError(cat("qgemm wgmma: cuTensorMapEncodeTiled failed (", int(r), ") for a [", rows,
                        ", ", cols, "] x ", elem_bytes, "-byte operand"));
  return m;
}

int persistent_ctas(const void* kernel, int threads, int smem) {
  LOCKSTEP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int dev = 0, sms = 0, per_sm = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  LOCKSTEP_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return std::max(1, sms * std::max(1, per_sm));
}

constexpr int64_t kStagedMinRows = 256;  // average rows per group from which W is staged

bool staged_wgmma_usable(const GemmOperandView& a, const GemmOperandView& w) {
  if (!tensor_maps_available() || a.rows >= (int64_t(1) << 31) || w.rows >= (int64_t(1) << 31))
    return false;
  for (const GemmOperandView* op : {&a, &w})  // TMA needs 16-byte aligned bases (the copies are)
    if (op->format == Format::kBf16 && reinterpret_cast<uintptr_t>(op->data) % 16 != 0)
      return false;
  return true;
}

bool staged_wgmma_preferred(const GemmOperandView& a, const GemmOperandView& w,
                            const DeviceGroupTable& groups) {
  if (!staged_wgmma_usable(a, w)) return false;
  if (w.format == Format::kBf16) return true;
  // A bf16 copy of W costs about 2.5 bytes per weight per call; the GEMM does 2 x rows flops per
  // weight. Measured on the H200 (grouped, 128 experts): at 128 rows per expert the in-loop kernel
  // is faster (FC1 592-669 us vs 692 us staged; FC2 322-357 vs 388), at 512 the staged one (FC1
  // 1218 vs 2153 us).
  return groups.groups > 0 && groups.total_rows >= kStagedMinRows * int64_t(groups.groups);
}

void launch_wgmma_staged(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                         const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                         Scratch& scratch, cudaStream_t stream) {
  const int64_t K = a.cols;
  const size_t a_bytes = bf16_copy_bytes(a);
  const size_t w_bytes = bf16_copy_bytes(w);
  const size_t raw_bytes = ep.swiglu ? size_t(groups.total_rows) * size_t(n) * sizeof(float) : 0;
  uint8_t* base = static_cast<uint8_t*>(scratch.bytes(a_bytes + w_bytes + raw_bytes));
  const uint16_t* ab = dequantized(a, reinterpret_cast<uint16_t*>(base), stream);
  const uint16_t* wb = dequantized(w, reinterpret_cast<uint16_t*>(base + a_bytes), stream);
  float* raw = ep.swiglu ? reinterpret_cast<float*>(base + a_bytes + w_bytes) : nullptr;
  const CUtensorMap ma = tensor_map_2d(ab, 2, a.rows, K, kBK, kBM, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap mw = tensor_map_2d(wb, 2, w.rows, K, kBK, kBN, CU_TENSOR_MAP_SWIZZLE_128B);
  // co-resident CTAs (one per SM), once per process (one device)
  static const int ctas =
      persistent_ctas(reinterpret_cast<const void*>(wgmma_staged_kernel), kThreads, kSmemBytes);
  const TileSpace ts = tile_space(groups, n, kBM, kBN);
  const unsigned grid = unsigned(std::min<int64_t>(ctas, ts.units));
  // Programmatic dependent launch: the CTAs start (barriers) while the dequantize passes finish.
  launch_pdl(wgmma_staged_kernel, dim3(grid), dim3(kThreads), size_t(kSmemBytes), stream, ma, mw, a,
             w, n, groups.device_table(), ep, out, raw, ts);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
