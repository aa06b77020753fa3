// Microbenchmark + byte-equality check of the bf16 weighted-SwiGLU NVFP4 kernel
// (src/quant/quantize_swiglu_cuda.cuh) against the generic row kernel with LoadSwiglu (the path it
// replaces), on a 16384 x 8192 bf16 FC1 output (H = 4096), the bench's shape: pseudo-normal values
// (the bench's distribution) and uniformly random bf16 codes (NaN, inf, zeros, huge and tiny gates:
// the kernel's per-element path), compact and swizzled scales; then the median time of a D2D copy,
// the generic kernel and a few (threads, stages) configurations, with the bench's byte count.
// Standalone (header-only parts of the library), so its instantiations are its own. Build:
//   F="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --fmad=false -prec-div=true -prec-sqrt=true
//      -ftz=false --expt-relaxed-constexpr -Iinclude -Isrc -DLOCKSTEP_HAVE_CUDA=1"
//   nvcc $F dev/micro_swiglu.cu -o gpu-bin-h1/micro_swiglu
// Run: gpu-bin-h1/micro_swiglu [rows cols]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "lockstep/tensor/cuda_timing.h"
#include "quant/quantize_swiglu_cuda.cuh"

using namespace lockstep;
using namespace lockstep::cuda::detail;


__global__ void fill_kernel(uint16_t* p, int64_t n, uint32_t seed, int mode) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) * 0x85EBCA77u ^ seed;
  auto mix = [](uint32_t x) {
    x ^= x >> 16, x *= 0x7FEB352Du, x ^= x >> 15, x *= 0x846CA68Bu, x ^= x >> 16;
    return x;
  };
  h = mix(h);
  if (mode == 1) {  // any bf16 code
    p[i] = uint16_t(h);
    return;
  }
  float s = 0.0f;
  for (int k = 0; k < 4; ++k) {
    h = mix(h + 0x632BE5ABu);
    s += float(h >> 8) * 5.9604644775390625e-08f;
  }
  p[i] = num::f32_to_bf16((s - 2.0f) * 1.7320508f);
}

__global__ void fill_f32(float* p, int64_t n, float v) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

struct Out {
  uint8_t* data;
  uint8_t* scale;
  float* amax;
  size_t nd, ns, na;
};

Out make_out(int64_t rows, int64_t h, bool swz) {
  Out o;
  o.nd = size_t(rows * h / 2);
  const int64_t sc = h / 16, pc = (sc + 3) / 4 * 4, pr = (rows + 127) / 128 * 128;
  o.ns = swz ? size_t(pr * pc) : size_t(rows * sc);
  o.na = size_t(rows);
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&o.data, o.nd));
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&o.scale, o.ns));
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&o.amax, o.na * 4));
  return o;
}

RowParams params(int64_t rows, int64_t h, bool swz, const Out& o) {
  RowParams p;
  p.rows = rows, p.cols = h, p.nchunks = int(h / 16), p.amax_mode = kAmaxRow;
  p.data = o.data, p.amax_out = o.amax;
  p.scale.p = o.scale, p.scale.cols = h / 16, p.scale.padded_cols = (h / 16 + 3) / 4 * 4, p.scale.swizzled = swz;
  return p;
}

void poison(const Out& o) {
  LOCKSTEP_CUDA_CHECK(cudaMemset(o.data, 0xFF, o.nd));
  LOCKSTEP_CUDA_CHECK(cudaMemset(o.scale, 0xFF, o.ns));
  LOCKSTEP_CUDA_CHECK(cudaMemset(o.amax, 0xFF, o.na * 4));
}

size_t diff(const Out& a, const Out& b, const char** what) {
  std::vector<uint8_t> x, y;
  const struct {
    const void *p, *q;
    size_t n;
    const char* name;
  } parts[3] = {{a.data, b.data, a.nd, "data"}, {a.scale, b.scale, a.ns, "scale"}, {a.amax, b.amax, a.na * 4, "amax"}};
  for (const auto& part : parts) {
    x.resize(part.n), y.resize(part.n);
    LOCKSTEP_CUDA_CHECK(cudaMemcpy(x.data(), part.p, part.n, cudaMemcpyDeviceToHost));
    LOCKSTEP_CUDA_CHECK(cudaMemcpy(y.data(), part.q, part.n, cudaMemcpyDeviceToHost));
    size_t n = 0;
    for (size_t i = 0; i < part.n; ++i) n += x[i] != y[i];
    if (n) {
      *what = part.name;
      return n;
    }
  }
  return 0;
}


using Launch = cudaError_t (*)(const uint16_t*, const float*, int64_t, const RowParams&, cudaStream_t);

int main(int argc, char** argv) {
  const int64_t rows = argc > 2 ? std::atoll(argv[1]) : 16384, cols = argc > 2 ? std::atoll(argv[2]) : 8192, h = cols / 2;
  const int64_t n = rows * cols;
  uint16_t *in, *cp;
  float* prob;
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&in, size_t(n) * 2));
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&cp, size_t(n) * 2));
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&prob, size_t(rows) * 4));
  fill_f32<<<unsigned((rows + 255) / 256), 256>>>(prob, rows, 0.375f);
  const LoadSwiglu<LoadBf16> ld{LoadBf16{in, cols, true}, prob, h};
  auto generic = [&](const RowParams& p) {
    quantize_rows_kernel<LoadSwiglu<LoadBf16>, RowFmt::kNvfp4><<<unsigned(rows), row_threads(p.nchunks)>>>(ld, p);
  };
  struct Cfg {
    const char* name;
    Launch compact, swz;
  };
  const Cfg cfgs[] = {
      {"fast 1024 thr x 1 chunk, 2 stages (library)", swiglu_nvfp4_rows_launch<1024, 1, 2, false>,
       swiglu_nvfp4_rows_launch<1024, 1, 2, true>},
      {"fast 1024 thr x 1 chunk, 3 stages", swiglu_nvfp4_rows_launch<1024, 1, 3, false>, swiglu_nvfp4_rows_launch<1024, 1, 3, true>},
      {"fast 512 thr x 2 chunks, 3 stages", swiglu_nvfp4_rows_launch<512, 2, 3, false>, swiglu_nvfp4_rows_launch<512, 2, 3, true>},
      {"fast 512 thr x 2 chunks, 2 stages", swiglu_nvfp4_rows_launch<512, 2, 2, false>, swiglu_nvfp4_rows_launch<512, 2, 2, true>},
  };
  Out ref[2] = {make_out(rows, h, false), make_out(rows, h, true)};
  Out got[2] = {make_out(rows, h, false), make_out(rows, h, true)};
  int bad = 0;
  for (int mode = 0; mode < 2; ++mode) {
    fill_kernel<<<unsigned((n + 255) / 256), 256>>>(in, n, 0x1234u + mode, mode);
    for (int swz = 0; swz < 2; ++swz) {
      poison(ref[swz]);
      generic(params(rows, h, swz, ref[swz]));
      LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
      for (const Cfg& c : cfgs) {
        poison(got[swz]);
        LOCKSTEP_CUDA_CHECK((swz ? c.swz : c.compact)(in, prob, h, params(rows, h, swz, got[swz]), nullptr));
        LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
        const char* what = "";
        const size_t d = diff(ref[swz], got[swz], &what);
        std::printf("check %-46s %s %-8s: %s", c.name, mode ? "random codes" : "normal      ", swz ? "swizzled" : "compact",
                    d ? "DIFF " : "same\n");
        if (d) std::printf("%zu bytes of %s\n", d, what), ++bad;
      }
    }
  }
  fill_kernel<<<unsigned((n + 255) / 256), 256>>>(in, n, 0x1234u, 0);
  const double bytes = double(n) * 2 + double(rows) * 4 + double(ref[0].nd + ref[0].ns + ref[0].na * 4);
  const double cp_us = lockstep::cuda::median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(cp, in, size_t(n) * 2, cudaMemcpyDeviceToDevice)); }, 20);
  const double cp_gbps = 2.0 * double(n) * 2 / cp_us * 1e-3;
  std::printf("\n%-52s %9s %9s %7s\n", "", "us", "GB/s", "x copy");
  std::printf("%-52s %9.1f %9.1f %7.3f\n", "device-to-device copy", cp_us, cp_gbps, 1.0);
  auto row = [&](const char* name, double us) {
    std::printf("%-52s %9.1f %9.1f %7.3f\n", name, us, bytes / us * 1e-3, bytes / us * 1e-3 / cp_gbps);
  };
  row("generic quantize_rows_kernel<LoadSwiglu>", lockstep::cuda::median_time_us([&](int) { generic(params(rows, h, false, ref[0])); }, 5));
  for (const Cfg& c : cfgs) {
    row(c.name, lockstep::cuda::median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(c.compact(in, prob, h, params(rows, h, false, got[0]), nullptr)); }, 20));
    char nm[96];
    std::snprintf(nm, sizeof nm, "%s swz", c.name);
    row(nm, lockstep::cuda::median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(c.swz(in, prob, h, params(rows, h, true, got[1]), nullptr)); }, 20));
  }
  std::printf("%d mismatching checks\n", bad);
  return bad != 0;
}
