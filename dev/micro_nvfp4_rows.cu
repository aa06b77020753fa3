// Microbenchmark + byte-equality check of the NVFP4 row kernel (quantize_rows_nvfp4_kernel in
// src/quant/quantize_rows_cuda.cuh, as in the working tree) against the prebuilt library (the kernel
// of the library's revision, through quantize_device) and the CPU reference (lockstep::quantize):
// ragged / edge-value shapes (compact, swizzled, gather with padding rows) vs CPU, 16384x8192 vs the
// library kernel, then timing of library kernel / new kernel / new gather kernel / D2D copy.
// Build (liblockstep.a built with -DLOCKSTEP_CUDA=ON -DLOCKSTEP_STATIC_RUNTIME=ON, sm_90a):
//   F="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --fmad=false -prec-div=true -prec-sqrt=true
//      -ftz=false --expt-relaxed-constexpr -Iinclude -Isrc -Xcompiler -fopenmp,-ffp-contract=off -DFMT_HEADER_ONLY"
//   nvcc $F -c dev/micro_nvfp4_rows.cu -o gpu-bin-q/micro.o
//   nvcc -gencode=arch=compute_90a,code=sm_90a gpu-bin-q/micro.o /work/devlib/liblockstep.a
//        -o gpu-bin-q/micro_nvfp4_rows -lgomp -lcublas -Xcompiler -static-libstdc++,-static-libgcc
// Run: gpu-bin-q/micro_nvfp4_rows [--quick (skip the 2048x8192 CPU check) | --profile (new kernel only)]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "lockstep/quant/quantize.h"
#include "lockstep/quant/quantize_cuda.h"
#include "quant/quantize_rows_cuda.cuh"

namespace lockstep::cuda::detail {
// Distinct loader types, so this file's kernel instantiations never share a symbol with the library's.
struct MicroBf16 : LoadBf16 {};
__device__ __forceinline__ const uint16_t* raw_row(const LoadGather<MicroBf16>& ld, int64_t r) {
  const int32_t s = ld.src[r];
  return s < 0 ? kZeroRow : ld.in.p + int64_t(s) * ld.in.cols;
}
}  // namespace lockstep::cuda::detail

using namespace lockstep;
using namespace lockstep::cuda;
using namespace lockstep::cuda::detail;

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

static uint16_t bf(float v) { return num::f32_to_bf16(v); }

// Random bf16 matrix with per-row scale variety and edge values.
static std::vector<uint16_t> make_input(int64_t rows, int64_t cols, uint64_t seed, bool edges) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> h(size_t(rows * cols));
  const float scales[] = {1.0f, 1e-3f, 37.0f, 1e-30f, 1e30f, 3e-39f, 2.0f, 1e5f};
  const uint16_t specials[] = {0x0000, 0x8000, 0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x007F, 0x7F80, 0xFF80,
                               0x7FC0, 0xFFC1, 0x7F81, 0x0080, 0x3E80 /*0.25*/, 0xBF40 /*-0.75*/};
  const float ties[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = edges ? int(g() % 8) : 0;
    const float sc = scales[g() % 8];
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t v;
      if (kind == 1) {  // tie row: block maxima 6, E2M1 tie values
        v = (c % 16 == 0) ? bf(6.0f) : bf(ties[g() % 15]);
        if (g() & 1) v ^= 0x8000;
      } else if (kind == 2 && g() % 64 == 0) {
        v = specials[g() % 15];
      } else if (kind == 3) {  // all-zero / all -0 / all NaN blocks
        const int64_t b = c / 16;
        v = (b % 3 == 0) ? 0x8000 : (b % 3 == 1) ? 0x7FC0 : bf(nd(g) * sc);
      } else if (kind == 4) {  // subnormal-only rows
        v = uint16_t(g() % 0x80) | uint16_t((g() & 1) << 15);
      } else if (kind == 5) {
        v = uint16_t(g());  // any bit pattern (NaN, inf, everything)
      } else {
        v = bf(nd(g) * sc);
      }
      h[size_t(r * cols + c)] = v;
    }
  }
  return h;
}

struct Out {
  DeviceBuffer data, scale, amax;
};

static void alloc_out(Out& o, int64_t rows, int64_t cols, bool swz) {
  o.data.resize(size_t(rows * cols / 2));
  const int64_t sc = cols / 16;
  const int64_t sr = swz ? (rows + 127) / 128 * 128 : rows, scc = swz ? (sc + 3) / 4 * 4 : sc;
  o.scale.resize(size_t(sr * scc));
  o.amax.resize(size_t(rows) * 4);
  o.data.fill(0xFF), o.scale.fill(swz ? 0 : 0xFF), o.amax.fill(0xFF);
}

static RowParams params(Out& o, int64_t rows, int64_t cols, bool swz) {
  RowParams p;
  p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.amax_mode = kAmaxRow;
  p.data = o.data.as<uint8_t>();
  p.scale.p = o.scale.as<uint8_t>(), p.scale.cols = cols / 16, p.scale.padded_cols = (cols / 16 + 3) / 4 * 4;
  p.scale.swizzled = swz;
  p.amax_out = o.amax.as<float>();
  return p;
}

static void launch_new(const uint16_t* in, const int32_t* src, int64_t rows, int64_t cols, Out& o, bool swz) {
  RowParams p = params(o, rows, cols, swz);
  const int threads = row_threads(p.nchunks);
  auto go = [&](auto kernel, auto ld) {
    kernel<<<unsigned(rows), threads>>>(ld, p);
  };
  if (src) {
    LoadGather<MicroBf16> ld{MicroBf16{LoadBf16{in, cols, true}}, src};
    if (swz) go(quantize_rows_nvfp4_kernel<LoadGather<MicroBf16>, kAmaxRow, true>, ld);
    else go(quantize_rows_nvfp4_kernel<LoadGather<MicroBf16>, kAmaxRow, false>, ld);
  } else {
    MicroBf16 ld{LoadBf16{in, cols, true}};
    if (swz) go(quantize_rows_nvfp4_kernel<MicroBf16, kAmaxRow, true>, ld);
    else go(quantize_rows_nvfp4_kernel<MicroBf16, kAmaxRow, false>, ld);
  }
  CK(cudaGetLastError());
}

static QuantConfig spec_of(bool swz) {
  QuantConfig s;
  s.format = Format::kNvfp4, s.scaling = Scaling::kPerRow;
  s.scale_layout = swz ? ScaleLayout::kSwizzled : ScaleLayout::kCompact;
  return s;
}

static int failures = 0;
template <class A, class B>
static bool same(const char* what, const char* name, const A& a, const B& b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (uint8_t(a[i]) != uint8_t(b[i])) {
      std::printf("  MISMATCH %s %s: byte %zu ref %02x new %02x (n=%zu)\n", name, what, i, unsigned(uint8_t(a[i])),
                  unsigned(uint8_t(b[i])), n);
      ++failures;
      return false;
    }
  return true;
}

static void compare_q(const char* name, const QTensor& ref, Out& o) {
  auto d = o.data.download<uint8_t>();
  auto s = o.scale.download<uint8_t>();
  auto a = o.amax.download<uint8_t>();
  bool ok = ref.data.size() == d.size() && ref.block_scale.size() == s.size() && ref.amax.size() * 4 == a.size();
  if (!ok) {
    std::printf("  SIZE MISMATCH %s: data %zu/%zu scale %zu/%zu amax %zu/%zu\n", name, ref.data.size(), d.size(),
                ref.block_scale.size(), s.size(), ref.amax.size() * 4, a.size());
    ++failures;
    return;
  }
  ok = same("data", name, ref.data, d, d.size());
  ok = same("scale", name, ref.block_scale, s, s.size()) && ok;
  std::vector<uint8_t> ra(a.size());
  std::memcpy(ra.data(), ref.amax.data(), a.size());
  ok = same("amax", name, ra, a, a.size()) && ok;
  std::printf("  %-58s %s\n", name, ok ? "bytes equal" : "FAIL");
}

// CPU reference (optionally of a permuted input) vs the new kernel.
static void check_cpu(int64_t rows, int64_t cols, uint64_t seed, bool swz, bool gather) {
  auto h = make_input(rows, cols, seed, true);
  std::vector<int32_t> src;
  std::vector<uint16_t> hp = h;
  if (gather) {
    std::mt19937 g{uint32_t(seed)};
    src.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) src[size_t(r)] = (g() % 5 == 0) ? -1 : int32_t(g() % rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) hp[size_t(r * cols + c)] = src[size_t(r)] < 0 ? 0 : h[size_t(src[size_t(r)] * cols + c)];
  }
  std::vector<float> f(hp.size());
  for (size_t i = 0; i < hp.size(); ++i) f[i] = num::bf16_to_f32(hp[i]);
  MatrixF32 m{f, rows, cols, num::bf16_to_f32(0x7F7F), "x"};
  QTensor ref = quantize(m, spec_of(swz));
  DeviceBuffer din, dsrc;
  din.upload(std::span<const uint16_t>(h));
  if (gather) dsrc.upload(std::span<const int32_t>(src));
  Out o;
  alloc_out(o, rows, cols, swz);
  launch_new(din.as<uint16_t>(), gather ? dsrc.as<int32_t>() : nullptr, rows, cols, o, swz);
  CK(cudaDeviceSynchronize());
  char name[160];
  std::snprintf(name, sizeof name, "cpu %lldx%lld seed %llu%s%s", (long long)rows, (long long)cols,
                (unsigned long long)seed, swz ? " swizzled" : "", gather ? " gather" : "");
  compare_q(name, ref, o);
}

static double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
static double time_us(F&& f, int reps, int batch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < batch; ++i) f(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000.0f / batch);
  }
  CK(cudaGetLastError());
  return median(ts);
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool profile = argc > 1 && std::strcmp(argv[1], "--profile") == 0;  // new kernel only (for ncu)
  const uint64_t seed = 12345;
  if (profile) {
    const int64_t R = 16384, C = 8192;
    auto h = make_input(R, C, seed, false);
    DeviceBuffer din;
    din.upload(std::span<const uint16_t>(h));
    Out o;
    alloc_out(o, R, C, false);
    for (int i = 0; i < 3; ++i) launch_new(din.as<uint16_t>(), nullptr, R, C, o, false);
    CK(cudaDeviceSynchronize());
    return 0;
  }
  // 1. Small and ragged shapes against the CPU reference (compact, swizzled, gather).
  const int64_t shapes[][2] = {{37, 16}, {5, 48}, {130, 528}, {33, 4112}, {64, 8192}, {9, 16384}, {300, 2048}};
  for (auto& s : shapes)
    for (int v = 0; v < 3; ++v) check_cpu(s[0], s[1], seed + uint64_t(s[0] * 7 + s[1] + v), v == 1, v == 2);
  if (!quick) check_cpu(2048, 8192, seed + 99, false, false);

  // 2. Big input: old kernel (library) vs new kernel, bytes and time; then copy.
  const int64_t R = 16384, C = 8192;
  auto h = make_input(R, C, seed, false);
  {  // sprinkle edge rows into the big input too
    auto e = make_input(256, C, seed + 1, true);
    std::copy(e.begin(), e.end(), h.begin() + (R - 256) * C);
  }
  DeviceBuffer din, dcopy;
  din.upload(std::span<const uint16_t>(h));
  dcopy.resize(h.size() * 2);
  DeviceMatrix dm{din.get(), InputType::kBF16, R, C, num::bf16_to_f32(0x7F7F), "x"};
  DeviceQTensor qold;
  quantize_device(dm, spec_of(false), qold);
  CK(cudaDeviceSynchronize());
  QTensor ref_old = to_host(qold);
  Out o;
  alloc_out(o, R, C, false);
  launch_new(din.as<uint16_t>(), nullptr, R, C, o, false);
  CK(cudaDeviceSynchronize());
  compare_q("big 16384x8192 new vs old GPU kernel", ref_old, o);
  std::vector<int32_t> src(static_cast<size_t>(R));
  {
    std::mt19937 g(7);
    for (int64_t r = 0; r < R; ++r) src[size_t(r)] = int32_t(g() % R);
  }
  DeviceBuffer dsrc;
  dsrc.upload(std::span<const int32_t>(src));

  const double bytes = double(R * C) * 2 + double(R * C) / 2 + double(R * C / 16) + double(R) * 4;
  const int reps = 15, batch = 10;
  double t_copy = time_us([&](int) { CK(cudaMemcpyAsync(dcopy.get(), din.get(), h.size() * 2, cudaMemcpyDeviceToDevice)); }, reps, batch);
  double t_old = time_us([&](int) { quantize_device(dm, spec_of(false), qold); }, reps, batch);
  double t_new = time_us([&](int) { launch_new(din.as<uint16_t>(), nullptr, R, C, o, false); }, reps, batch);
  double t_newg = time_us([&](int) { launch_new(din.as<uint16_t>(), dsrc.as<int32_t>(), R, C, o, false); }, reps, batch);
  double t_copy2 = time_us([&](int) { CK(cudaMemcpyAsync(dcopy.get(), din.get(), h.size() * 2, cudaMemcpyDeviceToDevice)); }, reps, batch);
  const double copy_gbs = 2.0 * double(h.size()) * 2 / (std::min(t_copy, t_copy2) * 1e3);
  auto row = [&](const char* n, double us, double b) {
    const double gbs = b / (us * 1e3);
    std::printf("%-40s %9.1f us %8.1f GB/s  %.3f x copy\n", n, us, gbs, gbs / copy_gbs);
  };
  std::printf("\nshape %lldx%lld bf16, NVFP4 per_row; bytes moved %.1f MB (copy %.1f MB)\n", (long long)R, (long long)C,
              bytes / 1e6, 4.0 * double(h.size()) / 1e6);
  row("d2d copy (first)", t_copy, 4.0 * double(h.size()));
  row("d2d copy (last)", t_copy2, 4.0 * double(h.size()));
  row("old (library quantize_device)", t_old, bytes);
  row("new fast kernel", t_new, bytes);
  row("new fast kernel, gather (random src)", t_newg, bytes);
  std::printf("\n%d failures\n", failures);
  return failures ? 1 : 0;
}
