// Microbenchmark of the decode GEMM (src/gemm/qgemm_decode_cuda.cu, included) against the kernel of
// an older commit (namespace gemm_old, file gpu-bin-h3/old_decode.cu): bench shapes x M x formats
// and the MoE decode graph (48 layers x 8 experts, FC1 + SwiGLU, FC2), events around 20
// back-to-back launches, weights rotated past L2; ratio to a 1 GiB D2D copy measured in the same
// run; a pure streaming-read probe (the ceiling of a ~10 us read kernel); cluster occupancy.
// Each dense row is timed with W preload unset and set (GemmOperandView::preload, "pre" column;
// the old kernel with it set, as `lockstep bench gemm` runs it, sampled alternately with "pre");
// MoE variants P:N1:N2 set preload and force the FC1 / FC2 block sizes.
// Checks: new == old bit for bit when both use the same order (cmp=bits), else max rel diff;
// batch invariance (row 0 alone == row 0 of M = 16).
// Build (repository root; gpu-bin-h3/ is ignored):
//   git show <commit>:src/gemm/qgemm_decode_cuda.cu | sed 's|"qgemm_cuda.cuh"|"gemm/qgemm_cuda.cuh"|; \
//     s/\bkFmt/kOldFmt/g; s/\bdecode_slice_blocks\b/old_slice_blocks/g; s/\bdecode_smem_bytes\b/old_smem_bytes/g; \
//     s/\bkSmemLimit\b/kOldSmemLimit/g; s/\blaunch_decode_t\b/old_launch_decode_t/g' > gpu-bin-h3/old_decode.cu
//   (the renames keep the host compiler from finding two candidates through the using-directive)
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --fmad=false -prec-div=true -prec-sqrt=true \
//     -ftz=false --expt-relaxed-constexpr -Iinclude -Isrc [-DLOCKSTEP_DECODE_...] dev/micro_decode2.cu \
//     -o gpu-bin-h3/micro_decode2 build-cuda/liblockstep.a -Xcompiler "-static-libstdc++ -static-libgcc -fopenmp"
// Run: gpu-bin-h3/micro_decode2 [quick] [nomoe] [nodense] [noold] [sweep] [verbose] [timeline] [P:N1:N2 ...]
// (timeline: per-phase %globaltimer stamps of every warp over 24 back-to-back calls at M = 1 and 16
// and of the MoE FC1 / FC2 calls; needs a build with -DMICRO_TIMELINE, whose kernel records them
// through LOCKSTEP_DECODE_TIMELINE and is slower for it: time the kernels in a build without it)
// (P:N1:N2: an extra MoE variant, W preload 0/1 and the FC1 / FC2 block size in warps, 0 = auto)
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <vector>

#include "lockstep/tensor/cuda_timing.h"

int g_force_nw = 0, g_last_nw = 0, g_verbose = 0;
bool g_timeline = false;
#define LOCKSTEP_DECODE_VERBOSE g_verbose
#define LOCKSTEP_DECODE_FORCE_NW g_force_nw
#define LOCKSTEP_DECODE_LAST_NW g_last_nw
#ifdef MICRO_TIMELINE  // -DMICRO_TIMELINE: the kernel stamps its phases (costs it time: a separate build)
#define LOCKSTEP_DECODE_TIMELINE 1
#endif
#include "../src/gemm/qgemm_decode_cuda.cu"

namespace lockstep::cuda::gemm_old {
using namespace lockstep::cuda::gemm_detail;
}
#define gemm_detail gemm_old
#include "../gpu-bin-h3/old_decode.cu"
#undef gemm_detail

using namespace lockstep;
using namespace lockstep::cuda;

__global__ void fill_k(uint8_t* p, size_t n, uint32_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    uint8_t b = uint8_t(h);
    if (kind == 1) b = (i & 1) ? uint8_t(0x3F | (h & 0x80)) : uint8_t(h);  // bf16 +-[0.5, 1)
    if (kind == 2) b = uint8_t(0x30 + (h & 0xF));                         // E4M3 scales near 1
    if (kind == 3) b = uint8_t(122 + (h % 10));                           // E8M0 near 1
    if (kind == 4) b = uint8_t(h & 0xF7);                                 // E4M3 no NaN, E5M2 no inf/NaN
    p[i] = b;
  }
}
void fill(DeviceBuffer& b, size_t bytes, uint32_t seed, int kind) {
  b.resize(bytes);
  fill_k<<<1024, 256>>>(b.as<uint8_t>(), bytes, seed, kind);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}
struct PackedW {
  DeviceBuffer data, scale;
  GemmOperandView view;
  double bytes = 0;
};
void make_packed(PackedW& w, Format f, int64_t rows, int64_t k, uint32_t seed, bool e5 = false) {
  const size_t n = size_t(rows) * size_t(k);
  w.view = GemmOperandView{};
  w.view.format = f, w.view.rows = rows, w.view.cols = k;
  if (e5) w.view.elem = ElemCodec::kE5M2;
  if (f == Format::kNvfp4) {
    fill(w.data, n / 2, seed, 0);
    fill(w.scale, n / 16, seed + 1, 2);
  } else if (f == Format::kMxfp8) {
    fill(w.data, n, seed, 4);
    fill(w.scale, n / 32, seed + 1, 3);
  } else {
    fill(w.data, n, seed, 4);
  }
  w.view.data = w.data.get();
  w.view.block_scale = w.scale.empty() ? nullptr : w.scale.as<uint8_t>();
  w.bytes = double(w.data.size() + w.scale.size());
}
const char* fname(Format f) { return f == Format::kNvfp4 ? "nvfp4" : f == Format::kMxfp8 ? "mxfp8" : "fp8"; }
std::vector<float> down(const DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
  return h;
}

// Pure streaming read: each block reads a contiguous chunk (16-byte multiples; the last block the
// rest: every byte once), 16-byte loads, kU in flight per thread.
template <int kU>
__device__ __forceinline__ void read_chunk(const uint8_t* p, size_t bytes, uint32_t* sink) {
  const size_t chunk = (bytes / gridDim.x + 15) & ~size_t(15);
  const size_t begin = chunk * blockIdx.x, end = begin + chunk < bytes ? begin + chunk : bytes;
  uint32_t x = 0;
  for (size_t o = begin + size_t(threadIdx.x) * 16; o < end; o += size_t(256) * 16 * kU) {
    uint4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const size_t q = o + size_t(u) * 256 * 16;
      v[u] = q < end ? gemm_detail::ldg_stream16(p + q) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (x == 0x12345678u) sink[0] = x;
}
template <int kU>
__global__ void __launch_bounds__(256) read_probe(const uint8_t* p, size_t bytes, uint32_t* sink) {
  read_chunk<kU>(p, bytes, sink);
}
// The same, launched with programmatic dependent launch: the next launch may start at once; kWait:
// the reads wait for the previous kernel (griddepcontrol.wait), as a kernel that needs its input.
template <int kU, bool kWait>
__global__ void __launch_bounds__(256) read_probe_pdl(const uint8_t* p, size_t bytes, uint32_t* sink) {
  gemm_detail::pdl_launch_dependents();
  if (kWait) gemm_detail::pdl_wait();
  read_chunk<kU>(p, bytes, sink);
}

// Timeline of back-to-back launches (W preload set): lane 0 of each warp records %globaltimer at
// entry (0), after the table build and griddepcontrol.wait (1), after A is staged (2), at the end of
// the k loop (3), after the first cluster barrier (4) and at exit (5). Prints, per phase boundary,
// the min / median / max over warps relative to the launch's first entry (ns), averaged over
// launches, and the launch period.
void timeline(const char* name, const std::function<void(int)>& launch, cudaStream_t s) {
#ifndef MICRO_TIMELINE
  (void)launch, (void)s;
  std::printf("timeline %s: build with -DMICRO_TIMELINE\n", name);
  return;
#else
  const int launches = 24;
  DeviceBuffer buf(size_t(launches + 4) * 16 * 8 * 8192);
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(buf.get(), 0, buf.size(), s));
  for (int i = 0; i < 3; ++i) launch(i);
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  unsigned long long* p = buf.as<unsigned long long>();
  unsigned zero = 0;
  LOCKSTEP_CUDA_CHECK(cudaMemcpyToSymbol(gemm_detail::g_decode_tl, &p, sizeof p));
  LOCKSTEP_CUDA_CHECK(cudaMemcpyToSymbol(gemm_detail::g_decode_tl_ticket, &zero, sizeof zero));
  for (int i = 0; i < launches; ++i) launch(i);
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  unsigned tickets = 0;
  LOCKSTEP_CUDA_CHECK(cudaMemcpyFromSymbol(&tickets, gemm_detail::g_decode_tl_ticket, sizeof tickets));
  p = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaMemcpyToSymbol(gemm_detail::g_decode_tl, &p, sizeof p));
  std::vector<unsigned long long> h(size_t(tickets) * 16);
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(h.data(), buf.get(), h.size() * 8, cudaMemcpyDeviceToHost));
  const size_t per = tickets / launches;
  if (per * launches != tickets) { std::printf("timeline %s: %u tickets for %d launches\n", name, tickets, launches); return; }
  double q[6][3] = {}, period = 0, gap = 0, cyc[5] = {};
  int used = 0;
  std::vector<unsigned long long> prev_start(1, 0), prev_end(1, 0);
  for (int L = 4; L < launches; ++L) {
    const unsigned long long* r = h.data() + size_t(L) * per * 16;
    unsigned long long st = ~0ull, en = 0;
    for (size_t i = 0; i < per; ++i) st = std::min(st, r[i * 16 + 0]), en = std::max(en, r[i * 16 + 5]);
    if (L > 4) period += double(st - prev_start[0]), gap += double(int64_t(st) - int64_t(prev_end[0]));
    prev_start[0] = st, prev_end[0] = en;
    for (int k = 0; k < 6; ++k) {
      std::vector<double> v(per);
      for (size_t i = 0; i < per; ++i) v[i] = double(r[i * 16 + k] - st);
      std::sort(v.begin(), v.end());
      q[k][0] += v[0], q[k][1] += v[per / 2], q[k][2] += v[per - 1];
    }
    for (int k = 0; k < 5; ++k) {
      std::vector<double> v(per);
      for (size_t i = 0; i < per; ++i) v[i] = double(r[i * 16 + 7 + k] - r[i * 16 + 6 + k]);
      std::sort(v.begin(), v.end());
      cyc[k] += v[per / 2];
    }
    ++used;
  }
  std::printf("timeline %-34s %zu warps/launch, period %.2f us, start - previous end %.2f us\n", name, per,
              period / (used - 1) * 1e-3, gap / (used - 1) * 1e-3);
  const char* names[6] = {"entry", "wait done", "A staged", "loop end", "cluster 1", "exit"};
  for (int k = 0; k < 6; ++k)
    std::printf("   %-10s min %7.2f  med %7.2f  max %7.2f us%s", names[k], q[k][0] / used * 1e-3, q[k][1] / used * 1e-3,
                q[k][2] / used * 1e-3, k ? "" : "");
  std::printf("\n   median cycles per phase: table+wait %.0f, A %.0f, loop %.0f, barrier %.0f, reduce+store %.0f\n",
              cyc[0] / used, cyc[1] / used, cyc[2] / used, cyc[3] / used, cyc[4] / used);
  LOCKSTEP_CUDA_CHECK(cudaMemcpyToSymbol(gemm_detail::g_decode_tl_ticket, &zero, sizeof zero));
#endif
}

// Median time of one launch of a CUDA graph captured from body() (31 samples).
double graph_time_us(const std::function<void()>& body, cudaStream_t s) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LOCKSTEP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body();
  LOCKSTEP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  LOCKSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 31, s, 1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

int main(int argc, char** argv) {
  bool quick = false, moe = true, old = true, sweep = false, verbose = false, dense = true;
  std::vector<const char*> moe_specs;  // extra MoE variants "P:N1:N2" (preload, FC1 nw, FC2 nw)
  for (int i = 1; i < argc; ++i) {
    if (std::strchr(argv[i], ':')) moe_specs.push_back(argv[i]);
    if (!std::strcmp(argv[i], "quick")) quick = true;
    if (!std::strcmp(argv[i], "nomoe")) moe = false;
    if (!std::strcmp(argv[i], "nodense")) dense = false;
    if (!std::strcmp(argv[i], "noold")) old = false;
    if (!std::strcmp(argv[i], "sweep")) sweep = true;
    if (!std::strcmp(argv[i], "verbose")) verbose = true;
    if (!std::strcmp(argv[i], "timeline")) g_timeline = true;
  }
  const int iters = 15, batch = 20;
  cudaStream_t s;
  LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms = 0;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double copy_gbps = 0;
  {
    DeviceBuffer x, y;
    const size_t bytes = size_t(1) << 30;
    fill(x, bytes, 1, 0);
    y.resize(bytes);
    const double us = median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), bytes, cudaMemcpyDeviceToDevice, s)); }, iters, s, 1);
    copy_gbps = 2.0 * double(bytes) / us * 1e-3;
  }
  std::printf("copy %.0f GB/s, %d SMs\n", copy_gbps, sms);
  {  // read ceiling: 33 MB, 4 copies rotated
    DeviceBuffer sink(64);
    const size_t bytes = size_t(33) << 20;
    DeviceBuffer c[4];
    for (int i = 0; i < 4; ++i) fill(c[i], bytes, 50 + i, 0);
    for (int bps : {1, 2, 4, 8}) {
      const unsigned grid = unsigned(sms * bps);
      const double us4 = median_time_us([&](int i) { read_probe<4><<<grid, 256, 0, s>>>(c[i % 4].as<uint8_t>(), bytes, sink.as<uint32_t>()); }, iters, s, batch);
      const double us8 = median_time_us([&](int i) { read_probe<8><<<grid, 256, 0, s>>>(c[i % 4].as<uint8_t>(), bytes, sink.as<uint32_t>()); }, iters, s, batch);
      std::printf("read probe 33 MB, %d blocks/SM: u4 %.2f us (%.3f of copy), u8 %.2f us (%.3f)\n", bps, us4,
                  double(bytes) / us4 * 1e-3 / copy_gbps, us8, double(bytes) / us8 * 1e-3 / copy_gbps);
    }
  }
  DeviceBuffer act, ws_old, ws_new, out_new, out_old, out1;
  fill(act, size_t(16) * 16384 * 2, 7, 1);
  int bad = 0;
  struct Shape { int64_t n, k; };
  std::vector<Shape> shapes = {{14336, 4096}, {4096, 14336}, {8192, 8192}};
  std::vector<int64_t> ms = {1, 2, 4, 8, 16};
  if (quick) ms = {1, 8, 16};
  struct Fm { Format f; bool e5; };
  const Fm formats[] = {{Format::kNvfp4, false}, {Format::kMxfp8, false}, {Format::kFp8, false}, {Format::kFp8, true}};
  std::printf("%-28s %4s %9s %9s %7s | %9s %7s | %s\n", "shape", "M", "new us", "GB/s", "ratio", "old us", "ratio", "cmp");
  if (!dense) shapes.clear();
  for (const Shape sh : shapes) {
    for (const Fm fm : formats) {
      const Format f = fm.f;
      if (fm.e5 && sh.n != 14336) continue;
      PackedW w[4];
      const int copies = f == Format::kNvfp4 ? 4 : 2;
      for (int c = 0; c < copies; ++c) make_packed(w[c], f, sh.n, sh.k, 200 + c, fm.e5);
      for (int64_t m : ms) {
        if (fm.e5 && m != 4 && m != 16) continue;
        GemmOperandView a;
        a.format = Format::kBf16, a.rows = m, a.cols = sh.k, a.data = act.get();
        DeviceGroupTable t = make_dense_table(m, s);
        const size_t no = size_t(m) * size_t(sh.n);
        out_new.resize(no * 4), out_old.resize(no * 4);
        GemmOutView on, oo;
        on.d_f32 = out_new.as<float>(), oo.d_f32 = out_old.as<float>();
        LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out_new.get(), 0xFF, no * 4, s));
        LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out_old.get(), 0xFF, no * 4, s));
        g_verbose = verbose && (m == 1 || m == 16);
        if (g_verbose) std::printf("%s %lldx%lld M=%lld:", fname(f), (long long)sh.n, (long long)sh.k, (long long)m);
        gemm_detail::launch_decode(a, w[0].view, sh.n, t, {}, on, ws_new, s);
        if (g_verbose) std::printf("\n");
        g_verbose = 0;
        g_verbose = verbose && (m == 1 || m == 16);
        if (g_verbose) std::printf("  old:");
        gemm_old::launch_decode(a, w[0].view, sh.n, t, {}, oo, ws_old, s);
        if (g_verbose) std::printf("\n");
        g_verbose = 0;
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
        auto hn = down(out_new, no), ho = down(out_old, no);
        char cmp[64];
        if (std::memcmp(hn.data(), ho.data(), no * 4) == 0) {
          std::snprintf(cmp, sizeof cmp, "bits");
        } else {
          double maxabs = 0, maxref = 0;
          for (size_t i = 0; i < no; ++i) {
            if (!std::isfinite(hn[i])) { maxabs = 1e30; break; }
            maxabs = std::max(maxabs, std::fabs(double(hn[i]) - ho[i]));
            maxref = std::max(maxref, std::fabs(double(ho[i])));
          }
          const double rel = maxabs / std::max(maxref, 1e-30);
          std::snprintf(cmp, sizeof cmp, "rel %.2e", rel);
          if (rel > 1e-5) ++bad;
        }
        if (m == 16) {
          GemmOperandView a1 = a;
          a1.rows = 1;
          DeviceGroupTable t1 = make_dense_table(1, s);
          out1.resize(size_t(sh.n) * 4);
          GemmOutView o1;
          o1.d_f32 = out1.as<float>();
          gemm_detail::launch_decode(a1, w[0].view, sh.n, t1, {}, o1, ws_new, s);
          LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
          auto h1 = down(out1, size_t(sh.n));
          if (std::memcmp(h1.data(), hn.data(), size_t(sh.n) * 4) != 0) {
            ++bad;
            std::printf("BATCH INVARIANCE FAIL %s %lldx%lld\n", fname(f), (long long)sh.n, (long long)sh.k);
          }
        }
        const double un = median_time_us([&](int i) { gemm_detail::launch_decode(a, w[i % copies].view, sh.n, t, {}, on, ws_new, s); }, iters, s, batch);
        // The same calls with W preload (GemmOperandView::preload): bits and time.
        PackedW* wp = w;
        auto pre_view = [&](int c) { GemmOperandView v = wp[c].view; v.preload = true; return v; };
        LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out_new.get(), 0xFF, no * 4, s));
        gemm_detail::launch_decode(a, pre_view(0), sh.n, t, {}, on, ws_new, s);
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
        const bool pre_same = std::memcmp(down(out_new, no).data(), hn.data(), no * 4) == 0;
        if (!pre_same) ++bad;
        // New and old kernel (both with preload) sampled alternately: drift and run order affect both.
        auto run_new = [&](int i) { gemm_detail::launch_decode(a, pre_view(i % copies), sh.n, t, {}, on, ws_new, s); };
        auto run_old = [&](int i) { gemm_old::launch_decode(a, pre_view(i % copies), sh.n, t, {}, oo, ws_old, s); };
        double upre = 0, uo = 0;
        if (old)
          std::tie(upre, uo) = median_time_pair_us(run_new, run_old, iters, s, batch);
        else
          upre = median_time_us(run_new, iters, s, batch);
        const double gb = w[0].bytes / un * 1e-3;
        char nm[64];
        std::snprintf(nm, sizeof nm, "%s%s %lldx%lld", fname(f), fm.e5 ? "(e5m2)" : "", (long long)sh.n, (long long)sh.k);
        const int nw_auto = g_last_nw;
        std::printf("%-28s %4lld %9.2f %9.0f %7.3f | pre %9.2f %7.3f%s | %9.2f %7.3f | %s nw %d", nm, (long long)m, un, gb, gb / copy_gbps,
                    upre, w[0].bytes / upre * 1e-3 / copy_gbps, pre_same ? "" : " DIFF", uo,
                    uo > 0 ? w[0].bytes / uo * 1e-3 / copy_gbps : 0.0, cmp, nw_auto);
        if (g_timeline && (m == 1 || m == 16)) {
          std::printf("\n");
          timeline(nm, [&](int i) { gemm_detail::launch_decode(a, pre_view(i % copies), sh.n, t, {}, on, ws_new, s); }, s);
        }
        if (sweep && (m == 1 || m == 16)) {
          for (int fnw : {4, 8, 12, 14, 16}) {
            g_force_nw = fnw;
            LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out_new.get(), 0xFF, no * 4, s));
            gemm_detail::launch_decode(a, w[0].view, sh.n, t, {}, on, ws_new, s);
            LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
            auto hf = down(out_new, no);
            const bool same = std::memcmp(hf.data(), hn.data(), no * 4) == 0;
            if (!same) ++bad;
            const double uf = median_time_us([&](int i) { gemm_detail::launch_decode(a, w[i % copies].view, sh.n, t, {}, on, ws_new, s); }, iters, s, batch);
            std::printf(" | nw%d %.2f%s", fnw, uf, same ? "" : " DIFF");
            g_force_nw = 0;
          }
        }
        std::printf("\n");
      }
    }
  }
  if (moe) {
    const int layers = 48, E = 8;
    const int64_t H = 2048, I = 768;
    std::vector<PackedW> fc1(layers), fc2(layers);
    double bytes = 0;
    for (int l = 0; l < layers; ++l) {
      make_packed(fc1[l], Format::kNvfp4, E * 2 * I, H, 1000 + 2 * l);
      make_packed(fc2[l], Format::kNvfp4, E * H, I, 1001 + 2 * l);
      bytes += fc1[l].bytes + fc2[l].bytes;
    }
    std::vector<int64_t> off(E + 1);
    for (int e = 0; e <= E; ++e) off[e] = e;
    DeviceGroupTable t1 = make_group_table(off, 2 * I, {}, s), t2 = make_group_table(off, H, {}, s);
    DeviceBuffer x8, h8, y8, prob, w1, w2;
    fill(x8, size_t(E) * H * 2, 11, 1);
    h8.resize(size_t(E) * I * 2);
    y8.resize(size_t(E) * H * 4);
    std::vector<float> p(E, 0.125f);
    prob.upload(std::span<const float>(p.data(), p.size()));
    GemmOperandView a1, a2;
    a1.format = a2.format = Format::kBf16;
    a1.rows = a2.rows = E, a1.cols = H, a2.cols = I;
    a1.data = x8.get(), a2.data = h8.get();
    DeviceEpilogue ep1;
    ep1.swiglu = true, ep1.out_bf16 = true, ep1.router_prob = prob.as<float>();
    GemmOutView o1, o2;
    o1.d_bf16 = h8.as<uint16_t>();
    o2.d_f32 = y8.as<float>();
    // Variants: W preload (0/1), forced nw of FC1 and FC2 (0: the host's choice); -1: the old kernel.
    struct Var { int pre, nw1, nw2; };
    std::vector<Var> vlist = {{0, 0, 0}, {1, 0, 0}};
    if (old) vlist.push_back({-1, 0, 0});
    for (const char* spec : moe_specs) {  // "P:N1:N2"
      Var v{};
      if (std::sscanf(spec, "%d:%d:%d", &v.pre, &v.nw1, &v.nw2) == 3) vlist.push_back(v);
    }
    vlist.push_back({0, 0, 0});  // repeats: the run-to-run noise
    vlist.push_back({1, 0, 0});
    if (g_timeline) {
      timeline("moe fc1 (swiglu) 8x1536x2048", [&](int i) {
        GemmOperandView v = fc1[i % layers].view;
        v.preload = true;
        gemm_detail::launch_decode(a1, v, 2 * I, t1, ep1, o1, w1, s);
      }, s);
      timeline("moe fc2 8x2048x768", [&](int i) {
        GemmOperandView v = fc2[i % layers].view;
        v.preload = true;
        gemm_detail::launch_decode(a2, v, H, t2, {}, o2, w2, s);
      }, s);
    }
    {  // the read ceiling of the graph: 96 pure-read kernels over the same bytes (FC1, FC2 sizes)
      DeviceBuffer sink(64);
      std::vector<DeviceBuffer> rb(2 * layers);
      std::vector<size_t> rbytes(2 * layers);
      for (int l = 0; l < layers; ++l) {
        rbytes[2 * l] = size_t(fc1[l].bytes), rbytes[2 * l + 1] = size_t(fc2[l].bytes);
        fill(rb[2 * l], rbytes[2 * l], 3000 + 2 * l, 0);
        fill(rb[2 * l + 1], rbytes[2 * l + 1], 3001 + 2 * l, 0);
      }
      for (int mode = 0; mode < 3; ++mode) {  // 0: plain launches; 1: PDL, no wait; 2: PDL + wait
        for (int bps : {1, 2, 4, 8}) {
          const unsigned grid = unsigned(sms * bps);
          auto body = [&] {
            for (int i = 0; i < 2 * layers; ++i) {
              cudaLaunchConfig_t cfg{};
              cfg.gridDim = dim3(grid), cfg.blockDim = dim3(256), cfg.stream = s;
              cudaLaunchAttribute at[1];
              at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
              at[0].val.programmaticStreamSerializationAllowed = 1;
              cfg.attrs = at, cfg.numAttrs = mode > 0 ? 1 : 0;
              auto k = mode == 2 ? read_probe_pdl<4, true> : read_probe_pdl<4, false>;
              LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, rb[i].as<uint8_t>(), rbytes[i], sink.as<uint32_t>()));
            }
          };
          const double us = graph_time_us(body, s);
          std::printf("moe read ceiling (%s, %d blocks/SM): %.1f us, ratio %.3f\n",
                      mode == 0 ? "plain" : mode == 1 ? "pdl, no wait" : "pdl + wait", bps, us, bytes / us * 1e-3 / copy_gbps);
        }
      }
    }
    std::vector<float> y0;
    for (size_t vi = 0; vi < vlist.size(); ++vi) {
      const Var var = vlist[vi];
      int nw1 = 0, nw2 = 0;
      auto body = [&] {
        for (int l = 0; l < layers; ++l) {
          GemmOperandView v1 = fc1[l].view, v2 = fc2[l].view;
          v1.preload = v2.preload = var.pre > 0;
          if (var.pre >= 0) {
            g_force_nw = var.nw1;
            gemm_detail::launch_decode(a1, v1, 2 * I, t1, ep1, o1, w1, s);
            nw1 = g_last_nw;
            g_force_nw = var.nw2;
            gemm_detail::launch_decode(a2, v2, H, t2, {}, o2, w2, s);
            nw2 = g_last_nw;
            g_force_nw = 0;
          } else {
            gemm_old::launch_decode(a1, v1, 2 * I, t1, ep1, o1, w1, s);
            gemm_old::launch_decode(a2, v2, H, t2, {}, o2, w2, s);
          }
        }
      };
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(h8.get(), x8.get(), size_t(E) * I * 2, cudaMemcpyDeviceToDevice, s));
      LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(y8.get(), 0xFF, size_t(E) * H * 4, s));
      g_verbose = verbose && vi == 0;
      body();
      if (g_verbose) std::printf("\n");
      g_verbose = 0;
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<float> y(size_t(E) * H);
      LOCKSTEP_CUDA_CHECK(cudaMemcpy(y.data(), y8.get(), y.size() * 4, cudaMemcpyDeviceToHost));
      if (vi == 0) y0 = y;
      const bool same0 = std::memcmp(y.data(), y0.data(), y.size() * 4) == 0;
      if (!same0) ++bad;
      const double us = graph_time_us(body, s);
      const double gb = bytes / us * 1e-3;
      std::printf("moe %s pre %d 48x8 graph: %.1f us, %.0f GB/s, ratio %.3f (nw fc1 %d fc2 %d)%s\n", var.pre < 0 ? "old" : "new",
                  var.pre > 0, us, gb, gb / copy_gbps, nw1, nw2, same0 ? "" : " DIFFERENT from new auto");
    }
    g_force_nw = 0;
  }
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("%s (%d bad)\n", bad ? "FAILURES" : "all checks passed", bad);
  return bad ? 1 : 0;
}
