// Launchers of the multi-row quantizer kernels (quantize_tiles_cuda.cuh): the domain amax pass
// and its finishing kernel, NVFP4 16x16 blocks and MXFP8 rowwise + columnwise. Each picks the bf16
// fast kernel where it applies (bf16 input, 16-byte aligned rows, round to nearest) and the generic
// loader-based kernel otherwise. Kept apart from quantize_cuda.cu so the two compile in parallel.
#include <cstdint>

#include "../tensor/cuda_util.h"
#include "quantize_cuda_params.h"
#include "quantize_tiles_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

// bf16 rows that 16-byte vector loads may read: cols % 16 == 0 and an aligned base.
bool fast_bf16(const InputRef& in) {
  return in.bf16 && in.cols % 16 == 0 && (reinterpret_cast<uintptr_t>(in.p) & 15u) == 0;
}

int sm_count() {
  static int cached[64] = {};
  int dev = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  int& n = cached[dev & 63];
  if (n == 0) LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// Resident CTAs of Kernel per SM (computed once per kernel; all uses pass the same threads, smem).
template <auto Kernel>
int resident_ctas(int threads, size_t smem) {
  static int n = 0;
  if (n == 0) {
    int k = 0;
    LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k, Kernel, threads, smem));
    n = k < 1 ? 1 : k;
  }
  return n;
}

__global__ void finish_domains_kernel(FinishParams p) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= p.ndom) return;
  // Column domains (dom_cols > 0): d = group * dom_cols + column; otherwise d is the group.
  bool nonempty = p.tensor_nonempty;
  if (p.dom_cols > 0)
    nonempty = p.offsets[d / p.dom_cols + 1] > p.offsets[d / p.dom_cols];
  else if (p.offsets)
    nonempty = p.offsets[d + 1] > p.offsets[d] && p.cols > 0;
  const float a = amax_from_key(p.keys[d], nonempty);
  if (p.fp8) {
    const float s = num::fp8_scale(a, p.elem_max, p.eps, p.type_max, p.pow2);
    p.dom_val[d] = s;
    p.scale_inv_out[d] = num::fp8_scale_inv(s);
  } else {
    p.dom_val[d] = a;
    if (p.amax_out) p.amax_out[d] = a;
  }
}

// The grid of a striding kernel: enough CTAs for the work, at most the resident ones.
template <auto Kernel>
unsigned striding_grid(int threads, size_t smem, int64_t need) {
  const int64_t cap = int64_t(resident_ctas<Kernel>(threads, smem)) * sm_count();
  return unsigned(need < cap ? need : cap);
}

template <int Dom>
void domain_amax_fast(const InputRef& in, const AmaxParams& p, cudaStream_t st) {
  const auto* x = static_cast<const uint16_t*>(in.p);
  if constexpr (Dom == kDomTensor) {
    const int64_t n16 = p.rows * p.cols / 8;
    const unsigned grid = striding_grid<domain_amax_flat_bf16_kernel<>>(
        256, 0, (n16 + 256 * kAmaxFlatU - 1) / (256 * kAmaxFlatU));
    domain_amax_flat_bf16_kernel<>
        <<<grid, 256, 0, st>>>(reinterpret_cast<const uint4*>(x), n16, p.keys);
  } else {
    const int64_t units = (p.cols + kAmaxFastCols - 1) / kAmaxFastCols *
                          ((p.rows + kAmaxFastRows - 1) / kAmaxFastRows);
    domain_amax_bf16_kernel<Dom>
        <<<striding_grid<domain_amax_bf16_kernel<Dom>>(256, 0, (units + 7) / 8), 256, 0, st>>>(x,
                                                                                               p);
  }
}

template <int kCols, bool Swz, bool E5M2>
void mxfp8_tile_fast(const InputRef& in, const MxTileParams& p, cudaStream_t st) {
  constexpr auto kernel = quantize_mxfp8_tile_bf16_kernel<kCols, Swz, E5M2>;
  constexpr size_t smem = mxfp8_tile_smem<kCols>();
  LOCKSTEP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((p.cols + kCols - 1) / kCols), unsigned(p.rows / 32));
  kernel<<<grid, kCols / 2, smem, st>>>(static_cast<const uint16_t*>(in.p), p);
}

}  // namespace

// MXFP8 tile width of the fast kernel (columns per CTA; kMxFastCols / 2 threads): 512 is faster
// than 256 on the H200 (0.84 against 0.80 of copy, 16384 x 8192).
constexpr int kMxFastCols = 512;

void launch_domain_amax(const InputRef& in, const AmaxParams& p, cudaStream_t st) {
  if (p.rows == 0 || p.cols == 0) return;
  const int64_t units =
      (p.cols + kAmaxFastCols - 1) / kAmaxFastCols * ((p.rows + kAmaxFastRows - 1) / kAmaxFastRows);
  if (fast_bf16(in) && units < (int64_t(1) << 31)) {
    switch (p.dom_kind) {
      case kDomTensor:
        domain_amax_fast<kDomTensor>(in, p, st);
        break;
      case kDomGroup:
        domain_amax_fast<kDomGroup>(in, p, st);
        break;
      default:
        domain_amax_fast<kDomTile128>(in, p, st);
        break;
    }
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  dim3 grid(unsigned((p.nchunks + 31) / 32), unsigned((p.rows + 255) / 256));
  with_loader(in, [&](auto ld) { domain_amax_kernel<<<grid, 256, 0, st>>>(ld, p); });
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_finish(const FinishParams& p, cudaStream_t st) {
  if (p.ndom == 0) return;
  finish_domains_kernel<<<unsigned((p.ndom + 255) / 256), 256, 0, st>>>(p);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_nvfp4_2d(const InputRef& in, const Nvfp4TileParams& p, cudaStream_t st) {
  if (p.rows == 0 || p.nchunks == 0) return;
  const int64_t units = (p.cols + 255) / 256 * (p.rows / 16);
  if (fast_bf16(in) && !p.sr.on && units < (int64_t(1) << 31)) {
    const unsigned grid = unsigned((units + kNvfp4TileWarps - 1) / kNvfp4TileWarps);
    const uint16_t* x = static_cast<const uint16_t*>(in.p);
    if (p.scale.swizzled)
      quantize_nvfp4_2d_bf16_kernel<true><<<grid, kNvfp4TileWarps * 32, 0, st>>>(x, p);
    else
      quantize_nvfp4_2d_bf16_kernel<false><<<grid, kNvfp4TileWarps * 32, 0, st>>>(x, p);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  dim3 grid(unsigned((p.nchunks + 15) / 16), unsigned(p.rows / 16));
  with_loader(in, [&](auto ld) { quantize_nvfp4_2d_kernel<<<grid, 256, 0, st>>>(ld, p); });
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_mxfp8_tile(const InputRef& in, const MxTileParams& p, cudaStream_t st) {
  if (p.rows == 0 || p.cols == 0) return;
  if (fast_bf16(in) && !p.sr.on && p.cols % 32 == 0 && p.rows % 32 == 0) {
    const bool swz = p.rowwise && p.scale.swizzled;
    if (swz)
      p.e5m2 ? mxfp8_tile_fast<kMxFastCols, true, true>(in, p, st)
             : mxfp8_tile_fast<kMxFastCols, true, false>(in, p, st);
    else
      p.e5m2 ? mxfp8_tile_fast<kMxFastCols, false, true>(in, p, st)
             : mxfp8_tile_fast<kMxFastCols, false, false>(in, p, st);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t smem = 32 * kMxRowStride * sizeof(float);
  dim3 grid(unsigned((p.cols + 255) / 256), unsigned(p.rows / 32));
  with_loader(in, [&](auto ld) {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(quantize_mxfp8_tile_kernel<decltype(ld)>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(smem)));
    quantize_mxfp8_tile_kernel<<<grid, 256, smem, st>>>(ld, p);
  });
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda::detail
