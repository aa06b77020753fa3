// Launcher of the fused weighted-SwiGLU + row amax + NVFP4 per_row producer
// (quantize_swiglu_cuda.cuh for bf16 inputs; the generic row kernel with LoadSwiglu for fp32
// inputs, stochastic rounding and rows of more than 1024 chunks, and devices without the ~217 KB of
// shared memory per CTA it uses).
#include "../tensor/cuda_util.h"
#include "quantize_cuda_params.h"
#include "quantize_swiglu_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

template <class Inner>
void launch_swiglu_generic(const Inner& ld, const float* prob, int64_t half, const RowParams& p,
                           cudaStream_t st) {
  quantize_rows_kernel<LoadSwiglu<Inner>, RowFmt::kNvfp4>
      <<<unsigned(p.rows), row_threads(p.nchunks, p.rows), 0, st>>>(
          LoadSwiglu<Inner>{ld, prob, half}, p);
}

// Whether the device gives a CTA the bf16 kernel's shared memory (the table and the row buffers).
bool swiglu_smem_fits() {
  int dev = 0, optin = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const size_t need = swiglu_stage_bytes(kSwigluThreads, kSwigluChunks, kSwigluStages) +
                      2 * kSiluN * 4 + 2 * 32 * 4 + size_t(kSwigluTeams) * kSwigluStages * 8;
  return size_t(optin) >= need;
}

}  // namespace

void launch_rows_swiglu(const InputRef& in, const float* prob, int64_t half, const RowParams& p,
                        cudaStream_t st) {
  if (p.rows == 0 || p.nchunks == 0) return;
  // (16-byte aligned rows: the kernel copies 16-byte pieces; cols % 16 == 0 keeps every row
  // aligned)
  if (in.bf16 && (reinterpret_cast<uintptr_t>(in.p) & 15u) == 0 && p.cols % 16 == 0 &&
      in.cols == 2 * half && !p.sr.on && p.amax_mode == kAmaxRow &&
      p.nchunks <= kSwigluChunks * kSwigluThreads && swiglu_smem_fits()) {
    const auto* x = static_cast<const uint16_t*>(in.p);
    if (p.scale.swizzled)
      LOCKSTEP_CUDA_CHECK(
          (swiglu_nvfp4_rows_launch<kSwigluThreads, kSwigluChunks, kSwigluStages, true>(
              x, prob, half, p, st)));
    else
      LOCKSTEP_CUDA_CHECK(
          (swiglu_nvfp4_rows_launch<kSwigluThreads, kSwigluChunks, kSwigluStages, false>(
              x, prob, half, p, st)));
  } else {
    const bool vec = in.cols % 16 == 0;
    if (in.bf16)
      launch_swiglu_generic(LoadBf16{static_cast<const uint16_t*>(in.p), in.cols, vec}, prob, half,
                            p, st);
    else
      launch_swiglu_generic(LoadF32{static_cast<const float*>(in.p), in.cols, vec}, prob, half, p,
                            st);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda::detail
