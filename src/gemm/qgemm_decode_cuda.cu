// The small-M (decode) CUDA GEMM: 1..16 rows of A per group against packed NVFP4 / MXFP8 / FP8
// or bf16 weights, limited by the bandwidth of streaming W. A block of nw warps (nw even, 4..16,
// chosen per call by the host so that the grid fills the GPU in about one wave: it is not part of
// the order) owns 16 nw rows of W (16 per warp) and one K slice (decode_slice_blocks: a function of
// K alone); each warp streams its rows' packed bytes with 16-byte loads through a rolling ring of
// registers (5 k-blocks of 128 deep for nvfp4, 3 for 8-bit codes, 2 for bf16: a slot is refilled as
// soon as it is consumed), dequantizes them exactly into bf16 (nvfp4: shared-memory pair table
// built from the codec; 8-bit codes: cvt.rn.f16x2.e4m3x2 / e5m2x2, then f16 -> f32 -> bf16, all
// exact; bf16 W as loaded) and runs bf16 mma.sync with fp32 accumulators. The slices of one row
// tile form one thread-block cluster (one block per slice), or, where such clusters would need more
// than one wave, run in one block (nw = slices x row warps: "whole-block mode"): either way the
// partials stay in shared memory and are summed in ascending slice order (through distributed
// shared memory between the blocks of a cluster; with one group and two slices rank 1 stores its
// partials into rank 0 and exits, and rank 0 sums them), then the epilogue (SwiGLU x router prob
// included: a block owns gate rows and the matching up rows) is applied in the same kernel: one
// launch, no workspace. Launched with programmatic dependent launch: a kernel builds its tables
// while the previous kernel in the stream finishes, and reads A and writes D only after
// griddepcontrol.wait; W too, unless w.preload (W is not written by work still running before it:
// GemmOperandView) lets it issue its first ring of W loads before the wait (timing only: the same
// loads, the same bits). The order depends on K only (docs/gemm.md "CUDA decode order"), so row i's
// bits do not depend on M, the block size or the other rows.
#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>

#include "qgemm_decode_kernel.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

// Co-resident clusters of (1, slices, 1) blocks of nw warps (the GPU's answer, cached per shape).
template <int kFmt, int kNT, int kMaxW, bool kBlk>
int active_clusters(int nw, int slices, int smem) {
  static std::mutex mu;
  static std::map<std::array<int, 3>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const std::array<int, 3> key{nw, slices, smem};
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto kern = decode_kernel<kFmt, kNT, kMaxW, kBlk>;
  int dev = 0, sms = 0, r = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (slices == 1) {
    LOCKSTEP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, kern, nw * 32, size_t(smem)));
    r *= sms;
  } else {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1, unsigned(slices), 1);
    cfg.blockDim = dim3(unsigned(nw * 32));
    cfg.dynamicSmemBytes = size_t(smem);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = unsigned(slices);
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&r, kern, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      r = sms / slices;  // conservative
    }
  }
  cache.emplace(key, r < 1 ? 1 : r);
  return r < 1 ? 1 : r;
}

template <int kFmt, int kNT, int kMaxW, bool kBlk>
void raise_smem_attr(int smem_max) {
  static int attr_smem = 0;  // per instantiation (per process; one device)
  if (smem_max > attr_smem) {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<kFmt, kNT, kMaxW, kBlk>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             smem_max));
    attr_smem = smem_max;
  }
}

template <int kFmt, int kNT>
void launch_decode_t(int slice_blocks, int slices, bool block_split, cudaStream_t stream,
                     const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                     const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out) {
  // Block size and split mode: only the schedule depends on them, never a row's order.
  // Block size: the nw whose grid needs the least time, modelled as waves x max(warps per SM in a
  // wave, kSaturatingWarps) (an SM with fewer warps is latency-bound, not faster); ties go to the
  // larger block (fewer copies of the tables and of A, fewer blocks).
  // Several slices: clusters, unless their grid needs more than one wave (clusters of 4 or more
  // blocks pack the GPCs unevenly: 8192x8192 ran in two) and whole-block mode (no cluster;
  // nw = slices x row warps; its A rows span all of K) fits in one (8192x8192 M = 1 about 1.3x
  // faster on the H200); where clusters take one wave they are faster (whole blocks take about
  // 220 KB of shared memory per SM, leaving little L1). block_split takes whole blocks wherever
  // they fit (kernel tests: the bits must not depend on the split).
  int sms = 0, dev = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t oc = ep.swiglu ? n / 2 : n;
  const int rows = int(groups.max_rows);
  int best_nw = 8, best_spb = 1, best_smem = 0;
  int64_t best_cost = -1, best_tiles = 0, best_waves = 0;
  auto consider = [&](int nw, int spb, int smem, int64_t per_tile, int64_t active_units,
                      int64_t units_per_tile) {
    const int64_t tiles = (oc + per_tile - 1) / per_tile;
    const int64_t units = tiles * groups.groups;  // clusters or blocks
    const int64_t waves = (units + active_units - 1) / active_units;
    const int64_t in_wave = (units < active_units ? units : active_units) * units_per_tile;
    const int64_t warps_per_sm = ((in_wave + sms - 1) / sms) * nw;
    const int64_t cost =
        waves * (warps_per_sm > kSaturatingWarps ? warps_per_sm : kSaturatingWarps);
    if (best_cost < 0 || cost < best_cost)
      best_cost = cost, best_nw = nw, best_spb = spb, best_tiles = tiles, best_smem = smem,
      best_waves = waves;
  };
  const int slots = decode_gathers(slices, int(groups.groups)) ? 2 : 1;
  for (int nw = kMaxWarps; nw >= 4; nw -= 2) {  // clusters (or one slice)
    const int smem = decode_smem_bytes(kFmt, kNT, nw, slice_blocks, slots);
    if (smem > kSmemLimit) continue;
    int64_t active = 0;
    if (nw <= 8) {
      raise_smem_attr<kFmt, kNT, 8, false>(smem);
      active = active_clusters<kFmt, kNT, 8, false>(nw, slices, smem);
    } else {
      raise_smem_attr<kFmt, kNT, 16, false>(smem);
      active = active_clusters<kFmt, kNT, 16, false>(nw, slices, smem);
    }
    consider(nw, 1, smem, ep.swiglu ? 8 * nw : 16 * nw, active, slices);
  }
  if (slices > 1 && (best_waves > 1 || block_split)) {
    const int c_nw = best_nw, c_smem = best_smem;
    const int64_t c_tiles = best_tiles, c_cost = best_cost;
    best_cost = -1;
    for (int r = kMaxWarps / slices; slices * r > 8;
         --r) {  // (instantiated for blocks of 9-16 warps)
      if (ep.swiglu && r % 2 != 0) continue;
      const int nw = slices * r;
      const int smem = decode_block_smem_bytes(kFmt, kNT, nw, slice_blocks, slices, rows);
      if (smem > kSmemLimit) continue;
      raise_smem_attr<kFmt, kNT, 16, true>(smem);
      const int64_t active = active_clusters<kFmt, kNT, 16, true>(nw, 1, smem);
      consider(nw, slices, smem, ep.swiglu ? 8 * r : 16 * r, active, 1);
    }
    // no whole-block grid that fits in one wave (or fits at all, when forced): the clusters
    if (best_cost < 0 || (best_waves > 1 && !block_split))
      best_nw = c_nw, best_spb = 1, best_smem = c_smem, best_tiles = c_tiles, best_cost = c_cost;
  }
  const int cluster = best_spb > 1 ? 1 : slices;
  const dim3 grid(unsigned(best_tiles), unsigned(cluster), unsigned(groups.groups));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(best_nw * 32));
  cfg.dynamicSmemBytes = size_t(best_smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = 1;
  attr[1].val.clusterDim.y = grid.y;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = grid.y > 1 ? 2 : 1;
  auto kern = best_spb > 1   ? decode_kernel<kFmt, kNT, 16, true>
              : best_nw <= 8 ? decode_kernel<kFmt, kNT, 8, false>
                             : decode_kernel<kFmt, kNT, 16, false>;
  LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, a, w, n, groups.device_table(), ep, out,
                                         slice_blocks, best_spb));
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool decode_fits(Format wf, int64_t K, int64_t max_rows) {
  if (K / 128 > (int64_t(1) << 20)) return false;  // (keeps the int arithmetic below in range)
  const int fmt = wf == Format::kNvfp4 ? kFmtNvfp4 : kFmtE4m3;
  return decode_smem_bytes(fmt, max_rows > 8 ? 2 : 1, 4, decode_slice_blocks(K)) <= kSmemLimit;
}

void launch_epilogue(const float* ws, int slices, int64_t rows_total, const GemmOperandView& a,
                     const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                     const DeviceEpilogue& ep, GemmOutView out, cudaStream_t stream) {
  if (groups.max_rows == 0 || groups.groups == 0) return;
  const int64_t oc = ep.swiglu ? n / 2 : n;
  const int threads = 256;
  const dim3 grid(unsigned((oc + threads - 1) / threads),
                  unsigned(std::min<int64_t>(groups.max_rows, 65535)), unsigned(groups.groups));
  epilogue_kernel<<<grid, threads, 0, stream>>>(ws, slices, rows_total, a, w, n,
                                                groups.device_table(), ep, out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_decode(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                   const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                   bool block_split, cudaStream_t stream) {
  // (partials live in shared memory: no scratch)
  const int64_t K = w.cols;
  if (K % 128 != 0 || groups.max_rows > kDecodeMaxRows)
    throw GemmError(cat("qgemm decode kernel: needs K % 128 == 0 (K = ", K, ") and <= ",
                        kDecodeMaxRows, " rows per group (max ", groups.max_rows, ")"));
  if (ep.swiglu && n % 2 != 0)
    throw GemmError(cat("qgemm decode kernel: SwiGLU needs an even N (N = ", n, ")"));
  if (groups.groups == 0 || groups.max_rows == 0 || n == 0 || K == 0) return;
  const int sb = decode_slice_blocks(K);
  const int fmt = w.format == Format::kNvfp4   ? kFmtNvfp4
                  : w.format == Format::kBf16  ? kFmtBf16
                  : w.elem == ElemCodec::kE5M2 ? kFmtE5m2
                                               : kFmtE4m3;
  const int nt = groups.max_rows > 8 ? 2 : 1;
  if (!decode_fits(w.format, K, groups.max_rows))
    throw GemmError(cat("qgemm decode kernel: K = ", K, " with ", groups.max_rows,
                        " rows per group needs ", decode_smem_bytes(fmt, nt, 4, sb),
                        " bytes of shared memory per block (max 227 KiB)"));
  const int slices = int((K / 128 + sb - 1) / sb);
  if (fmt == kFmtNvfp4 && nt == 1)
    launch_decode_t<kFmtNvfp4, 1>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
  if (fmt == kFmtNvfp4 && nt == 2)
    launch_decode_t<kFmtNvfp4, 2>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
  if (fmt == kFmtE4m3 && nt == 1)
    launch_decode_t<kFmtE4m3, 1>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
  if (fmt == kFmtE4m3 && nt == 2)
    launch_decode_t<kFmtE4m3, 2>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
  if (fmt == kFmtE5m2 && nt == 1)
    launch_decode_t<kFmtE5m2, 1>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
  if (fmt == kFmtE5m2 && nt == 2)
    launch_decode_t<kFmtE5m2, 2>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
  if (fmt == kFmtBf16 && nt == 1)
    launch_decode_t<kFmtBf16, 1>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
  if (fmt == kFmtBf16 && nt == 2)
    launch_decode_t<kFmtBf16, 2>(sb, slices, block_split, stream, a, w, n, groups, ep, out);
}

}  // namespace lockstep::cuda::gemm_detail
