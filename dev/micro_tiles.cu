// Microbenchmark + byte-equality check of the bf16 fast tile kernels in src/quant/quantize_tiles_cuda.cuh
// (domain_amax_bf16_kernel, quantize_nvfp4_2d_bf16_kernel, quantize_mxfp8_tile_bf16_kernel, as in
// the working tree) against the CPU reference (lockstep::quantize / quantize_grouped), host-computed
// amax keys, and the prebuilt library's kernels (whose launchers this file calls for the old timings).
// Build (liblockstep.a built with -DLOCKSTEP_CUDA=ON -DLOCKSTEP_STATIC_RUNTIME=ON, sm_90a):
//   F="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --fmad=false -prec-div=true -prec-sqrt=true
//      -ftz=false --expt-relaxed-constexpr -Iinclude -Isrc -Xcompiler -fopenmp,-ffp-contract=off -DFMT_HEADER_ONLY"
//   nvcc $F -c dev/micro_tiles.cu -o gpu-bin-h2/micro_tiles.o
//   nvcc -gencode=arch=compute_90a,code=sm_90a gpu-bin-h2/micro_tiles.o /work/devlib/liblockstep.a
//        -o gpu-bin-h2/micro_tiles -lgomp -lcublas -Xcompiler -static-libstdc++,-static-libgcc
// Run: micro_tiles [--no-time]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "lockstep/quant/quantize.h"
#include "lockstep/quant/quantize_cuda.h"
#include "lockstep/tensor/cuda_timing.h"
#include "quant/quantize_tiles_cuda.cuh"

using namespace lockstep;
using namespace lockstep::cuda;
using namespace lockstep::cuda::detail;


static uint16_t bf(float v) { return num::f32_to_bf16(v); }

// Random bf16 matrix; with `edges`, each band of `band` rows gets one kind of content (ties, specials,
// NaN blocks, subnormals, any bit pattern, all-NaN rows, NaN columns).
static std::vector<uint16_t> make_input(int64_t rows, int64_t cols, uint64_t seed, bool edges, int64_t band = 1) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> h(size_t(rows * cols));
  const float scales[] = {1.0f, 1e-3f, 37.0f, 1e-30f, 1e30f, 3e-39f, 2.0f, 1e5f};
  const uint16_t specials[] = {0x0000, 0x8000, 0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x007F, 0x7F80, 0xFF80,
                               0x7FC0, 0xFFC1, 0x7F81, 0x0080, 0x3E80, 0xBF40};
  const float ties[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
  int kind = 0;
  float sc = 1.0f;
  for (int64_t r = 0; r < rows; ++r) {
    if (r % band == 0) kind = edges ? int(g() % 9) : 0, sc = scales[g() % 8];
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t v;
      if (kind == 1) {
        v = (c % 16 == 0) ? bf(6.0f) : bf(ties[g() % 15]);
        if (g() & 1) v ^= 0x8000;
      } else if (kind == 2 && g() % 64 == 0) {
        v = specials[g() % 15];
      } else if (kind == 3) {
        const int64_t b = c / 16;
        v = (b % 3 == 0) ? 0x8000 : (b % 3 == 1) ? 0x7FC0 : bf(nd(g) * sc);
      } else if (kind == 4) {
        v = uint16_t(g() % 0x80) | uint16_t((g() & 1) << 15);
      } else if (kind == 5) {
        v = uint16_t(g());
      } else if (kind == 6) {
        v = 0xFFC0;  // an all-NaN row
      } else if (kind == 7) {
        v = (c % 96 < 32) ? 0x7FC1 : ((c % 96 < 40) ? 0x8000 : bf(nd(g) * sc));  // NaN / -0 column blocks
      } else {
        v = bf(nd(g) * sc);
      }
      h[size_t(r * cols + c)] = v;
    }
  }
  return h;
}

static int failures = 0;
static bool same_bytes(const char* name, const char* what, const void* a, const void* b, size_t n, size_t nb) {
  if (n != nb) {
    std::printf("  SIZE MISMATCH %s %s: %zu vs %zu\n", name, what, n, nb);
    ++failures;
    return false;
  }
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) {
      std::printf("  MISMATCH %s %s: byte %zu ref %02x new %02x (n=%zu)\n", name, what, i, x[i], y[i], n);
      ++failures;
      return false;
    }
  return true;
}

static bool same_q(const char* name, const QTensor& ref, const QTensor& got) {
  bool ok = same_bytes(name, "data", ref.data.data(), got.data.data(), ref.data.size(), got.data.size());
  ok = same_bytes(name, "scale", ref.block_scale.data(), got.block_scale.data(), ref.block_scale.size(), got.block_scale.size()) && ok;
  ok = same_bytes(name, "amax", ref.amax.data(), got.amax.data(), ref.amax.size() * 4, got.amax.size() * 4) && ok;
  ok = same_bytes(name, "data_col", ref.data_colwise.data(), got.data_colwise.data(), ref.data_colwise.size(), got.data_colwise.size()) && ok;
  ok = same_bytes(name, "scale_col", ref.block_scale_colwise.data(), got.block_scale_colwise.data(),
                  ref.block_scale_colwise.size(), got.block_scale_colwise.size()) && ok;
  std::printf("  %-70s %s\n", name, ok ? "bytes equal" : "FAIL");
  return ok;
}

// ---- launching the new kernels (as src/quant/quantize_tiles_cuda.cu does) ------------------------
template <class K>
static int occ(K kernel, int threads, size_t smem) {
  int n = 0;
  LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return n < 1 ? 1 : n;
}
static int g_sms = 0;

static void new_amax(const uint16_t* x, const AmaxParams& p) {
  const int64_t units = (p.cols + 255) / 256 * ((p.rows + 7) / 8);
  auto go = [&](auto kernel) {
    const int64_t cap = int64_t(occ(kernel, 256, 0)) * g_sms, need = (units + 7) / 8;
    kernel<<<unsigned(std::min(cap, need)), 256>>>(x, p);
  };
  if (p.dom_kind == kDomTensor) {
    const int64_t n16 = p.rows * p.cols / 8;
    const int64_t cap = int64_t(occ(domain_amax_flat_bf16_kernel<>, 256, 0)) * g_sms, need = (n16 + 2047) / 2048;
    domain_amax_flat_bf16_kernel<><<<unsigned(std::min(cap, need)), 256>>>(reinterpret_cast<const uint4*>(x), n16, p.keys);
  } else if (p.dom_kind == kDomGroup) go(domain_amax_bf16_kernel<kDomGroup>);
  else go(domain_amax_bf16_kernel<kDomTile128>);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

static void new_2d(const uint16_t* x, const Nvfp4TileParams& p) {
  const int64_t units = (p.cols + 255) / 256 * (p.rows / 16);
  const unsigned grid = unsigned((units + kNvfp4TileWarps - 1) / kNvfp4TileWarps);
  if (p.scale.swizzled) quantize_nvfp4_2d_bf16_kernel<true><<<grid, kNvfp4TileWarps * 32>>>(x, p);
  else quantize_nvfp4_2d_bf16_kernel<false><<<grid, kNvfp4TileWarps * 32>>>(x, p);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <int kCols>
static void new_mx(const uint16_t* x, const MxTileParams& p) {
  auto go = [&](auto kernel) {
    const size_t smem = mxfp8_tile_smem<kCols>();
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    dim3 grid(unsigned((p.cols + kCols - 1) / kCols), unsigned(p.rows / 32));
    kernel<<<grid, kCols / 2, smem>>>(x, p);
  };
  const bool swz = p.rowwise && p.scale.swizzled;
  if (swz) p.e5m2 ? go(quantize_mxfp8_tile_bf16_kernel<kCols, true, true>) : go(quantize_mxfp8_tile_bf16_kernel<kCols, true, false>);
  else p.e5m2 ? go(quantize_mxfp8_tile_bf16_kernel<kCols, false, true>) : go(quantize_mxfp8_tile_bf16_kernel<kCols, false, false>);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

static ScaleOut scale_out(DeviceQTensor& q) {
  ScaleOut s;
  s.p = q.block_scale.as<uint8_t>();
  s.cols = q.meta.scale_cols;
  s.padded_cols = (q.meta.scale_cols + 3) / 4 * 4;
  s.swizzled = q.meta.scale_layout == ScaleLayout::kSwizzled;
  return s;
}

static void poison(DeviceQTensor& q) {
  q.data.fill(0xFF), q.amax.fill(0xFF), q.data_colwise.fill(0xFF), q.block_scale_colwise.fill(0xFF);
  q.block_scale.fill(q.meta.scale_layout == ScaleLayout::kSwizzled ? 0 : 0xFF);  // swizzled padding must stay 0
}

// NVFP4 2-D (per tensor or per group) through the new amax + library finish + new 2-D kernels, into q
// (allocated by the library's quantize_device for the same spec).
static void new_nvfp4_2d_pipeline(const DeviceMatrix& x, DeviceQTensor& q, const DeviceGroups* g) {
  const bool grouped = g != nullptr;
  const int64_t ndom = grouped ? g->groups() : 1;
  q.ws_keys.resize(size_t(ndom) * 4), q.ws_dom.resize(size_t(ndom) * 4);
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(q.ws_keys.get(), 0, size_t(ndom) * 4));
  AmaxParams a;
  a.rows = x.rows, a.cols = x.cols, a.nchunks = int(x.cols / 16), a.dom_kind = grouped ? kDomGroup : kDomTensor;
  a.offsets = grouped ? g->device.as<int64_t>() : nullptr, a.groups = grouped ? g->groups() : 0, a.keys = q.ws_keys.as<uint32_t>();
  new_amax(static_cast<const uint16_t*>(x.data), a);
  FinishParams f;
  f.ndom = ndom, f.keys = q.ws_keys.as<uint32_t>(), f.offsets = a.offsets, f.cols = x.cols;
  f.tensor_nonempty = x.rows * x.cols > 0, f.dom_val = q.ws_dom.as<float>(), f.amax_out = q.amax.as<float>();
  launch_finish(f, nullptr);  // the library's (unchanged) finishing kernel
  Nvfp4TileParams p;
  p.rows = x.rows, p.cols = x.cols, p.nchunks = int(x.cols / 16), p.dom_kind = a.dom_kind;
  p.dom_val = q.ws_dom.as<float>(), p.offsets = a.offsets, p.groups = a.groups;
  p.data = q.data.as<uint8_t>(), p.scale = scale_out(q);
  new_2d(static_cast<const uint16_t*>(x.data), p);
}

template <int kCols>
static void new_mx_into(const DeviceMatrix& x, const QuantConfig& spec, DeviceQTensor& q) {
  MxTileParams p;
  p.rows = x.rows, p.cols = x.cols, p.rowwise = spec.rowwise, p.colwise = true;
  p.e5m2 = spec.elem == ElemCodec::kE5M2, p.elem_max = p.e5m2 ? num::kE5M2Max : num::kE4M3Max;
  if (spec.rowwise) p.data = q.data.as<uint8_t>(), p.scale = scale_out(q);
  p.data_col = q.data_colwise.as<uint8_t>(), p.scale_col = q.block_scale_colwise.as<uint8_t>();
  new_mx<kCols>(static_cast<const uint16_t*>(x.data), p);
}

// MatrixF32 is a view: `f` must outlive it.
static MatrixF32 to_f32(const std::vector<uint16_t>& h, std::vector<float>& f, int64_t rows, int64_t cols) {
  f.resize(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = num::bf16_to_f32(h[i]);
  return MatrixF32{f, rows, cols, num::bf16_to_f32(0x7F7F), "x"};
}

// ---- checks -----------------------------------------------------------------------------------
static void check_mx(int64_t rows, int64_t cols, uint64_t seed, bool rowwise, bool e5m2, bool swz) {
  auto h = make_input(rows, cols, seed, true, 8);
  std::vector<float> fv;
  MatrixF32 m = to_f32(h, fv, rows, cols);
  QuantConfig s;
  s.format = Format::kMxfp8, s.scaling = Scaling::kBlock1x32, s.rowwise = rowwise, s.colwise = true;
  s.elem = e5m2 ? ElemCodec::kE5M2 : ElemCodec::kE4M3, s.scale_layout = swz ? ScaleLayout::kSwizzled : ScaleLayout::kCompact;
  QTensor ref = quantize(m, s);
  DeviceBuffer din;
  din.upload(std::span<const uint16_t>(h));
  DeviceMatrix dm{din.get(), InputType::kBF16, rows, cols, m.type_max, "x"};
  for (int w = 0; w < 2; ++w) {
    DeviceQTensor q;
    quantize_device(dm, s, q);
    poison(q);
    if (w == 0) new_mx_into<512>(dm, s, q);
    else new_mx_into<256>(dm, s, q);
    LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
    char name[200];
    std::snprintf(name, sizeof name, "mxfp8%s%s%s %lldx%lld tile %d%s", rowwise ? " row+col" : " col", e5m2 ? " e5m2" : "",
                  swz ? " swz" : "", (long long)rows, (long long)cols, w == 0 ? 512 : 256, "");
    same_q(name, ref, to_host(q));
  }
}

static void check_2d(int64_t rows, int64_t cols, uint64_t seed, bool swz, const std::vector<int64_t>* offsets) {
  auto h = make_input(rows, cols, seed, true, 16);
  std::vector<float> fv;
  MatrixF32 m = to_f32(h, fv, rows, cols);
  QuantConfig s;
  s.format = Format::kNvfp4, s.scaling = offsets ? Scaling::kPerGroup : Scaling::kPerTensor, s.block2d = true;
  s.scale_layout = swz ? ScaleLayout::kSwizzled : ScaleLayout::kCompact;
  QTensor ref = offsets ? quantize_grouped(m, *offsets, s) : quantize(m, s);
  DeviceBuffer din;
  din.upload(std::span<const uint16_t>(h));
  DeviceMatrix dm{din.get(), InputType::kBF16, rows, cols, m.type_max, "x"};
  std::unique_ptr<DeviceGroups> g;
  if (offsets) g = std::make_unique<DeviceGroups>(*offsets);
  DeviceQTensor q;
  quantize_device(dm, s, q, g.get());
  poison(q);
  new_nvfp4_2d_pipeline(dm, q, g.get());
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  char name[200];
  std::snprintf(name, sizeof name, "nvfp4 2d %s%s %lldx%lld", offsets ? "per_group" : "per_tensor", swz ? " swz" : "",
                (long long)rows, (long long)cols);
  same_q(name, ref, to_host(q));
}

// Keys of the new amax kernel vs keys computed on the host.
static void check_amax(int64_t rows, int64_t cols, uint64_t seed, int kind, const std::vector<int64_t>& offsets, int fill) {
  auto h = make_input(rows, cols, seed, true, 8);
  if (fill == 1) std::fill(h.begin(), h.end(), uint16_t(0x7FC0));  // only NaN
  if (fill == 2) std::fill(h.begin(), h.end(), uint16_t(0x8000));  // only -0
  const int64_t tile_cols = (cols + 127) / 128;
  const int64_t ngroups = int64_t(offsets.size()) - 1;
  const int64_t ndom = kind == kDomTensor ? 1 : kind == kDomGroup ? ngroups : (rows + 127) / 128 * tile_cols;
  std::vector<uint32_t> ref(size_t(ndom), 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t g = 0;
    if (kind == kDomGroup) {
      while (g + 1 < ngroups && offsets[size_t(g + 1)] <= r) ++g;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t b = uint32_t(h[size_t(r * cols + c)] & 0x7FFF) << 16;
      if (b > 0x7F800000u) continue;
      const int64_t d = kind == kDomTensor ? 0 : kind == kDomGroup ? g : (r / 128) * tile_cols + c / 128;
      ref[size_t(d)] = std::max(ref[size_t(d)], b + 1);
    }
  }
  DeviceBuffer din, keys, doff;
  din.upload(std::span<const uint16_t>(h));
  keys.resize(size_t(ndom) * 4);
  keys.fill(0);
  if (kind == kDomGroup) doff.upload(std::span<const int64_t>(offsets));
  AmaxParams a;
  a.rows = rows, a.cols = cols, a.nchunks = int((cols + 15) / 16), a.dom_kind = kind, a.tile_cols = tile_cols;
  a.offsets = kind == kDomGroup ? doff.as<int64_t>() : nullptr, a.groups = kind == kDomGroup ? ngroups : 0;
  a.keys = keys.as<uint32_t>();
  new_amax(din.as<uint16_t>(), a);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  auto got = keys.download<uint32_t>();
  char name[200];
  std::snprintf(name, sizeof name, "amax keys %s %lldx%lld%s", kind == kDomTensor ? "tensor" : kind == kDomGroup ? "group" : "tile128",
                (long long)rows, (long long)cols, fill == 1 ? " all-NaN" : fill == 2 ? " all -0" : "");
  const bool ok = same_bytes(name, "keys", ref.data(), got.data(), ref.size() * 4, got.size() * 4);
  std::printf("  %-70s %s\n", name, ok ? "keys equal" : "FAIL");
}

// Median time per call: 15 samples of 5 back-to-back calls (lockstep::cuda::median_time_us).
template <class F>
static double time_us(F&& f, int reps = 15, int batch = 5) {
  return median_time_us([&](int) { f(); }, reps, nullptr, batch);
}

int main(int argc, char** argv) {
  const bool no_time = argc > 1 && std::strcmp(argv[1], "--no-time") == 0;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  const uint64_t seed = 777;
  // 1. Small and ragged shapes against the CPU reference / host keys.
  std::printf("checks against the CPU reference:\n");
  const int64_t mx_shapes[][2] = {{32, 32}, {64, 544}, {96, 4128}, {32, 8192}, {128, 1056}};
  for (auto& s : mx_shapes)
    for (int v = 0; v < 4; ++v) check_mx(s[0], s[1], seed + uint64_t(s[0] * 3 + s[1] + v), v != 1, v == 2, v == 3);
  const int64_t t2_shapes[][2] = {{16, 16}, {32, 272}, {48, 4096}, {160, 1040}, {64, 8192}};
  for (auto& s : t2_shapes)
    for (int v = 0; v < 2; ++v) check_2d(s[0], s[1], seed + uint64_t(s[0] * 5 + s[1] + v), v == 1, nullptr);
  {
    std::vector<int64_t> off{0, 32, 32, 80, 208, 208, 256};  // empty groups, multiples of 16
    check_2d(256, 1024, seed + 5, false, &off);
    check_2d(256, 528, seed + 6, true, &off);
  }
  {
    std::vector<int64_t> none{0};
    std::vector<int64_t> off{0, 3, 3, 50, 51, 200, 300};
    const int64_t am_shapes[][2] = {{1, 16}, {7, 48}, {300, 1040}, {129, 256}, {300, 4112}, {1024, 2048}};
    for (auto& s : am_shapes) {
      check_amax(s[0], s[1], seed + uint64_t(s[0] + s[1]), kDomTensor, none, 0);
      check_amax(s[0], s[1], seed + uint64_t(s[0] + s[1]) + 1, kDomTile128, none, 0);
    }
    check_amax(300, 1040, seed + 2, kDomGroup, off, 0);
    check_amax(300, 4112, seed + 3, kDomGroup, off, 0);
    check_amax(300, 1040, seed + 4, kDomTensor, none, 1);
    check_amax(300, 1040, seed + 4, kDomTile128, none, 1);
    check_amax(300, 1040, seed + 4, kDomGroup, off, 1);
    check_amax(300, 1040, seed + 4, kDomTensor, none, 2);
  }
  // 2. Big input: new kernels vs the library's, bytes; then timings.
  const int64_t R = 16384, C = 8192;
  auto h = make_input(R, C, seed, false);
  {
    auto e = make_input(512, C, seed + 1, true, 16);
    std::copy(e.begin(), e.end(), h.begin() + (R - 512) * C);
  }
  DeviceBuffer din, dcopy;
  din.upload(std::span<const uint16_t>(h));
  dcopy.resize(h.size() * 2);
  DeviceMatrix dm{din.get(), InputType::kBF16, R, C, num::bf16_to_f32(0x7F7F), "x"};
  QuantConfig s2;
  s2.format = Format::kNvfp4, s2.scaling = Scaling::kPerTensor, s2.block2d = true;
  QuantConfig smx;
  smx.format = Format::kMxfp8, smx.scaling = Scaling::kBlock1x32, smx.colwise = true;
  DeviceQTensor q2, qmx;
  quantize_device(dm, s2, q2);
  quantize_device(dm, smx, qmx);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  const QTensor ref2 = to_host(q2), refmx = to_host(qmx);
  poison(q2);
  new_nvfp4_2d_pipeline(dm, q2, nullptr);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  same_q("big 16384x8192 nvfp4 2d per_tensor: new vs library", ref2, to_host(q2));
  poison(qmx);
  new_mx_into<512>(dm, smx, qmx);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  same_q("big 16384x8192 mxfp8 row+col: new (512) vs library", refmx, to_host(qmx));
  poison(qmx);
  new_mx_into<256>(dm, smx, qmx);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  same_q("big 16384x8192 mxfp8 row+col: new (256) vs library", refmx, to_host(qmx));
  std::printf("\n%d failures\n", failures);
  if (no_time) return failures ? 1 : 0;

  // Timings. Bytes as the bench counts them: input once + outputs.
  const double in_b = double(R * C) * 2;
  const double t_copy = time_us([&] { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dcopy.get(), din.get(), h.size() * 2, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2 * in_b / (t_copy * 1e3);
  auto row = [&](const char* n, double us, double b) {
    const double gbs = b / (us * 1e3);
    std::printf("%-58s %8.1f us %8.1f GB/s %7.3f x copy\n", n, us, gbs, gbs / copy_gbs);
  };
  std::printf("\nshape %lldx%lld bf16\n", (long long)R, (long long)C);
  row("d2d copy", t_copy, 2 * in_b);
  DeviceBuffer keys(1024 * 1024 * 4);
  std::vector<int64_t> goff{0};
  for (int g = 0; g < 128; ++g) goff.push_back(g == 127 ? R : std::min(R, goff.back() + ((g % 7 == 3) ? 0 : R / 112)));
  DeviceGroups gg(goff);
  for (int kind : {int(kDomTensor), int(kDomGroup), int(kDomTile128)}) {
    AmaxParams a;
    a.rows = R, a.cols = C, a.nchunks = int(C / 16), a.dom_kind = kind, a.tile_cols = (C + 127) / 128, a.keys = keys.as<uint32_t>();
    if (kind == kDomGroup) a.offsets = gg.device.as<int64_t>(), a.groups = gg.groups();
    const InputRef in{din.get(), true, C};
    const char* kn = kind == kDomTensor ? "tensor" : kind == kDomGroup ? "group (128)" : "128x128";
    char n1[100], n2[100];
    std::snprintf(n1, sizeof n1, "amax pass %s, library kernel (read only)", kn);
    std::snprintf(n2, sizeof n2, "amax pass %s, new kernel (read only)", kn);
    row(n1, time_us([&] { launch_domain_amax(in, a, nullptr); }), in_b);
    row(n2, time_us([&] { new_amax(din.as<uint16_t>(), a); }), in_b);
  }
  const double b2 = in_b + double(R * C) / 2 + double(R * C / 16);
  {
    Nvfp4TileParams p;
    p.rows = R, p.cols = C, p.nchunks = int(C / 16), p.dom_val = q2.ws_dom.as<float>();
    p.data = q2.data.as<uint8_t>(), p.scale = scale_out(q2);
    const InputRef in{din.get(), true, C};
    row("nvfp4 2-D quantize pass, library kernel", time_us([&] { launch_nvfp4_2d(in, p, nullptr); }), b2);
    row("nvfp4 2-D quantize pass, new kernel", time_us([&] { new_2d(din.as<uint16_t>(), p); }), b2);
    row("nvfp4 2-D end to end, library quantize_device", time_us([&] { quantize_device(dm, s2, q2); }), b2 + 4);
    row("nvfp4 2-D end to end, new amax + finish + 2-D", time_us([&] { new_nvfp4_2d_pipeline(dm, q2, nullptr); }), b2 + 4);
  }
  {
    const double bmx = in_b + 2 * double(R * C) + 2 * double(R * C / 32);
    MxTileParams p;
    p.rows = R, p.cols = C, p.elem_max = 448.0f, p.data = qmx.data.as<uint8_t>(), p.scale = scale_out(qmx);
    p.data_col = qmx.data_colwise.as<uint8_t>(), p.scale_col = qmx.block_scale_colwise.as<uint8_t>();
    const InputRef in{din.get(), true, C};
    row("mxfp8 row+col, library kernel", time_us([&] { launch_mxfp8_tile(in, p, nullptr); }), bmx);
    row("mxfp8 row+col, new kernel 512 cols", time_us([&] { new_mx<512>(din.as<uint16_t>(), p); }), bmx);
    row("mxfp8 row+col, new kernel 256 cols", time_us([&] { new_mx<256>(din.as<uint16_t>(), p); }), bmx);
    MxTileParams pc = p;
    pc.rowwise = false;
    row("mxfp8 columnwise only, library kernel", time_us([&] { launch_mxfp8_tile(in, pc, nullptr); }), in_b + double(R * C) + double(R * C / 32));
    row("mxfp8 columnwise only, new kernel 256 cols", time_us([&] { new_mx<256>(din.as<uint16_t>(), pc); }), in_b + double(R * C) + double(R * C / 32));
    std::printf("occupancy: mx512 %d, mx256 %d, 2d %d, amax flat %d, amax tile128 %d CTAs/SM\n",
                occ(quantize_mxfp8_tile_bf16_kernel<512, false, false>, 256, mxfp8_tile_smem<512>()),
                occ(quantize_mxfp8_tile_bf16_kernel<256, false, false>, 128, mxfp8_tile_smem<256>()),
                occ(quantize_nvfp4_2d_bf16_kernel<false>, 128, 0), occ(domain_amax_flat_bf16_kernel<>, 256, 0),
                occ(domain_amax_bf16_kernel<kDomTile128>, 256, 0));
  }
  const double t_copy2 = time_us([&] { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dcopy.get(), din.get(), h.size() * 2, cudaMemcpyDeviceToDevice)); });
  row("d2d copy (again)", t_copy2, 2 * in_b);
  std::printf("\n%d failures\n", failures);
  return failures ? 1 : 0;
}
