// Microbenchmark of the decode GEMM (src/gemm/qgemm_decode_cuda.cu, included) against the previous
// kernel (namespace gemm_old): bench shapes x M x formats and the MoE decode graph (48 layers x 8
// experts, FC1 + SwiGLU, FC2), timed with events around 20 back-to-back launches, weights rotated
// past L2; GB/s of packed bytes and the ratio to a 1 GiB D2D copy measured in the same run. Checks:
// new vs old (max |diff| / max |old|; the slice sums re-associate), batch invariance (row 0 alone
// == row 0 of M = 16, bit for bit), poisoned outputs; load-pattern probes first (weights only).
// Build (repository root; gpu-bin-d/ is ignored):
//   git show 56bbc6c:src/gemm/qgemm_decode_cuda.cu | sed 's|"qgemm_cuda.cuh"|"gemm/qgemm_cuda.cuh"|' \
//     > gpu-bin-d/old_decode.cu
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --fmad=false -prec-div=true -ftz=false \
//     --expt-relaxed-constexpr -Iinclude -Isrc -Xcompiler -fopenmp dev/micro_decode.cu \
//     -o gpu-bin-d/micro_decode /work/devlib/liblockstep.a -lgomp -Xcompiler "-static-libstdc++ -static-libgcc"
// Run: gpu-bin-d/micro_decode [quick|one] [nomoe]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>
#include <array>
#include <cstdlib>

#include "../src/gemm/qgemm_decode_cuda.cu"

namespace lockstep::cuda::gemm_old {
using namespace lockstep::cuda::gemm_detail;
}
#define gemm_detail gemm_old
#include "../gpu-bin-d/old_decode.cu"
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
    if (kind == 4) b = uint8_t(h & 0xF7);                                 // E4M3, no NaN
    p[i] = b;
  }
}
void fill(DeviceBuffer& b, size_t bytes, uint32_t seed, int kind) {
  b.resize(bytes);
  fill_k<<<1024, 256>>>(b.as<uint8_t>(), bytes, seed, kind);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}
double time_us(const std::function<void(int)>& fn, int samples, cudaStream_t s, int batch) {
  for (int i = 0; i < 3; ++i) fn(i);
  cudaEvent_t e0, e1;
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e0));
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  int call = 0;
  for (int i = 0; i < samples; ++i) {
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int b = 0; b < batch; ++b) fn(call++);
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(e1, s));
    LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(double(ms) * 1e3 / batch);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
struct PackedW {
  DeviceBuffer data, scale;
  GemmOperandView view;
  double bytes = 0;
};
void make_packed(PackedW& w, GemmFormat f, int64_t rows, int64_t k, uint32_t seed) {
  const size_t n = size_t(rows) * size_t(k);
  w.view = GemmOperandView{};
  w.view.format = f, w.view.rows = rows, w.view.cols = k;
  if (f == GemmFormat::kNvfp4) {
    fill(w.data, n / 2, seed, 0);
    fill(w.scale, n / 16, seed + 1, 2);
  } else if (f == GemmFormat::kMxfp8) {
    fill(w.data, n, seed, 4);
    fill(w.scale, n / 32, seed + 1, 3);
  } else {
    fill(w.data, n, seed, 4);
  }
  w.view.data = w.data.get();
  w.view.block_scale = w.scale.empty() ? nullptr : w.scale.as<uint8_t>();
  w.bytes = double(w.data.size() + w.scale.size());
}
const char* fname(GemmFormat f) { return f == GemmFormat::kNvfp4 ? "nvfp4" : f == GemmFormat::kMxfp8 ? "mxfp8" : "fp8"; }

std::vector<float> down(const DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
  return h;
}


// Probe: the decode kernel's weight loads alone (same grid, rows, 16-byte pattern, ring), no
// decode, no mma; mode 1: each warp reads its 16 rows' slice contiguously (512 B per row-load).
template <int kRing, int kMode>
__global__ void __launch_bounds__(256, 2) stream_probe(const uint8_t* wd, int64_t n, int64_t K, int sb, uint32_t* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t k0 = int64_t(blockIdx.y) * sb * 128;
  const int nblk = int((K - k0) / 128 < sb ? (K - k0) / 128 : sb);
  const int64_t j0 = int64_t(blockIdx.x) * 128 + warp * 16 + g;
  const uint8_t* p0 = wd + j0 * (K / 2) + (k0 + 32 * t) / 2;
  const uint8_t* p1 = p0 + 8 * (K / 2);
  if (kMode == 1) {  // lane reads 16 B chunks of one row: row (warp*16 + i), chunk lane
    p0 = wd + (int64_t(blockIdx.x) * 128 + warp * 16) * (K / 2) + k0 / 2 + 16 * lane;
  }
  uint32_t x = 0;
  for (int b0 = 0; b0 < nblk; b0 += kRing) {
    uint4 v0[kRing], v1[kRing];
#pragma unroll
    for (int u = 0; u < kRing; ++u) {
      const int b = b0 + u;
      if (b < nblk) {
        if (kMode == 0) {
          v0[u] = gemm_detail::ldg_stream16(p0 + b * 64);
          v1[u] = gemm_detail::ldg_stream16(p1 + b * 64);
        } else {  // 16 rows x (nblk*64) bytes: item i = b*2 + {0,1} -> row (i*32*16 / rowbytes)
          const int rowbytes = nblk * 64;
          const int i0 = (b * 2) * 512 + lane * 16, i1 = i0 + 512;
          v0[u] = gemm_detail::ldg_stream16(wd + (int64_t(blockIdx.x) * 128 + warp * 16 + i0 / rowbytes) * (K / 2) + k0 / 2 + i0 % rowbytes);
          v1[u] = gemm_detail::ldg_stream16(wd + (int64_t(blockIdx.x) * 128 + warp * 16 + i1 / rowbytes) * (K / 2) + k0 / 2 + i1 % rowbytes);
        }
      } else {
        v0[u] = v1[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kRing; ++u) x ^= v0[u].x ^ v0[u].y ^ v0[u].z ^ v0[u].w ^ v1[u].x ^ v1[u].y ^ v1[u].z ^ v1[u].w;
  }
  if (x == 0x12345678u) sink[0] = x;
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  const bool one = argc > 1 && std::strcmp(argv[1], "one") == 0;  // nvfp4 14336x4096 M=1 only (profiling)
  const bool moe = !(argc > 2 && std::strcmp(argv[2], "nomoe") == 0) && !one;
  const int iters = 15, batch = 20;
  cudaStream_t s;
  LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  double copy_gbps = 0;
  {
    DeviceBuffer x, y;
    const size_t bytes = size_t(1) << 30;
    fill(x, bytes, 1, 0);
    y.resize(bytes);
    const double us = time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), bytes, cudaMemcpyDeviceToDevice, s)); }, iters, s, 1);
    copy_gbps = 2.0 * double(bytes) / us * 1e-3;
  }
  std::printf("copy %.0f GB/s\n", copy_gbps);
  {  // load-pattern probes on nvfp4 shapes
    DeviceBuffer sink(64);
    for (auto [pn, pk] : {std::pair<int64_t, int64_t>{14336, 4096}, {8192, 8192}, {4096, 14336}}) {
      PackedW pw[4];
      for (int c = 0; c < 4; ++c) make_packed(pw[c], GemmFormat::kNvfp4, pn, pk, 300 + c);
      const int sb = gemm_detail::decode_slice_blocks(pk);
      const dim3 grid(unsigned(pn / 128), unsigned((pk / 128 + sb - 1) / sb));
      auto run = [&](auto kern, const char* nm) {
        const double us = time_us([&](int i) { kern<<<grid, 256, 0, s>>>(pw[i % 4].data.as<uint8_t>(), pn, pk, sb, sink.as<uint32_t>()); }, iters, s, batch);
        std::printf("probe %-22s %lldx%lld: %.2f us, ratio %.3f (data only)\n", nm, (long long)pn, (long long)pk, us,
                    double(pn) * pk / 2 / us * 1e-3 / copy_gbps);
      };
      run(stream_probe<4, 0>, "ring4 pattern0");
      run(stream_probe<8, 0>, "ring8 pattern0");
      run(stream_probe<4, 1>, "ring4 contiguous");
    }
  }
  DeviceBuffer act, ws_old, ws_new, out_new, out_old, out1;
  fill(act, size_t(16) * 16384 * 2, 7, 1);
  int bad = 0;
  struct Shape { int64_t n, k; };
  std::vector<Shape> shapes = {{14336, 4096}, {4096, 14336}, {8192, 8192}};
  std::vector<int64_t> ms = {1, 2, 4, 8, 16};
  if (quick) ms = {1, 16};
  if (one) ms = {1}, shapes = {{14336, 4096}};
  const GemmFormat formats[] = {GemmFormat::kNvfp4, GemmFormat::kMxfp8, GemmFormat::kFp8};
  std::printf("%-28s %4s %9s %9s %7s | %9s %7s | %9s\n", "shape", "M", "new us", "GB/s", "ratio", "old us", "ratio", "maxrel");
  for (const Shape sh : shapes) {
    for (GemmFormat f : formats) {
      if (one && f != GemmFormat::kNvfp4) continue;
      PackedW w[4];
      const int copies = f == GemmFormat::kNvfp4 ? 4 : 2;
      for (int c = 0; c < copies; ++c) make_packed(w[c], f, sh.n, sh.k, 200 + c);
      for (int64_t m : ms) {
        GemmOperandView a;
        a.format = GemmFormat::kBf16, a.rows = m, a.cols = sh.k, a.data = act.get();
        DeviceGroupTable t = make_dense_table(m, s);
        const size_t no = size_t(m) * size_t(sh.n);
        out_new.resize(no * 4), out_old.resize(no * 4);
        GemmOutView on, oo;
        on.d_f32 = out_new.as<float>(), oo.d_f32 = out_old.as<float>();
        // correctness first (poisoned outputs)
        LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out_new.get(), 0xFF, no * 4, s));
        LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out_old.get(), 0xFF, no * 4, s));
        gemm_detail::launch_decode(a, w[0].view, sh.n, t, {}, on, ws_new, s);
        gemm_old::launch_decode(a, w[0].view, sh.n, t, {}, oo, ws_old, s);
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
        auto hn = down(out_new, no), ho = down(out_old, no);
        double maxrel = 0, maxabs = 0, maxref = 0;  // max |new - old| / max |old|
        for (size_t i = 0; i < no; ++i) {
          if (!std::isfinite(hn[i])) { maxabs = 1e30; break; }
          maxabs = std::max(maxabs, std::fabs(double(hn[i]) - ho[i]));
          maxref = std::max(maxref, std::fabs(double(ho[i])));
        }
        maxrel = maxabs / std::max(maxref, 1e-30);
        if (maxrel > 1e-5) ++bad;
        if (m == 16) {  // batch invariance: row 0 alone
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
        const double un = time_us([&](int i) { gemm_detail::launch_decode(a, w[i % copies].view, sh.n, t, {}, on, ws_new, s); }, iters, s, batch);
        const double uo = quick ? 0 : time_us([&](int i) { gemm_old::launch_decode(a, w[i % copies].view, sh.n, t, {}, oo, ws_old, s); }, iters, s, batch);
        const double gb = w[0].bytes / un * 1e-3;
        char nm[64];
        std::snprintf(nm, sizeof nm, "%s %lldx%lld", fname(f), (long long)sh.n, (long long)sh.k);
        std::printf("%-28s %4lld %9.2f %9.0f %7.3f | %9.2f %7.3f | %9.2e\n", nm, (long long)m, un, gb, gb / copy_gbps, uo,
                    uo > 0 ? w[0].bytes / uo * 1e-3 / copy_gbps : 0.0, maxrel);
      }
    }
  }
  if (moe) {  // MoE decode graph
    const int layers = 48, E = 8;
    const int64_t H = 2048, I = 768;
    std::vector<PackedW> fc1(layers), fc2(layers);
    double bytes = 0;
    for (int l = 0; l < layers; ++l) {
      make_packed(fc1[l], GemmFormat::kNvfp4, E * 2 * I, H, 1000 + 2 * l);
      make_packed(fc2[l], GemmFormat::kNvfp4, E * H, I, 1001 + 2 * l);
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
    a1.format = a2.format = GemmFormat::kBf16;
    a1.rows = a2.rows = E, a1.cols = H, a2.cols = I;
    a1.data = x8.get(), a2.data = h8.get();
    DeviceEpilogue ep1;
    ep1.swiglu = true, ep1.out_bf16 = true, ep1.router_prob = prob.as<float>();
    GemmOutView o1, o2;
    o1.d_bf16 = h8.as<uint16_t>();
    o2.d_f32 = y8.as<float>();
    for (int variant = 0; variant < 2; ++variant) {
      auto body = [&] {
        for (int l = 0; l < layers; ++l) {
          if (variant == 0) {
            gemm_detail::launch_decode(a1, fc1[l].view, 2 * I, t1, ep1, o1, w1, s);
            gemm_detail::launch_decode(a2, fc2[l].view, H, t2, {}, o2, w2, s);
          } else {
            gemm_old::launch_decode(a1, fc1[l].view, 2 * I, t1, ep1, o1, w1, s);
            gemm_old::launch_decode(a2, fc2[l].view, H, t2, {}, o2, w2, s);
          }
        }
      };
      body();
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<float> y(size_t(E) * H);
      LOCKSTEP_CUDA_CHECK(cudaMemcpy(y.data(), y8.get(), y.size() * 4, cudaMemcpyDeviceToHost));
      double sum = 0;
      for (float v : y) sum += std::fabs(double(v));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      LOCKSTEP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      body();
      LOCKSTEP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      LOCKSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const double us = time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, iters, s, 1);
      LOCKSTEP_CUDA_CHECK(cudaMemcpy(y.data(), y8.get(), y.size() * 4, cudaMemcpyDeviceToHost));
      double sum2 = 0;
      for (float v : y) sum2 += std::fabs(double(v));
      const double gb = bytes / us * 1e-3;
      std::printf("moe %s 48x8 graph: %.1f us, %.0f GB/s, ratio %.3f (|y| %.6e, after graph %.6e)\n",
                  variant == 0 ? "new" : "old", us, gb, gb / copy_gbps, sum, sum2);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("%s (%d bad)\n", bad ? "FAILURES" : "all checks passed", bad);
  return bad ? 1 : 0;
}
