// Launchers of the CUDA row quantizer kernels (quantize_rows_cuda.cuh) and the Hadamard transform: the
// only place the loader templates are instantiated, so the host planning code
// (quantize_cuda_host.cpp) sees plain functions taking parameter blocks.
#include "quantize_cuda_params.h"
#include "quantize_rows_cuda.cuh"
#include "quantize_tiles_cuda.cuh"
#include "lockstep/tensor/device_buffer.h"

#include <type_traits>

namespace lockstep::cuda::detail {
namespace {

template <class Loader, RowFmt F, int Mode>
void rows_fast(const Loader& ld, const RowParams& p, unsigned grid, int threads, cudaStream_t st) {
  if constexpr (F == RowFmt::kNvfp4) {
    if (p.scale.swizzled) quantize_rows_nvfp4_kernel<Loader, Mode, true><<<grid, threads, 0, st>>>(ld, p);
    else quantize_rows_nvfp4_kernel<Loader, Mode, false><<<grid, threads, 0, st>>>(ld, p);
  } else {
    if (p.scale.swizzled) quantize_rows_fast_kernel<Loader, F, Mode, true><<<grid, threads, 0, st>>>(ld, p);
    else quantize_rows_fast_kernel<Loader, F, Mode, false><<<grid, threads, 0, st>>>(ld, p);
  }
}

// The specialized kernel where it applies (quantize_rows_fast_kernel's conditions); true if launched.
template <class Loader>
bool try_rows_fast(const Loader& ld, RowFmt f, const RowParams& p, unsigned grid, int threads, cudaStream_t st) {
  constexpr bool plain = std::is_same_v<Loader, LoadBf16>;
  constexpr bool gather = std::is_same_v<Loader, LoadGather<LoadBf16>>;
  if constexpr (!plain && !gather) {
    return false;
  } else {
    if (p.cols % 16 != 0 || p.sr.on || p.nchunks > kRegChunks * 256) return false;
    if (f != RowFmt::kNvfp4 && p.e5m2) return false;
    if constexpr (gather) {
      if (f != RowFmt::kNvfp4 || p.amax_mode != kAmaxRow) return false;
      rows_fast<Loader, RowFmt::kNvfp4, kAmaxRow>(ld, p, grid, threads, st);
      return true;
    } else {
      switch (f) {
        case RowFmt::kNvfp4:
          if (p.amax_mode == kAmaxRow) rows_fast<Loader, RowFmt::kNvfp4, kAmaxRow>(ld, p, grid, threads, st);
          else if (p.amax_mode == kAmaxDomain) rows_fast<Loader, RowFmt::kNvfp4, kAmaxDomain>(ld, p, grid, threads, st);
          else return false;
          return true;
        case RowFmt::kMxfp8:
          if (p.amax_mode != kAmaxDomain) return false;
          rows_fast<Loader, RowFmt::kMxfp8, kAmaxDomain>(ld, p, grid, threads, st);
          return true;
        case RowFmt::kFp8:
          if (p.amax_mode == kAmaxRow) quantize_rows_fast_kernel<Loader, RowFmt::kFp8, kAmaxRow, false><<<grid, threads, 0, st>>>(ld, p);
          else if (p.amax_mode == kAmaxDomain) quantize_rows_fast_kernel<Loader, RowFmt::kFp8, kAmaxDomain, false><<<grid, threads, 0, st>>>(ld, p);
          else quantize_rows_fast_kernel<Loader, RowFmt::kFp8, kAmaxLanes8, false><<<grid, threads, 0, st>>>(ld, p);
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
  const int threads = row_threads(p.nchunks);
  if (try_rows_fast(ld, f, p, grid, threads, st)) {
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (f) {
    case RowFmt::kNvfp4: quantize_rows_kernel<Loader, RowFmt::kNvfp4><<<grid, threads, 0, st>>>(ld, p); break;
    case RowFmt::kMxfp8: quantize_rows_kernel<Loader, RowFmt::kMxfp8><<<grid, threads, 0, st>>>(ld, p); break;
    case RowFmt::kFp8: quantize_rows_kernel<Loader, RowFmt::kFp8><<<grid, threads, 0, st>>>(ld, p); break;
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

__global__ void codec_check_kernel(unsigned long long* mismatches) {
  unsigned long long bad[3] = {0, 0, 0};
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32); i += stride * 2) {
    const float a = __uint_as_float(uint32_t(i));
    const float b = __uint_as_float(uint32_t(i + stride < (uint64_t(1) << 32) ? i + stride : i));
    bad[0] += num::encode_e2m1_fast(a) != num::encode_e2m1(a);
    bad[0] += num::encode_e2m1_fast(b) != num::encode_e2m1(b);
    bad[0] += num::encode_e2m1_arith(a) != num::encode_e2m1(a);
    bad[0] += num::encode_e2m1_arith(b) != num::encode_e2m1(b);
    bad[0] += num::encode_e2m1_fma(a) != num::encode_e2m1(a);
    bad[0] += num::encode_e2m1_fma(b) != num::encode_e2m1(b);
    if (i < 256) {  // every E4M3 code: the cvt decode equals the reference (NaN codes: any NaN)
      const float d = num::decode_e4m3_fast(uint8_t(i)), r = num::decode_e4m3(uint8_t(i));
      bad[1] += num::is_nan(r) ? !num::is_nan(d) : __float_as_uint(d) != __float_as_uint(r);
    }
    const uint16_t e43 = num::encode_e4m3x2_fast(a, b);
    bad[1] += uint8_t(e43) != num::encode_e4m3(a);
    bad[1] += uint8_t(e43 >> 8) != num::encode_e4m3(b);
    const uint16_t e52 = num::encode_e5m2x2_fast(a, b);
    bad[2] += uint8_t(e52) != num::encode_e5m2(a);
    bad[2] += uint8_t(e52 >> 8) != num::encode_e5m2(b);
  }
  for (int k = 0; k < 3; ++k)
    if (bad[k]) atomicAdd(mismatches + k, bad[k]);
}

__global__ void fill_random_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const num::Philox4x32 w = num::philox4x32_10(num::Philox4x32{{uint32_t(i), uint32_t(i >> 32), 0u, 0u}}, uint32_t(seed), uint32_t(seed >> 32));
  float s = 0.0f;
  for (int k = 0; k < 4; ++k) s += float(w.v[k] >> 8) * 5.9604644775390625e-08f;
  p[i] = num::f32_to_bf16((s - 2.0f) * 1.7320508f);
}

}  // namespace

void launch_fill_random_bf16(uint16_t* p, int64_t n, uint64_t seed, cudaStream_t st) {
  if (n <= 0) return;
  fill_random_bf16_kernel<<<unsigned((n + 255) / 256), 256, 0, st>>>(p, n, seed);
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

void launch_rows_gather(const InputRef& in, const int32_t* src, const RowParams& p, cudaStream_t st) {
  with_loader(in, [&](auto ld) { rows_with(LoadGather<decltype(ld)>{ld, src}, RowFmt::kNvfp4, p, st); });
}

void launch_hadamard(const InputRef& in, int64_t rows, int64_t cols, void* out, bool out_bf16, cudaStream_t st) {
  const int64_t nch = rows * (cols / 16);
  if (nch == 0) return;
  const unsigned grid = unsigned((nch + 255) / 256);
  with_loader(in, [&](auto ld) {
    if (out_bf16) hadamard16_kernel<<<grid, 256, 0, st>>>(ld, rows, cols, static_cast<uint16_t*>(out));
    else hadamard16_kernel<<<grid, 256, 0, st>>>(ld, rows, cols, static_cast<float*>(out));
  });
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_codec_check(unsigned long long* mismatches, cudaStream_t st) {
  codec_check_kernel<<<132 * 16, 256, 0, st>>>(mismatches);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda::detail
