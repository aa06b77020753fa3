// Host side of the CUDA GEMM kernels (qgemm_cuda_types.h): group tables (from host offsets through
// kernel parameters, or built on the device), the kernel policy, the one launch entry and the row
// amax of the output. Nothing here waits for the device.
#include <algorithm>

#include "lockstep/quant/scale_access.h"
#include "qgemm_cuda.cuh"

namespace lockstep::cuda {
namespace {

static_assert(sizeof(GemmGroupDesc) == 24, "six 32-bit words");

// Group e's descriptor from device offsets; a group with more rows than the caller's bound,
// decreasing offsets, offsets not starting at 0 / ending at total_rows or tokens outside 0..rows
// trap.
__device__ GemmGroupDesc group_desc(const int64_t* off, int e, int groups, const int64_t* tokens,
                                    int64_t n_per_group, int64_t max_rows, int64_t total_rows) {
  const int64_t r0 = off[e], rows = off[e + 1] - r0;
  const int64_t tok = tokens ? tokens[e] : rows;
  if (rows < 0 || rows > max_rows || (e == 0 && r0 != 0) ||
      (e == groups - 1 && off[e + 1] != total_rows) || tok < 0 || tok > rows)
    __trap();
  return GemmGroupDesc{r0, int64_t(e) * n_per_group, int32_t(rows), int32_t(tok)};
}

// desc[e] = group e (more than kCompactGroups groups).
__global__ void group_table_kernel(const int64_t* off, int groups, const int64_t* tokens,
                                   int64_t n_per_group, int64_t max_rows, int64_t total_rows,
                                   GemmGroupDesc* out) {
  const int e = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= groups) return;
  out[e] = group_desc(off, e, groups, tokens, n_per_group, max_rows, total_rows);
}

// Up to kCompactGroups groups, one block of a thread per group: the groups with rows first, in
// ascending order, then the empty ones, so that a grid over the first min(groups, total_rows)
// entries visits every group with rows (a decode step's 8 busy experts of 128 launch 8 groups'
// tiles, not 128 of which 120 exit). Each group's descriptor carries its own rows (a_row0,
// w_row0), so which entry holds it changes no result.
constexpr int kCompactGroups = 1024;
__global__ void group_table_compact_kernel(const int64_t* off, int groups, const int64_t* tokens,
                                           int64_t n_per_group, int64_t max_rows,
                                           int64_t total_rows, GemmGroupDesc* out) {
  __shared__ int per_warp[kCompactGroups / 32];
  const int e = int(threadIdx.x), lane = e & 31, warp = e >> 5;
  GemmGroupDesc d{};
  if (e < groups) d = group_desc(off, e, groups, tokens, n_per_group, max_rows, total_rows);
  const bool busy = e < groups && d.rows > 0;
  const unsigned ballot = __ballot_sync(0xFFFFFFFFu, busy);
  if (lane == 0) per_warp[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u)), busy_total = 0;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) {
    if (w < warp) before += per_warp[w];
    busy_total += per_warp[w];
  }
  if (e < groups) out[busy ? before : busy_total + (e - before)] = d;
}

// Row amax (amax_fold: NaN ignored, only NaN gives NaN, no columns gives 0): one block per row.
__global__ void row_amax_kernel(const void* d, bool bf16, int64_t cols, float* amax) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float a = num::amax_empty();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = bf16 ? num::bf16_to_f32(static_cast<const uint16_t*>(d)[r * cols + c])
                         : static_cast<const float*>(d)[r * cols + c];
    a = num::fmax_f32(a, num::abs_f32(v));
  }
  for (int o = 16; o > 0; o >>= 1) a = num::fmax_f32(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = num::amax_empty();
    for (int w = 0; w < int(blockDim.x >> 5); ++w) m = num::fmax_f32(m, red[w]);
    amax[r] = cols == 0 ? 0.0f : (num::is_nan(m) ? num::f32_from_bits(0x7FC00000u) : m);
  }
}

// Zero raw accumulators then the epilogue: the GEMM of K = 0 (every acc is +0).
__global__ void zero_f32_kernel(float* p, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = 0.0f;
}

// bf16 W only with device offsets (a decode step's experts), which the cuBLAS path cannot take and
// where the alternative is the small-M wgmma kernel; with host offsets cuBLAS streams bf16 W at
// bandwidth already.
bool decode_takes(Format wf, int64_t k, const DeviceGroupTable& groups) {
  return groups.max_rows <= gemm_detail::kDecodeMaxRows && k % 128 == 0 &&
         (wf != Format::kBf16 || !groups.on_host()) &&
         gemm_detail::decode_fits(wf, k, groups.max_rows);
}

}  // namespace

DeviceGroupTable make_group_table(std::span<const int64_t> offsets, int64_t n_per_group,
                                  std::span<const int64_t> group_rows, Device device,
                                  Stream stream) {
  if (offsets.size() < 2 || offsets.front() != 0)
    throw GemmError(gemm_detail::cat("group offsets need >= 2 entries starting at 0 (got ",
                                     offsets.size(), ")"));
  DeviceGroupTable t;
  t.groups = int(offsets.size() - 1);
  t.host.resize(size_t(t.groups));
  for (int e = 0; e < t.groups; ++e) {
    const int64_t rows = offsets[size_t(e + 1)] - offsets[size_t(e)];
    if (rows < 0) throw GemmError(gemm_detail::cat("group offsets decrease at group ", e));
    if (rows > INT32_MAX)
      throw GemmError(gemm_detail::cat("group ", e, " has ", rows, " rows (max ", INT32_MAX, ")"));
    t.host[size_t(e)] = GemmGroupDesc{offsets[size_t(e)], int64_t(e) * n_per_group, int32_t(rows),
                                      int32_t(group_rows.empty() ? rows : group_rows[size_t(e)])};
    t.max_rows = std::max(t.max_rows, rows);
  }
  t.total_rows = offsets.back();
  t.device = device;
  t.stream = stream;
  return t;
}

const GemmGroupDesc* DeviceGroupTable::device_table() const {
  if (table || host.empty()) return table;
  storage =
      Tensor::empty(DType::kU8, {int64_t(host.size() * sizeof(GemmGroupDesc)) + 1}, device, stream);
  upload_words(reinterpret_cast<const uint32_t*>(host.data()),
               host.size() * sizeof(GemmGroupDesc) / 4, storage.raw(), cu(stream));
  table = static_cast<const GemmGroupDesc*>(storage.raw());
  return table;
}

DeviceGroupTable make_group_table_device(const int64_t* offsets, int groups, const int64_t* tokens,
                                         int64_t n_per_group, int64_t max_rows, int64_t total_rows,
                                         Device device, Stream stream) {
  DeviceGroupTable t;
  t.device = device;
  t.stream = stream;
  t.groups = groups;
  t.max_rows = max_rows;
  t.total_rows = total_rows;
  t.storage = Tensor::empty(DType::kU8, {int64_t(groups) * int64_t(sizeof(GemmGroupDesc)) + 1},
                            device, stream);
  auto* out = static_cast<GemmGroupDesc*>(t.storage.raw());
  t.table = out;
  if (groups > 0 && groups <= kCompactGroups) {
    group_table_compact_kernel<<<1, unsigned((groups + 31) / 32 * 32), 0, cu(stream)>>>(
        offsets, groups, tokens, n_per_group, max_rows, total_rows, out);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    // At most total_rows groups have rows: the kernels visit no more entries than that.
    t.groups = int(std::min<int64_t>(groups, total_rows));
  } else if (groups > 0) {
    group_table_kernel<<<unsigned((groups + 127) / 128), 128, 0, cu(stream)>>>(
        offsets, groups, tokens, n_per_group, max_rows, total_rows, out);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  return t;
}

bool wgmma_available(int64_t k) { return gemm_detail::wgmma_supported(k); }

GemmVariant choose_kernel(GemmVariant forced, GemmOrder order, const GemmOperandView& a,
                          const GemmOperandView& w, const DeviceGroupTable& groups) {
  if (forced != GemmVariant::kAuto) return forced;
  const int64_t k = w.cols;
  if (a.chunk_scale || w.chunk_scale) return GemmVariant::kTiled;  // the chunked chain
  const bool wg = gemm_detail::wgmma_supported(k);
  // Batch-invariant: one kernel for every M (chosen by K), so a row's chain is the same in the
  // learner's large-M calls and the sampler's small-M ones. The decode kernel's chain differs
  // from wgmma's, so it only serves the fast order.
  if (order == GemmOrder::kBatchInvariant) return wg ? GemmVariant::kWgmma : GemmVariant::kTiled;
  if (decode_takes(w.format, k, groups)) return GemmVariant::kDecode;
  // kFast, from `lockstep bench gemm` on the H200 (docs/gemm.md "Kernel policy"): the wgmma kernel
  // for nvfp4 and fp8 W and for grouped calls with mxfp8 W; cuBLAS (which needs host offsets) for
  // dense calls with mxfp8 W and for bf16 W.
  const bool cb = cublas_available() && k % 16 == 0 && groups.on_host();
  const bool prefer_wg = w.format == Format::kNvfp4 || w.format == Format::kFp8 ||
                         (groups.groups > 1 && w.format == Format::kMxfp8);
  if (prefer_wg && wg) return GemmVariant::kWgmma;
  if (cb) return GemmVariant::kCublas;
  return wg ? GemmVariant::kWgmma : GemmVariant::kTiled;
}

GemmVariant qgemm_device(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                         const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                         Scratch& scratch, GemmVariant kernel, GemmOrder order,
                         cudaStream_t stream) {
  using gemm_detail::cat;
  if (a.cols != w.cols)
    throw GemmError(cat("qgemm cuda: A has K = ", a.cols, " but W has K = ", w.cols));
  if (ep.swiglu && n % 2 != 0)
    throw GemmError(cat("qgemm cuda: swiglu needs an even N (got ", n, ")"));
  const GemmVariant k = choose_kernel(kernel, order, a, w, groups);
  const bool chunked = a.chunk_scale || w.chunk_scale;
  if (chunked && k != GemmVariant::kTiled)
    throw GemmError(cat(
        "qgemm cuda: fp8 block scaling (1x128 / 128x128: per-128 k chunk scales) runs only on the "
        "tiled kernel, not ",
        gemm_variant_name(k)));
  // An empty output (no rows in any group, or N = 0) has nothing to write, and its buffer may be
  // null.
  if (groups.total_rows == 0 || n == 0) return k;
  if (!out.d_f32 == !out.d_bf16) throw GemmError("qgemm cuda: give exactly one of d_f32 / d_bf16");
  if (a.cols == 0) {  // every accumulator is +0: the epilogue alone
    if (groups.total_rows > 0 && n > 0) {
      float* raw = scratch.get<float>(size_t(groups.total_rows) * size_t(n));
      zero_f32_kernel<<<1024, 256, 0, stream>>>(raw, groups.total_rows * n);
      LOCKSTEP_CUDA_CHECK_LAUNCH();
      gemm_detail::launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
    }
    return k;
  }
  switch (k) {
    case GemmVariant::kDecode:
    case GemmVariant::kDecodeBlockSplit:
      gemm_detail::launch_decode(a, w, n, groups, ep, out, k == GemmVariant::kDecodeBlockSplit,
                                 stream);
      return k;
    case GemmVariant::kWgmma:
    case GemmVariant::kWgmmaInloop:
    case GemmVariant::kWgmmaStaged:
    case GemmVariant::kWgmmaWreg128:
    case GemmVariant::kWgmmaWreg256:
    case GemmVariant::kWgmmaSmallM:
    case GemmVariant::kWgmmaSmallMWide:
      return gemm_detail::launch_wgmma(a, w, n, groups, ep, out, scratch, k, stream);
    case GemmVariant::kCublas:
      gemm_detail::launch_cublas(a, w, n, groups, ep, out, scratch, stream);
      return k;
    case GemmVariant::kTiled:
      gemm_detail::launch_tiled(a, w, n, groups, ep, out, scratch, stream);
      return k;
    default:
      throw GemmError(
          cat("qgemm cuda: kernel ", gemm_variant_name(k), " does not run on CUDA operands"));
  }
}

void launch_row_amax(const void* d, bool bf16, int64_t rows, int64_t cols, float* amax,
                     cudaStream_t stream) {
  if (rows == 0) return;
  row_amax_kernel<<<unsigned(rows), 256, 0, stream>>>(d, bf16, cols, amax);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
