// The small-M Hopper wgmma GEMM (GemmVariant::kWgmmaSmallM / kWgmmaSmallMWide, sm_90a): 64 x 32
// (or 64 x 128) output tiles, one warpgroup of 128 threads, K walked from 0 to K in fixed 64-wide
// steps of four k16 wgmma steps (m64n32k16 / m64n128k16), ascending, fp32 accumulators from +0, no
// split-K: per output element the chain of the other wgmma kernels (the 128 x 128 in-loop kernel,
// the staged and W-in-registers ones). Built for decode and other calls with few rows per group,
// where a 128-row tile computes mostly padding rows, dequantizes them too and gives too few CTAs to
// keep the GPU busy (N = 1536 -> 12 CTAs of 128 columns, 48 of 32).
//
// Two tile widths: 32 columns (two CTAs per SM) give the most CTAs to calls with few output
// columns, where the per-step latency bounds the call; 128 columns (one CTA per SM, a deeper ring)
// move four times the W bytes per step and barrier, for calls wide enough to fill the GPU with them
// (a vocabulary head: 151,936 columns), where the bytes bound the call.
//
// Why the bits equal the other wgmma kernels' (docs/gemm.md, "wgmma kernels"): the operand values
// are the same bf16 numbers (the raw stages and the dequantization of qgemm_wgmma_raw_cuda.cuh, the
// functions the in-loop kernel runs), every element sees the same sequence of k16 instructions on
// the same accumulator, and the epilogue is the same function. What the kernels do not share is
// the instruction's N width (32 or 128 here, 128 / 256 elsewhere), the other rows and columns of
// the tile and, in the W-in-registers kernel, which operand is wgmma's A. That an element's
// accumulation in one wgmma does not depend on those is an assumption about the hardware, not a
// guarantee of the PTX ISA; the GPU tests check it bit for bit (lockstep_test_gpu --op
// gemm_small_m, both widths).
//
// Per 64-wide k step the CTA copies the packed bytes of its A rows (at most 64) and its W rows into
// a ring of shared-memory stages by cp.async (stages - 1 steps in flight), dequantizes only the
// live rows (rows past the group or past N stay zero) into one of three bf16 steps, and issues the
// wgmma of step k while it dequantizes step k + 1; one CTA barrier per step. The barrier waits
// for the wgmma of step k - 1 only, so the wgmma of step k runs on through the barrier and the next
// step's issue (on the H200 this moved no shape's time by more than 3%: the chain of dependent k16
// instructions does not bound a step). The instructions and their order on each accumulator are the
// same either way. Launched with programmatic dependent launch.
#include <algorithm>

#include "qgemm_cuda.cuh"
#include "qgemm_wgmma_cuda.cuh"
#include "qgemm_wgmma_raw_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kBM = 64, kBK = 64;
constexpr int kThreads = 128;       // one warpgroup
constexpr int kRowBytes = kBK * 2;  // 128 B: one swizzle row
constexpr int kNarrow = 32, kWide = 128;

// Shared memory per CTA: two CTAs per SM for 32-column tiles, one for 128-column tiles (228 KB of
// shared memory per SM, 1 KB reserved per CTA, at most 227 KB for one block).
template <int BN>
constexpr int smallm_smem_budget() {
  return BN == kNarrow ? 113 * 1024 : 226 * 1024;
}
template <int BN>
constexpr int smallm_tile_bytes() {  // one bf16 step: A tile, then W tile
  return (kBM + BN) * kRowBytes;
}
// bf16 steps: three (wgmma reads one, the next is dequantized, the wgmma of the step before may
// still read the third) where the shared memory leaves at least three raw stages beside them, else
// two (the wgmma of a step finishes before the barrier). The count never changes a bit.
template <Format FA, Format FW, int BN>
constexpr int smallm_fixed_bytes(int bf16_steps) {
  // the bf16 steps + tables + the tile's column outer scales and biases + alignment slack
  return bf16_steps * smallm_tile_bytes<BN>() + rep_lut_bytes(FA) + rep_lut_bytes(FW) +
         2 * int(sizeof(OperandLuts)) + 2 * BN * 4 + 1024;
}
template <Format FA, Format FW, int BN>
constexpr int smallm_raw_stage_bytes() {
  return raw_tile_bytes(FA, kBM) + raw_tile_bytes(FW, BN);
}
template <Format FA, Format FW, int BN>
constexpr int smallm_stages_with(int bf16_steps) {
  const int s = (smallm_smem_budget<BN>() - smallm_fixed_bytes<FA, FW, BN>(bf16_steps)) /
                smallm_raw_stage_bytes<FA, FW, BN>();
  return s < 16 ? s : 16;
}
template <Format FA, Format FW, int BN>
constexpr int smallm_bf16_steps() {
  return smallm_stages_with<FA, FW, BN>(3) >= 3 ? 3 : 2;
}
template <Format FA, Format FW, int BN>
constexpr int smallm_stages() {
  return smallm_stages_with<FA, FW, BN>(smallm_bf16_steps<FA, FW, BN>());
}
template <Format FA, Format FW, int BN>
constexpr int smallm_smem_bytes() {
  return smallm_fixed_bytes<FA, FW, BN>(smallm_bf16_steps<FA, FW, BN>()) +
         smallm_stages<FA, FW, BN>() * smallm_raw_stage_bytes<FA, FW, BN>();
}

// The k16 instruction of a BN-column tile.
template <int BN>
__device__ __forceinline__ void smallm_wgmma(float (&acc)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (BN == kNarrow)
    wgmma_m64n32k16(acc, da, db, 1);
  else
    wgmma_m64n128k16(acc, da, db, 1);
}

// grid: x = W row tiles of a group, y = A row tiles of a group, z = group.
template <Format FA, Format FW, int BN>
__global__ void __launch_bounds__(kThreads)
    wgmma_smallm_kernel(GemmOperandView a, GemmOperandView w, int64_t n,
                        const GemmGroupDesc* groups, DeviceEpilogue ep, GemmOutView out,
                        float* raw) {
  extern __shared__ uint8_t smem_raw[];
  pdl_wait();  // the group table, A, W and the output belong to earlier work in the stream
  const GemmGroupDesc G = groups[blockIdx.z];
  const int64_t m0 = int64_t(blockIdx.y) * kBM;
  if (m0 >= G.rows) return;
  constexpr int kBN = BN, kTileBytes = smallm_tile_bytes<BN>();
  constexpr int kBf16Steps = smallm_bf16_steps<FA, FW, BN>();
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  // bf16 steps on a 1024-byte boundary (the swizzle atom): [3 or 2][A 64 rows | W BN rows] x 128 B,
  // then the raw stages [kStages][A raw | W raw], then the tables, column scales and biases.
  uint8_t* smem =
      smem_raw + ((1024 - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  constexpr int raw_a = raw_tile_bytes(FA, kBM), raw_stage = smallm_raw_stage_bytes<FA, FW, BN>();
  constexpr int kStages = smallm_stages<FA, FW, BN>();
  static_assert(kStages >= 3, "at least two raw steps in flight");
  static_assert(smallm_smem_bytes<FA, FW, BN>() <= smallm_smem_budget<BN>(), "CTAs per SM");
  uint8_t* raws = smem + kBf16Steps * kTileBytes;
  uint32_t* rep_a = reinterpret_cast<uint32_t*>(raws + kStages * raw_stage);
  uint32_t* rep_w = rep_a + rep_lut_bytes(FA) / 4;
  OperandLuts& lut_a =
      *reinterpret_cast<OperandLuts*>(reinterpret_cast<uint8_t*>(rep_w) + rep_lut_bytes(FW));
  OperandLuts& lut_w = *(&lut_a + 1);
  float* s_ow = reinterpret_cast<float*>(&lut_w + 1);
  float* s_bias = s_ow + kBN;
  const int tid = threadIdx.x;

  const int64_t K = a.cols;
  const int ktiles = int(K / kBK);
  const int64_t a_valid = G.rows - m0, w_valid = n - n0;
  const int64_t a_live = a_valid < kBM ? a_valid : kBM, w_live = w_valid < kBN ? w_valid : kBN;
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
    dequant_tile<FA, kBM, kThreads, true>(a, rep_a, lut_a.scale, st, G.a_row0 + m0,
                                          int64_t(kt) * kBK, tile, tid, a_live);
    dequant_tile<FW, kBN, kThreads, true>(w, rep_w, lut_w.scale, st + raw_a, G.w_row0 + n0,
                                          int64_t(kt) * kBK, tile + kBM * kRowBytes, tid, w_live);
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  fill_luts<FA, FW, kThreads>(a, w, rep_a, rep_w, lut_a, lut_w, tid);
  // Rows that are never dequantized (past the group, past N) hold zeros in every bf16 step.
  for (int i = tid; i < kBf16Steps * kTileBytes / 16; i += kThreads)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  for (int cc = tid; cc < kBN; cc += kThreads) stage_columns(cc, n0, n, G, w, ep, s_ow, s_bias);
  cp_async_wait<kStages - 3>();  // this thread's copies of steps 0 and 1 have landed
  __syncthreads();               // and everyone's; tables and zeros
  dequant(0, smem);
  fence_proxy_async();
  __syncthreads();

  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;

  // Step kt: the wgmma of step kt runs while step kt + 1 is dequantized into bf16 step (kt + 1) %
  // kBf16Steps, last read by the wgmma of step kt + 1 - kBf16Steps, which every thread waited for
  // before the previous barrier. Raw step kt + 1 became visible at the previous barrier; the wait
  // before this step's barrier covers step kt + 2. The ring slot issued at step kt held step
  // kt - 1, dequantized before the previous barrier.
  for (int kt = 0; kt < ktiles; ++kt) {
    uint8_t* st = smem + (kt % kBf16Steps) * kTileBytes;
    issue(kt + kStages - 1);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kBK / 16; ++j)
      smallm_wgmma<BN>(acc, smem_desc(st + j * 32), smem_desc(st + kBM * kRowBytes + j * 32));
    wgmma_commit();
    if (kt + 1 < ktiles) {
      dequant(kt + 1, smem + ((kt + 1) % kBf16Steps) * kTileBytes);
      cp_async_wait<kStages - 3>();  // this thread's copies of step kt + 2 have landed
      fence_proxy_async();
      wgmma_wait<kBf16Steps - 2>();  // step kt + 2 - kBf16Steps's wgmma has read its bf16 step
      __syncthreads();
    }
  }
  wgmma_wait_all();
  cp_async_wait<0>();
  pdl_launch_dependents();

  if (out.d_bf16)
    wgmma_epilogue<kBN, true>(acc, m0, tid, n0, G, a, n, ep, out, raw, s_ow, s_bias);
  else
    wgmma_epilogue<kBN, false>(acc, m0, tid, n0, G, a, n, ep, out, raw, s_ow, s_bias);
}

template <Format FA, Format FW, int BN>
void launch_smallm_t(cudaStream_t stream, const GemmOperandView& a, const GemmOperandView& w,
                     int64_t n, const DeviceGroupTable& groups, const DeviceEpilogue& ep,
                     GemmOutView out, float* raw) {
  static bool attr_set = false;  // once per instantiation (per process; one device)
  constexpr int smem = smallm_smem_bytes<FA, FW, BN>();
  if (!attr_set) {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(wgmma_smallm_kernel<FA, FW, BN>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((groups.max_rows + kBM - 1) / kBM),
                  unsigned(groups.groups));
  launch_pdl(wgmma_smallm_kernel<FA, FW, BN>, grid, dim3(kThreads), size_t(smem), stream, a, w, n,
             groups.device_table(), ep, out, raw);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <Format FA, Format FW>
void launch_smallm_bn(int cols, cudaStream_t stream, const GemmOperandView& a,
                      const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                      const DeviceEpilogue& ep, GemmOutView out, float* raw) {
  if (cols == kWide)
    launch_smallm_t<FA, FW, kWide>(stream, a, w, n, groups, ep, out, raw);
  else
    launch_smallm_t<FA, FW, kNarrow>(stream, a, w, n, groups, ep, out, raw);
}

template <Format FA>
void launch_smallm_w(int cols, cudaStream_t stream, const GemmOperandView& a,
                     const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                     const DeviceEpilogue& ep, GemmOutView out, float* raw) {
  switch (w.format) {
    case Format::kNvfp4:
      return launch_smallm_bn<FA, Format::kNvfp4>(cols, stream, a, w, n, groups, ep, out, raw);
    case Format::kMxfp8:
      return launch_smallm_bn<FA, Format::kMxfp8>(cols, stream, a, w, n, groups, ep, out, raw);
    case Format::kFp8:
      return launch_smallm_bn<FA, Format::kFp8>(cols, stream, a, w, n, groups, ep, out, raw);
    default:
      return launch_smallm_bn<FA, Format::kBf16>(cols, stream, a, w, n, groups, ep, out, raw);
  }
}

int sm_count() {
  static const int sms = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v;
  }();
  return sms;
}

// Groups that hold rows: every group unless the host knows their sizes.
int64_t busy_groups(const DeviceGroupTable& groups) {
  if (!groups.on_host()) return groups.groups;
  return std::count_if(groups.host.begin(), groups.host.end(),
                       [](const GemmGroupDesc& g) { return g.rows > 0; });
}

// 128-column tiles once they give every SM (one CTA each) two tiles or more; below that the
// 32-column tiles' four times as many CTAs hide more of the per-step latency. The width never
// changes a bit.
int smallm_wgmma_cols(int64_t n, int64_t busy_tiles) {
  return (n + kWide - 1) / kWide * busy_tiles >= 2 * int64_t(sm_count()) ? kWide : kNarrow;
}

}  // namespace

// Up to 32 rows per group the small-M kernel dequantizes at most as many values per output column
// as the 128 x 128 in-loop kernel (which dequantizes all 128 A rows of its tile: (64 + 32) / 32 <=
// (128 + 128) / 128 per k), runs no padding warpgroup and gives 4x the CTAs. From 33 to 64 rows it
// dequantizes up to 1.5x as many values per column, which pays while the in-loop grid would not
// fill the GPU (latency-bound calls). Groups with no rows count only where the host knows them.
// Reasoned from the work per step, not measured per threshold; the choice never changes a bit.
bool smallm_wgmma_preferred(const DeviceGroupTable& groups, int64_t n) {
  if (groups.max_rows > kSmallMMaxRows) return false;
  if (groups.max_rows <= 32) return true;
  return (n + 127) / 128 * busy_groups(groups) < sm_count();
}

GemmVariant launch_wgmma_smallm(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                                const DeviceGroupTable& groups, const DeviceEpilogue& ep,
                                GemmOutView out, Scratch& scratch, GemmVariant route,
                                cudaStream_t stream) {
  float* raw = tile_grid_checks("wgmma small-M", kBM, groups, n, ep, scratch);
  const int cols =
      route == GemmVariant::kWgmmaSmallM ? kNarrow
      : route == GemmVariant::kWgmmaSmallMWide
          ? kWide
          : smallm_wgmma_cols(n, (groups.max_rows + kBM - 1) / kBM * busy_groups(groups));
  switch (a.format) {
    case Format::kNvfp4:
      launch_smallm_w<Format::kNvfp4>(cols, stream, a, w, n, groups, ep, out, raw);
      break;
    case Format::kMxfp8:
      launch_smallm_w<Format::kMxfp8>(cols, stream, a, w, n, groups, ep, out, raw);
      break;
    case Format::kFp8:
      launch_smallm_w<Format::kFp8>(cols, stream, a, w, n, groups, ep, out, raw);
      break;
    default:
      launch_smallm_w<Format::kBf16>(cols, stream, a, w, n, groups, ep, out, raw);
      break;
  }
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
  return cols == kWide ? GemmVariant::kWgmmaSmallMWide : GemmVariant::kWgmmaSmallM;
}

}  // namespace lockstep::cuda::gemm_detail
