// The Hopper tensor-core CUDA GEMM (GemmVariant::kWgmmaInloop, sm_90a): 128 x 128 output tiles, two
// warpgroups of 64 rows, K walked from 0 to K in fixed 64-wide steps (four k16 wgmma steps each,
// ascending) with no split-K, so every output element's fp32 chain depends on K only:
// batch-invariant for every M, like the tiled kernel (but a different chain from it). The packed
// bytes of each step are copied by cp.async into a ring of shared-memory stages (as many steps in
// flight as fit), then dequantized exactly into bf16 (the tiles' decode of qgemm_cuda.cuh, with
// lane-replicated tables) into two 128-byte-swizzled tiles; the dequantization of step k + 1 runs
// while the asynchronous wgmma of step k does. Formats are template parameters. Outer scales and
// the epilogue are applied last, as everywhere.
#include <cstdlib>
#include <string>

#include "qgemm_cuda.cuh"
#include "qgemm_wgmma_cuda.cuh"
#include "qgemm_wgmma_raw_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kBM = 128, kBK = 64;
constexpr int kThreads = 256;
constexpr int kRowBytes = kBK * 2;  // 128 B: one swizzle row
// Raw stages (qgemm_wgmma_raw_cuda.cuh): stages - 1 steps in flight, as many as fit, since packed
// steps are small and the latency under load is long.
constexpr int kSmemBudget = 227 * 1024;

template <int kBN>
constexpr int wgmma_tile_bytes() {
  return 2 * (kBM + kBN) * kRowBytes;  // two bf16 stages
}
template <Format FA, Format FW>
constexpr int wgmma_fixed_bytes(int tile_bytes) {
  // + column outer scales and biases (2 x 128 floats) + alignment slack
  return tile_bytes + rep_lut_bytes(FA) + rep_lut_bytes(FW) + 2 * int(sizeof(OperandLuts)) +
         2 * 128 * 4 + 1024;
}
template <int kBN, Format FA, Format FW>
constexpr int wgmma_stages() {
  const int fixed = wgmma_fixed_bytes<FA, FW>(wgmma_tile_bytes<kBN>());
  const int s = (kSmemBudget - fixed) / (raw_tile_bytes(FA, kBM) + raw_tile_bytes(FW, kBN));
  return s < 16 ? s : 16;
}
template <int kBN, Format FA, Format FW>
constexpr int wgmma_smem_bytes() {
  return wgmma_fixed_bytes<FA, FW>(wgmma_tile_bytes<kBN>()) +
         wgmma_stages<kBN, FA, FW>() * (raw_tile_bytes(FA, kBM) + raw_tile_bytes(FW, kBN));
}

template <int kBN>
__device__ __forceinline__ void wgmma_step(float (&acc)[kBN / 2], uint64_t da, uint64_t db) {
  static_assert(kBN == 128, "m64n128k16 only");
  wgmma_m64n128k16(acc, da, db, 1);
}

// grid: x = W row tiles of a group, y = A row tiles of a group, z = group.
template <int kBN, Format FA, Format FW>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(GemmOperandView a, GemmOperandView w, int64_t n, const GemmGroupDesc* groups,
                 DeviceEpilogue ep, GemmOutView out, float* raw) {
  extern __shared__ uint8_t smem_raw[];
  const GemmGroupDesc G = groups[blockIdx.z];
  const int64_t m0 = int64_t(blockIdx.y) * kBM;
  if (m0 >= G.rows) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  // bf16 tiles on a 1024-byte boundary (the swizzle atom): [2][A 128 rows | W kBN rows] x 128 B,
  // then the raw stages [kStages][A raw | W raw], then the lookup tables.
  uint8_t* smem =
      smem_raw + ((1024 - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
  constexpr int raw_a = raw_tile_bytes(FA, kBM), raw_stage = raw_a + raw_tile_bytes(FW, kBN);
  constexpr int kStages = wgmma_stages<kBN, FA, FW>();
  static_assert(kStages >= 3, "at least two raw steps in flight");
  uint8_t* raws = smem + wgmma_tile_bytes<kBN>();
  uint32_t* rep_a = reinterpret_cast<uint32_t*>(raws + kStages * raw_stage);
  uint32_t* rep_w = rep_a + rep_lut_bytes(FA) / 4;
  OperandLuts& lut_a =
      *reinterpret_cast<OperandLuts*>(reinterpret_cast<uint8_t*>(rep_w) + rep_lut_bytes(FW));
  OperandLuts& lut_w = *(&lut_a + 1);
  const int tid = threadIdx.x;
  fill_luts<FA, FW, kThreads>(a, w, rep_a, rep_w, lut_a, lut_w, tid);

  const int64_t K = a.cols;
  const int ktiles = int(K / kBK);
  const int64_t a_valid = G.rows - m0, w_valid = n - n0;
  auto issue = [&](int kt) {
    if (kt < ktiles) {
      uint8_t* st = raws + (kt % kStages) * raw_stage;
      issue_raw<FA, kBM, kThreads>(a, G.a_row0 + m0, a_valid, int64_t(kt) * kBK, st, tid);
      issue_raw<FW, kBN, kThreads>(w, G.w_row0 + n0, w_valid, int64_t(kt) * kBK, st + raw_a, tid);
    }
    cp_async_commit();  // possibly empty: keeps one group per step
  };
  auto dequant = [&](int kt, uint8_t* tile) {
    const uint8_t* st = raws + (kt % kStages) * raw_stage;
    dequant_tile<FA, kBM, kThreads>(a, rep_a, lut_a.scale, st, G.a_row0 + m0, int64_t(kt) * kBK,
                                    tile, tid);
    dequant_tile<FW, kBN, kThreads>(w, rep_w, lut_w.scale, st + raw_a, G.w_row0 + n0,
                                    int64_t(kt) * kBK, tile + kBM * kRowBytes, tid);
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
      wgmma_step<kBN>(acc, smem_desc(st + wg * 64 * kRowBytes + j * 32),
                      smem_desc(st + kBM * kRowBytes + j * 32));
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

  // Column outer scales and biases of the tile into shared memory, then the epilogue from
  // registers.
  float* s_ow = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(&lut_w + 1));
  float* s_bias = s_ow + kBN;
  for (int cc = tid; cc < kBN; cc += kThreads) stage_columns(cc, n0, n, G, w, ep, s_ow, s_bias);
  __syncthreads();
  if (out.d_bf16)
    wgmma_epilogue<kBN, true>(acc, m0 + wg * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow,
                              s_bias);
  else
    wgmma_epilogue<kBN, false>(acc, m0 + wg * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow,
                               s_bias);
}

template <int kBN, Format FA, Format FW>
void launch_wgmma_t(dim3 grid, cudaStream_t stream, const GemmOperandView& a,
                    const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                    const DeviceEpilogue& ep, GemmOutView out, float* raw) {
  static bool attr_set = false;  // once per instantiation (per process; one device)
  constexpr int smem = wgmma_smem_bytes<kBN, FA, FW>();
  if (!attr_set) {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(wgmma_kernel<kBN, FA, FW>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  wgmma_kernel<kBN, FA, FW>
      <<<grid, kThreads, smem, stream>>>(a, w, n, groups.device_table(), ep, out, raw);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <int kBN, Format FA>
void launch_wgmma_w(dim3 grid, cudaStream_t stream, const GemmOperandView& a,
                    const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                    const DeviceEpilogue& ep, GemmOutView out, float* raw) {
  switch (w.format) {
    case Format::kNvfp4:
      return launch_wgmma_t<kBN, FA, Format::kNvfp4>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kMxfp8:
      return launch_wgmma_t<kBN, FA, Format::kMxfp8>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kFp8:
      return launch_wgmma_t<kBN, FA, Format::kFp8>(grid, stream, a, w, n, groups, ep, out, raw);
    default:
      return launch_wgmma_t<kBN, FA, Format::kBf16>(grid, stream, a, w, n, groups, ep, out, raw);
  }
}

template <int kBN>
void launch_wgmma_bn(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                     const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                     float* raw, cudaStream_t stream) {
  const dim3 grid(unsigned((n + kBN - 1) / kBN), unsigned((groups.max_rows + kBM - 1) / kBM),
                  unsigned(groups.groups));
  switch (a.format) {
    case Format::kNvfp4:
      return launch_wgmma_w<kBN, Format::kNvfp4>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kMxfp8:
      return launch_wgmma_w<kBN, Format::kMxfp8>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kFp8:
      return launch_wgmma_w<kBN, Format::kFp8>(grid, stream, a, w, n, groups, ep, out, raw);
    default:
      return launch_wgmma_w<kBN, Format::kBf16>(grid, stream, a, w, n, groups, ep, out, raw);
  }
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

GemmVariant launch_wgmma(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                         const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                         Scratch& scratch, GemmVariant route, cudaStream_t stream) {
  const int64_t K = a.cols;
  if (!wgmma_supported(K))
    throw GemmError(
        cat("qgemm wgmma kernel: needs an sm_90 GPU and K % ", kBK, " == 0 (K = ", K, ")"));
  if (route == GemmVariant::kWgmmaSmallM || route == GemmVariant::kWgmmaSmallMWide ||
      (route == GemmVariant::kWgmma && smallm_wgmma_preferred(groups, n))) {
    // few rows per group: 64 x 32 or 64 x 128 tiles, the same chain
    if (groups.groups > 0 && groups.max_rows > 0 && n > 0)
      return launch_wgmma_smallm(a, w, n, groups, ep, out, scratch, route, stream);
    return route == GemmVariant::kWgmmaSmallMWide ? route : GemmVariant::kWgmmaSmallM;
  }
  if (const int tile = wreg_wgmma_tile(
          a, w, groups, route)) {  // the same chain, nvfp4 W decoded inside the kernel
    if (groups.groups > 0 && groups.max_rows > 0 && n > 0)
      launch_wgmma_wreg(tile, a, w, n, groups, ep, out, scratch, stream);
    return tile == 256 ? GemmVariant::kWgmmaWreg256 : GemmVariant::kWgmmaWreg128;
  }
  if (route == GemmVariant::kWgmmaStaged
          ? staged_wgmma_usable(a, w)
          : route != GemmVariant::kWgmmaInloop && staged_wgmma_preferred(a, w, groups)) {
    // the same chain on bf16 copies through TMA
    if (groups.groups > 0 && groups.max_rows > 0 && n > 0)
      launch_wgmma_staged(a, w, n, groups, ep, out, scratch, stream);
    return GemmVariant::kWgmmaStaged;
  }
  if (groups.groups == 0 || groups.max_rows == 0 || n == 0) return GemmVariant::kWgmmaInloop;
  float* raw = tile_grid_checks("wgmma", kBM, groups, n, ep, scratch);
  launch_wgmma_bn<128>(a, w, n, groups, ep, out, raw, stream);
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
  return GemmVariant::kWgmmaInloop;
}

}  // namespace lockstep::cuda::gemm_detail
