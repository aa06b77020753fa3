// Launchers of the CUDA row quantizer kernels (quantize_rows_cuda.cuh) and the Hadamard transform:
// the only place the row loader templates are instantiated, so the host planning code
// (quantize_cuda_host.cpp) sees plain functions taking parameter blocks.
#include <type_traits>

#include "../tensor/cuda_util.h"
#include "quantize_cuda_params.h"
#include "quantize_rows_cuda.cuh"
#include "quantize_tiles_cuda.cuh"

namespace lockstep::cuda::detail {
namespace {

template <class Loader, RowFmt F, int Mode>
void rows_fast(const Loader& ld, const RowParams& p, unsigned grid, int threads, cudaStream_t st) {
  if constexpr (F == RowFmt::kNvfp4) {
    if (p.sr.on) {
      if (p.scale.swizzled)
        quantize_rows_nvfp4_kernel<Loader, Mode, true, true><<<grid, threads, 0, st>>>(ld, p);
      else
        quantize_rows_nvfp4_kernel<Loader, Mode, false, true><<<grid, threads, 0, st>>>(ld, p);
    } else {
      if (p.scale.swizzled)
        quantize_rows_nvfp4_kernel<Loader, Mode, true, false><<<grid, threads, 0, st>>>(ld, p);
      else
        quantize_rows_nvfp4_kernel<Loader, Mode, false, false><<<grid, threads, 0, st>>>(ld, p);
    }
  } else {
    if (p.scale.swizzled)
      quantize_rows_fast_kernel<Loader, F, Mode, true><<<grid, threads, 0, st>>>(ld, p);
    else
      quantize_rows_fast_kernel<Loader, F, Mode, false><<<grid, threads, 0, st>>>(ld, p);
  }
}

// The specialized kernel where it applies (quantize_rows_fast_kernel's conditions); true if
// launched.
template <class Loader>
bool try_rows_fast(const Loader& ld, RowFmt f, const RowParams& p, unsigned grid, int threads,
                   cudaStream_t st) {
  constexpr bool plain = std::is_same_v<Loader, LoadBf16>;
  constexpr bool gather = std::is_same_v<Loader, LoadGather<LoadBf16>>;
  if constexpr (!plain && !gather) {
    return false;
  } else {
    // Stochastic rounding: NVFP4 only (the FP8 kernels round to nearest).
    if (p.cols % 16 != 0 || (p.sr.on && f != RowFmt::kNvfp4) || p.nchunks > kRegChunks * 256)
      return false;
    if (f != RowFmt::kNvfp4 && p.e5m2) return false;
    if constexpr (gather) {
      if (f != RowFmt::kNvfp4 || p.amax_mode != kAmaxRow) return false;
      rows_fast<Loader, RowFmt::kNvfp4, kAmaxRow>(ld, p, grid, threads, st);
      return true;
    } else {
      switch (f) {
        case RowFmt::kNvfp4:
          if (p.amax_mode == kAmaxRow)
            rows_fast<Loader, RowFmt::kNvfp4, kAmaxRow>(ld, p, grid, threads, st);
          else if (p.amax_mode == kAmaxDomain)
            rows_fast<Loader, RowFmt::kNvfp4, kAmaxDomain>(ld, p, grid, threads, st);
          else
            return false;
          return true;
        case RowFmt::kMxfp8:
          if (p.amax_mode != kAmaxDomain) return false;
          rows_fast<Loader, RowFmt::kMxfp8, kAmaxDomain>(ld, p, grid, threads, st);
          return true;
        case RowFmt::kFp8:
          if (p.amax_mode == kAmaxRow)
            quantize_rows_fast_kernel<Loader, RowFmt::kFp8, kAmaxRow, false>
                <<<grid, threads, 0, st>>>(ld, p);
          else if (p.amax_mode == kAmaxDomain)
            quantize_rows_fast_kernel<Loader, RowFmt::kFp8, kAmaxDomain, false>
                <<<grid, threads, 0, st>>>(ld, p);
          else
            quantize_rows_fast_kernel<Loader, RowFmt::kFp8, kAmaxLanes8, false>
                <<<grid, threads, 0, st>>>(ld, p);
          return true;
      }
      return false;
    }
  }
}

template <class Loader>
void rows_with(const Loader& ld, RowFmt f, const RowParams& p, cudaStream_t st) {
  if (p.rows == 0 || p.nchunks == 0) return;
  const unsigned grid = unsigned(p.rows);
  const int threads = row_threads(p.nchunks, p.rows);
  if (try_rows_fast(ld, f, p, grid, threads, st)) {
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (f) {
    case RowFmt::kNvfp4:
      quantize_rows_kernel<Loader, RowFmt::kNvfp4><<<grid, threads, 0, st>>>(ld, p);
      break;
    case RowFmt::kMxfp8:
      quantize_rows_kernel<Loader, RowFmt::kMxfp8><<<grid, threads, 0, st>>>(ld, p);
      break;
    case RowFmt::kFp8:
      quantize_rows_kernel<Loader, RowFmt::kFp8><<<grid, threads, 0, st>>>(ld, p);
      break;
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

__global__ void amax_keys_kernel(const float* a, uint32_t* keys, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) keys[i] = amax_key(a[i]);
}

}  // namespace

void launch_amax_keys(const float* a, uint32_t* keys, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  amax_keys_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(a, keys, n);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_fill_f32(float* p, int64_t n, float v, cudaStream_t st) {
  if (n <= 0) return;
  fill_f32_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(p, n, v);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_rows(const InputRef& in, RowFmt f, const RowParams& p, cudaStream_t st) {
  with_loader(in, [&](auto ld) { rows_with(ld, f, p, st); });
}

void launch_rows_gather(const InputRef& in, const int32_t* src, int64_t tokens, const RowParams& p,
                        cudaStream_t st) {
  with_loader(in, [&](auto ld) {
    rows_with(LoadGather<decltype(ld)>{ld, src, tokens}, RowFmt::kNvfp4, p, st);
  });
}

void launch_hadamard(const InputRef& in, int64_t rows, int64_t cols, void* out, bool out_bf16,
                     cudaStream_t st) {
  const int64_t nch = rows * (cols / 16);
  if (nch == 0) return;
  const unsigned grid = unsigned((nch + 255) / 256);
  with_loader(in, [&](auto ld) {
    if (out_bf16)
      hadamard16_kernel<<<grid, 256, 0, st>>>(ld, rows, cols, static_cast<uint16_t*>(out));
    else
      hadamard16_kernel<<<grid, 256, 0, st>>>(ld, rows, cols, static_cast<float*>(out));
  });
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda::detail
