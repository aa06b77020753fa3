// `lockstep bench gemm` on CUDA: the decode kernel's bandwidth on packed weights (>= 64 MB shapes,
// rotated past L2) against a device copy and cuBLAS bf16 in the same run, MoE decode (48 layers x
// 8 experts, CUDA graphs) against a per-expert cuBLAS bf16 loop, and the tiled kernel's TFLOP/s
// against cuBLAS bf16 (dense and per-expert loop). cuBLAS is loaded with dlopen, so the library
// does not link it; without it the baselines are reported as missing.

#include <algorithm>
#include <functional>
#include <tuple>

#include "lockstep/tensor/cuda_timing.h"
#include "qgemm_cuda.cuh"

namespace lockstep::cuda {
namespace {

using gemm_detail::cat;
constexpr int kDecodeBatch = 20;  // decode GEMMs timed back to back, as a decode step runs them

// cuBLAS bf16 (the baseline), through the library's dlopen'ed cuBLAS (qgemm_cublas_cuda.cu).
struct Cublas {
  bool ok() const { return gemm_detail::cublas_available(); }
  void gemm_bf16(const void* a, const void* w, void* d, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
    gemm_detail::cublas_gemm_bf16(a, w, d, false, m, n, k, s);
  }
  void gemm_bf16_strided(const void* a, const void* w, void* d, int64_t batch, int64_t m, int64_t n, int64_t k,
                         cudaStream_t s) {
    gemm_detail::cublas_gemm_bf16(a, w, d, false, m, n, k, s, int(batch), m * k, n * k, m * n);
  }
};

// Deterministic non-zero fill (never time on zeros): kind 0 any byte, 1 bf16 in +-[0.5, 1),
// 2 E4M3 block scales near 1, 3 E8M0 near 2^0, 4 E4M3 elements without NaN.
__global__ void fill_kernel(uint8_t* p, size_t n, uint32_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    uint8_t b = uint8_t(h);
    if (kind == 1) b = (i & 1) ? uint8_t(0x3F | (h & 0x80)) : uint8_t(h);
    if (kind == 2) b = uint8_t(0x30 + (h & 0xF));
    if (kind == 3) b = uint8_t(122 + (h % 10));
    if (kind == 4) b = uint8_t(h & 0xF7);
    p[i] = b;
  }
}
void fill(DeviceBuffer& b, size_t bytes, uint32_t seed, int kind) {
  b.resize(bytes);
  fill_kernel<<<1024, 256>>>(b.as<uint8_t>(), bytes, seed, kind);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}


// A packed weight [rows, K] of format f with random codes (no outer scale: 1).
struct PackedW {
  DeviceBuffer data, scale;
  GemmOperandView view;
  double bytes = 0;
};
void make_packed(PackedW& w, Format f, int64_t rows, int64_t k, uint32_t seed) {
  const size_t n = size_t(rows) * size_t(k);
  w.view = GemmOperandView{};
  w.view.format = f, w.view.rows = rows, w.view.cols = k;
  if (f == Format::kNvfp4) {
    fill(w.data, n / 2, seed, 0);
    fill(w.scale, n / 16, seed + 1, 2);
  } else if (f == Format::kMxfp8) {
    fill(w.data, n, seed, 4);
    fill(w.scale, n / 32, seed + 1, 3);
  } else if (f == Format::kFp8) {
    fill(w.data, n, seed, 4);
  } else {
    fill(w.data, n * 2, seed, 1);
  }
  w.view.data = w.data.get();
  w.view.block_scale = w.scale.empty() ? nullptr : w.scale.as<uint8_t>();
  w.bytes = double(w.data.size() + w.scale.size());
}

const char* fmt_name(Format f) {
  switch (f) {
    case Format::kNvfp4: return "nvfp4";
    case Format::kMxfp8: return "mxfp8";
    case Format::kFp8: return "fp8";
    default: return "bf16";
  }
}

struct GraphExec {
  cudaGraphExec_t exec = nullptr;
  ~GraphExec() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};
void capture(GraphExec& g, cudaStream_t s, const std::function<void()>& body) {
  cudaGraph_t graph;
  LOCKSTEP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body();
  LOCKSTEP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  LOCKSTEP_CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
  cudaGraphDestroy(graph);
}

}  // namespace

GemmBenchResult bench_gemm_cuda(const std::string& filter, bool quick, int iters) {
  GemmBenchResult res;
  cudaDeviceProp prop{};
  LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  res.gpu = prop.name;
  Cublas cb;
  res.have_cublas = cb.ok();
  cudaStream_t s;
  LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto want = [&](const std::string& sec, const std::string& name) {
    return filter.empty() || sec.find(filter) != std::string::npos || name.find(filter) != std::string::npos;
  };
  {  // copy bandwidth: 1 GiB device-to-device, (read + write) / time
    DeviceBuffer x, y;
    const size_t bytes = size_t(1) << 30;
    fill(x, bytes, 1, 0);
    y.resize(bytes);
    const double us = median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), bytes, cudaMemcpyDeviceToDevice, s)); }, iters, s);
    res.copy_gbps = 2.0 * double(bytes) / us * 1e-3;
  }
  DeviceBuffer ws, out, act;
  fill(act, size_t(16) * 16384 * 2, 7, 1);  // bf16 activations, up to [16, 16384]

  // ---- decode: dense, M = 1..16, packed weights rotated past L2 ------------------------------
  struct Shape {
    int64_t n, k;
  };
  std::vector<Shape> shapes = {{14336, 4096}, {4096, 14336}, {8192, 8192}};
  std::vector<int64_t> ms = {1, 2, 4, 8, 16};
  if (quick) shapes = {{14336, 4096}}, ms = {1, 16};
  const Format formats[] = {Format::kNvfp4, Format::kMxfp8, Format::kFp8};
  for (const Shape sh : shapes) {
    bool any = false;  // skip the shape's allocations when --only filters every row out
    for (Format f : formats)
      for (int64_t m : ms)
        any = any || want("decode", cat(fmt_name(f), " w", f == Format::kNvfp4 ? "4" : "8", "a16 ", sh.n, "x", sh.k, " M=", m));
    if (!any) continue;
    PackedW bf[2];
    if (cb.ok())
      for (int c = 0; c < 2; ++c) make_packed(bf[c], Format::kBf16, sh.n, sh.k, 100 + c);
    for (Format f : formats) {
      const std::string fname = fmt_name(f);
      PackedW w[4];
      const int copies = f == Format::kNvfp4 ? 4 : 2;  // >= 2 x 50 MB L2 in rotation
      for (int c = 0; c < copies; ++c) {
        make_packed(w[c], f, sh.n, sh.k, 200 + c);
        w[c].view.preload = true;  // weights: not written between the calls (GemmOperandView::preload)
      }
      for (int64_t m : ms) {
        const std::string name = cat(fname, " w", f == Format::kNvfp4 ? "4" : "8", "a16 ", sh.n, "x", sh.k, " M=", m);
        if (!want("decode", name)) continue;
        GemmOperandView a;
        a.format = Format::kBf16, a.rows = m, a.cols = sh.k, a.data = act.get();
        DeviceGroupTable t = make_dense_table(m, s);
        out.resize(size_t(m) * size_t(sh.n) * 4);
        GemmOutView ov;
        ov.d_f32 = out.as<float>();
        GemmBenchRow r;
        r.section = "decode";
        r.name = name;
        r.us = median_time_us([&](int i) { qgemm_device(a, w[i % copies].view, sh.n, t, {}, ov, ws, QgemmKernel::kDecode, s); },
                       iters, s, kDecodeBatch);
        r.bytes = w[0].bytes;
        r.gbps = r.bytes / r.us * 1e-3;
        r.ratio_copy = r.gbps / res.copy_gbps;
        r.tflops = 2.0 * double(m) * double(sh.n) * double(sh.k) / r.us * 1e-6;
        r.target = 0.8;
        r.target_is_copy = true;
        if (cb.ok()) {
          r.baseline_us = median_time_us([&](int i) { cb.gemm_bf16(act.get(), bf[i % 2].data.get(), out.get(), m, sh.n, sh.k, s); },
                                  iters, s, kDecodeBatch);
          r.ratio_baseline = r.baseline_us / r.us;
        }
        res.rows.push_back(r);
      }
    }
  }

  // ---- MoE decode: 1 token, 48 layers x 8 active experts (Qwen3-30B-A3B), NVFP4 --------------
  if (want("moe-decode", "moe nvfp4 48 layers x 8 experts")) {
    const int layers = quick ? 4 : 48, E = 8;
    const int64_t H = 2048, I = 768;
    std::vector<PackedW> fc1(static_cast<size_t>(layers)), fc2(static_cast<size_t>(layers));
    double bytes = 0;
    for (int l = 0; l < layers; ++l) {
      make_packed(fc1[size_t(l)], Format::kNvfp4, E * 2 * I, H, 1000 + 2 * l);
      make_packed(fc2[size_t(l)], Format::kNvfp4, E * H, I, 1001 + 2 * l);
      // Weights are not written during the step: the kernels may load them before the previous
      // kernel completes (GemmOperandView::preload).
      fc1[size_t(l)].view.preload = fc2[size_t(l)].view.preload = true;
      bytes += fc1[size_t(l)].bytes + fc2[size_t(l)].bytes;
    }
    std::vector<int64_t> off(E + 1);
    for (int e = 0; e <= E; ++e) off[size_t(e)] = e;
    DeviceGroupTable t1 = make_group_table(off, 2 * I, {}, s), t2 = make_group_table(off, H, {}, s);
    DeviceBuffer x8, h8, y8, prob, ws1, ws2;
    fill(x8, size_t(E) * H * 2, 11, 1);  // the token, once per expert (the permute step's output)
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
    auto body = [&] {
      for (int l = 0; l < layers; ++l) {
        qgemm_device(a1, fc1[size_t(l)].view, 2 * I, t1, ep1, o1, ws1, QgemmKernel::kDecode, s);
        qgemm_device(a2, fc2[size_t(l)].view, H, t2, {}, o2, ws2, QgemmKernel::kDecode, s);
      }
    };
    body();  // sizes the workspaces outside the capture
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
    GraphExec g;
    capture(g, s, body);
    GemmBenchRow r;
    r.section = "moe-decode";
    r.name = cat("moe nvfp4 ", layers, " layers x 8 experts (FC1 1536x2048 + SwiGLU, FC2 2048x768), graph");
    r.us = median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(g.exec, s)); }, iters, s);
    r.bytes = bytes;
    r.gbps = bytes / r.us * 1e-3;
    r.ratio_copy = r.gbps / res.copy_gbps;
    r.tflops = 2.0 * layers * E * (2 * I * H + H * I) / r.us * 1e-6;
    r.target = 0.7;
    r.target_is_copy = true;
    if (cb.ok()) {  // bf16 per-expert loop (no SwiGLU), one graph
      std::vector<DeviceBuffer> b1(static_cast<size_t>(layers)), b2(static_cast<size_t>(layers));
      for (int l = 0; l < layers; ++l) {
        fill(b1[size_t(l)], size_t(E) * 2 * I * H * 2, 3000 + l, 1);
        fill(b2[size_t(l)], size_t(E) * H * I * 2, 4000 + l, 1);
      }
      DeviceBuffer o(size_t(E) * H * 2);
      auto base = [&] {
        for (int l = 0; l < layers; ++l)
          for (int e = 0; e < E; ++e) {
            cb.gemm_bf16(static_cast<const uint8_t*>(x8.get()) + e * H * 2, b1[size_t(l)].as<uint8_t>() + size_t(e) * 2 * I * H * 2,
                         o.get(), 1, 2 * I, H, s);
            cb.gemm_bf16(h8.get(), b2[size_t(l)].as<uint8_t>() + size_t(e) * H * I * 2, o.get(), 1, H, I, s);
          }
      };
      base();
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
      GraphExec gb;
      capture(gb, s, base);
      r.baseline_us = median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(gb.exec, s)); }, iters, s);
      r.ratio_baseline = r.baseline_us / r.us;
    }
    res.rows.push_back(r);
  }

  // ---- large M: dense and grouped; the tiled deterministic kernel and the cuBLAS fast path vs
  // cuBLAS bf16 (dense: one call; grouped: the faster of a per-expert loop in a graph and one
  // strided batched call) ------------------------------------------------------------------------
  auto large = [&](const std::string& sec, const std::string& label, Format f, int64_t groups, int64_t rows,
                   int64_t n, int64_t k) {
    // The fast path (QgemmKernel::kFast) names the kernel it picks for the call.
    const QgemmKernel fast_kernel = qgemm_fast_kernel(f, groups, rows, k);
    const char* fast_kind = fast_kernel == QgemmKernel::kCublas  ? "cuBLAS"
                            : fast_kernel == QgemmKernel::kWgmma ? "wgmma"
                                                                 : "tiled";
    const std::string det_name = label + " (deterministic tiled)", wg_name = label + " (deterministic wgmma)",
                      fast_name = label + " (fast: " + fast_kind + ")";
    const bool want_det = want(sec, det_name), want_fast = cb.ok() && want(sec, fast_name),
               want_wg = qgemm_wgmma_available(k) && want(sec, wg_name);
    if (!want_det && !want_fast && !want_wg) return;
    const int64_t M = groups * rows;
    PackedW a, w;
    make_packed(a, f, M, k, 500);
    make_packed(w, f, groups * n, k, 501);
    std::vector<int64_t> off(size_t(groups + 1));
    for (int64_t e = 0; e <= groups; ++e) off[size_t(e)] = e * rows;
    DeviceGroupTable t = make_group_table(off, n, {}, s);
    out.resize(size_t(M) * size_t(n) * 2);
    GemmOutView ov;
    ov.d_bf16 = out.as<uint16_t>();
    DeviceEpilogue ep;
    ep.out_bf16 = true;
    const int it = std::max(3, iters / 4);
    // Dense: kLargeBatch back-to-back calls per sample (GPU time per call in a stream of calls, as
    // in training; the host's launch work overlaps the previous call), for every row and the baseline.
    constexpr int kLargeBatch = 3;
    const int batch = groups == 1 ? kLargeBatch : 1;
    // The baseline: cuBLAS bf16 (dense: one call; grouped: the faster of a per-expert loop in a
    // graph and one strided batched call), timed alternately with each row (median_time_pair_us).
    std::function<void(int)> base;
    PackedW ab, wb;
    GraphExec gb;
    if (cb.ok()) {
      make_packed(ab, Format::kBf16, M, k, 600);
      make_packed(wb, Format::kBf16, groups * n, k, 601);
      auto loop = [&] {
        for (int64_t e = 0; e < groups; ++e)
          cb.gemm_bf16(ab.data.as<uint8_t>() + size_t(e * rows * k * 2), wb.data.as<uint8_t>() + size_t(e * n * k * 2),
                       out.as<uint8_t>() + size_t(e * rows * n * 2), rows, n, k, s);
      };
      if (groups == 1) {
        base = [loop](int) { loop(); };
      } else {
        loop();
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
        capture(gb, s, loop);
        auto graph = [&gb, this_s = s](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(gb.exec, this_s)); };
        auto strided = [&, this_s = s](int) {
          cb.gemm_bf16_strided(ab.data.get(), wb.data.get(), out.get(), groups, rows, n, k, this_s);
        };
        const auto [tg, ts] = median_time_pair_us(graph, strided, it, s);
        base = tg <= ts ? std::function<void(int)>(graph) : std::function<void(int)>(strided);
      }
    }
    auto row = [&](const std::string& name, QgemmKernel kernel, double target) {
      GemmBenchRow r;
      r.section = sec;
      r.name = name;
      auto call = [&] { qgemm_device(a.view, w.view, n, t, ep, ov, ws, kernel, s); };
      std::function<void(int)> timed = [&](int) { call(); };
      GraphExec g;
      if (groups > 1) {  // in a graph, as the baseline's per-expert loop (the fast path loops when groups differ)
        call();
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
        capture(g, s, call);
        timed = [&](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(g.exec, s)); };
      }
      double base_us = 0;
      if (base)
        std::tie(base_us, r.us) = median_time_pair_us(base, timed, it, s, batch);
      else
        r.us = median_time_us(timed, it, s, batch);
      r.bytes = a.bytes + w.bytes;
      r.gbps = r.bytes / r.us * 1e-3;
      r.tflops = 2.0 * double(M) * double(n) * double(k) / r.us * 1e-6;
      r.target = target;
      r.baseline_us = base_us;
      r.ratio_baseline = base_us > 0 ? base_us / r.us : 0;
      res.rows.push_back(r);
    };
    if (want_det) row(det_name, QgemmKernel::kTiled, 0.75);
    if (want_wg) row(wg_name, QgemmKernel::kWgmma, 0.75);
    if (want_fast) row(fast_name, QgemmKernel::kFast, 0.9);
  };
  const std::vector<int64_t> dense = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 8192};
  for (int64_t d : dense)
    for (Format f : {Format::kNvfp4, Format::kMxfp8, Format::kFp8, Format::kBf16})
      large("dense", cat(fmt_name(f), " x ", fmt_name(f), " ", d, "^3"), f, 1, d, d, d);
  const std::vector<int64_t> per = quick ? std::vector<int64_t>{128} : std::vector<int64_t>{128, 512, 1024};
  for (int64_t rows : per) {
    large("grouped", cat("nvfp4 FC1 128 experts x ", rows, " rows, K=2048 N=1536"), Format::kNvfp4, 128, rows, 1536, 2048);
    large("grouped", cat("nvfp4 FC2 128 experts x ", rows, " rows, K=768 N=2048"), Format::kNvfp4, 128, rows, 2048, 768);
  }
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
  return res;
}

}  // namespace lockstep::cuda
