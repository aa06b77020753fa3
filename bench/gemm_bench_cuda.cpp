// `lockstep bench gemm` on CUDA: the decode kernel's bandwidth on packed weights (>= 64 MB shapes,
// rotated past L2) against a device copy and cuBLAS bf16 in the same run, MoE decode (48 layers x
// 8 experts, CUDA graphs) against a per-expert cuBLAS bf16 loop, and the large-M kernels' TFLOP/s
// against cuBLAS bf16 (dense and per-expert loop). Calls the kernels through qgemm_device (the
// library's launch entry) on raw operand views. cuBLAS is loaded with dlopen by the library;
// without it the baselines are reported as missing.
#if defined(LOCKSTEP_HAVE_CUDA)
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <tuple>

#include "bench_fill.h"
#include "cuda_timing.h"
#include "gemm/qgemm_cuda_types.h"
#include "gemm_bench.h"

namespace lockstep::bench {
namespace {

using cuda::DeviceEpilogue;
using cuda::DeviceGroupTable;
using cuda::GemmOperandView;
using cuda::GemmOutView;
constexpr int kDecodeBatch = 20;  // decode GEMMs timed back to back, as a decode step runs them
const Device kDev = Device::cuda();

// cuBLAS bf16 (the baseline), through the library's dlopen'ed cuBLAS.
struct Cublas {
  bool ok() const { return cuda::cublas_available(); }
  void gemm_bf16(const void* a, const void* w, void* d, int64_t m, int64_t n, int64_t k,
                 cudaStream_t s) {
    cuda::cublas_gemm_bf16(a, w, d, false, m, n, k, s);
  }
  void gemm_bf16_strided(const void* a, const void* w, void* d, int64_t batch, int64_t m, int64_t n,
                         int64_t k, cudaStream_t s) {
    cuda::cublas_gemm_bf16(a, w, d, false, m, n, k, s, int(batch), m * k, n * k, m * n);
  }
};

// A device buffer of `bytes` filled by fill_bytes_kind.
Tensor filled(size_t bytes, uint32_t seed, int kind) {
  Tensor t = Tensor::empty(DType::kU8, {int64_t(bytes)}, kDev);
  fill_bytes_kind(t.raw(), bytes, seed, kind);
  return t;
}

// One GEMM call through the library's launch entry (scratch from the pool, freed after the call;
// inside a graph capture its allocation and free are captured too).
void call_qgemm(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                const DeviceGroupTable& t, const DeviceEpilogue& ep, GemmOutView out,
                GemmVariant kernel, GemmOrder order, cudaStream_t s) {
  cuda::Scratch scratch(kDev, Stream{s});
  cuda::qgemm_device(a, w, n, t, ep, out, scratch, kernel, order, s);
}

DeviceGroupTable group_table(const std::vector<int64_t>& off, int64_t n, cudaStream_t s) {
  return cuda::make_group_table(off, n, {}, kDev, Stream{s});
}

// A packed weight [rows, K] of format f with random codes (no outer scale: 1).
struct PackedW {
  Tensor data, scale;
  GemmOperandView view;
  double bytes = 0;
};
void make_packed(PackedW& w, Format f, int64_t rows, int64_t k, uint32_t seed) {
  const size_t n = size_t(rows) * size_t(k);
  w.view = GemmOperandView{};
  w.view.format = f, w.view.rows = rows, w.view.cols = k;
  w.scale = Tensor();
  if (f == Format::kNvfp4) {
    w.data = filled(n / 2, seed, 0);
    w.scale = filled(n / 16, seed + 1, 2);
  } else if (f == Format::kMxfp8) {
    w.data = filled(n, seed, 4);
    w.scale = filled(n / 32, seed + 1, 3);
  } else if (f == Format::kFp8) {
    w.data = filled(n, seed, 4);
  } else {
    w.data = filled(n * 2, seed, 1);
  }
  w.view.data = w.data.raw();
  w.view.block_scale = w.scale.defined() ? w.scale.ptr<uint8_t>() : nullptr;
  w.bytes = double(w.data.nbytes() + (w.scale.defined() ? w.scale.nbytes() : 0));
}

const char* fmt_name(Format f) {
  switch (f) {
    case Format::kNvfp4:
      return "nvfp4";
    case Format::kMxfp8:
      return "mxfp8";
    case Format::kFp8:
      return "fp8";
    default:
      return "bf16";
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

// The decode rows: dense, M = 1..16, packed weights rotated past L2.
void decode_rows(GemmBenchResult& res, const Tensor& act, Cublas& cb, cudaStream_t s, bool quick,
                 int iters,
                 const std::function<bool(const std::string&, const std::string&)>& want) {
  struct Shape {
    int64_t n, k;
  };
  std::vector<Shape> shapes = {{14336, 4096}, {4096, 14336}, {8192, 8192}};
  std::vector<int64_t> ms = {1, 2, 4, 8, 16};
  if (quick) shapes = {{14336, 4096}}, ms = {1, 16};
  const Format formats[] = {Format::kNvfp4, Format::kMxfp8, Format::kFp8};
  auto name_of = [](Format f, const Shape& sh, int64_t m) {
    return fmt::format("{} w{}a16 {}x{} M={}", fmt_name(f), f == Format::kNvfp4 ? "4" : "8", sh.n,
                       sh.k, m);
  };
  Tensor out;
  for (const Shape sh : shapes) {
    bool any = false;  // skip the shape's allocations when --only filters every row out
    for (Format f : formats)
      for (int64_t m : ms) any = any || want("decode", name_of(f, sh, m));
    if (!any) continue;
    PackedW bf[2];
    if (cb.ok())
      for (int c = 0; c < 2; ++c) make_packed(bf[c], Format::kBf16, sh.n, sh.k, 100 + c);
    for (Format f : formats) {
      PackedW w[4];
      const int copies = f == Format::kNvfp4 ? 4 : 2;  // >= 2 x 50 MB L2 in rotation
      for (int c = 0; c < copies; ++c) {
        make_packed(w[c], f, sh.n, sh.k, 200 + c);
        w[c].view.preload =
            true;  // weights: not written between the calls (GemmOperandView::preload)
      }
      for (int64_t m : ms) {
        const std::string name = name_of(f, sh, m);
        if (!want("decode", name)) continue;
        GemmOperandView a;
        a.format = Format::kBf16, a.rows = m, a.cols = sh.k, a.data = act.raw();
        const DeviceGroupTable t = group_table({0, m}, 0, s);
        out = Tensor::empty(DType::kF32, {m, sh.n}, kDev);
        GemmOutView ov;
        ov.d_f32 = out.ptr<float>();
        GemmBenchRow r;
        r.section = "decode";
        r.name = name;
        r.us = median_time_us(
            [&](int i) {
              call_qgemm(a, w[i % copies].view, sh.n, t, {}, ov, GemmVariant::kDecode,
                         GemmOrder::kBatchInvariant, s);
            },
            iters, s, kDecodeBatch);
        r.bytes = w[0].bytes;
        r.gbps = r.bytes / r.us * 1e-3;
        r.ratio_copy = r.gbps / res.copy_gbps;
        r.tflops = 2.0 * double(m) * double(sh.n) * double(sh.k) / r.us * 1e-6;
        r.target = 0.8;
        r.target_is_copy = true;
        if (cb.ok()) {
          r.baseline_us = median_time_us(
              [&](int i) {
                cb.gemm_bf16(act.raw(), bf[i % 2].data.raw(), out.raw(), m, sh.n, sh.k, s);
              },
              iters, s, kDecodeBatch);
          r.ratio_baseline = r.baseline_us / r.us;
        }
        res.rows.push_back(r);
      }
    }
  }
}

// MoE decode: 1 token, 48 layers x 8 active experts (Qwen3-30B-A3B), NVFP4, one CUDA graph.
void moe_decode_row(GemmBenchResult& res, Cublas& cb, cudaStream_t s, bool quick, int iters) {
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
  const DeviceGroupTable t1 = group_table(off, 2 * I, s), t2 = group_table(off, H, s);
  const Tensor x8 =
      filled(size_t(E) * H * 2, 11, 1);  // the token, once per expert (the permute output)
  Tensor h8 = Tensor::empty(DType::kBF16, {E, I}, kDev),
         y8 = Tensor::empty(DType::kF32, {E, H}, kDev);
  const Tensor prob =
      Tensor::from_vector<float>(std::vector<float>(E, 0.125f), {E}, DType::kF32).to(kDev);
  GemmOperandView a1, a2;
  a1.format = a2.format = Format::kBf16;
  a1.rows = a2.rows = E, a1.cols = H, a2.cols = I;
  a1.data = x8.raw(), a2.data = h8.raw();
  DeviceEpilogue ep1;
  ep1.swiglu = true, ep1.out_bf16 = true, ep1.router_prob = prob.ptr<float>();
  GemmOutView o1, o2;
  o1.d_bf16 = h8.ptr<uint16_t>();
  o2.d_f32 = y8.ptr<float>();
  auto body = [&] {
    for (int l = 0; l < layers; ++l) {
      call_qgemm(a1, fc1[size_t(l)].view, 2 * I, t1, ep1, o1, GemmVariant::kDecode,
                 GemmOrder::kBatchInvariant, s);
      call_qgemm(a2, fc2[size_t(l)].view, H, t2, {}, o2, GemmVariant::kDecode,
                 GemmOrder::kBatchInvariant, s);
    }
  };
  body();
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  GraphExec g;
  capture(g, s, body);
  GemmBenchRow r;
  r.section = "moe-decode";
  r.name = fmt::format(
      "moe nvfp4 {} layers x 8 experts (FC1 1536x2048 + SwiGLU, FC2 2048x768), graph", layers);
  r.us = median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(g.exec, s)); }, iters, s);
  r.bytes = bytes;
  r.gbps = bytes / r.us * 1e-3;
  r.ratio_copy = r.gbps / res.copy_gbps;
  r.tflops = 2.0 * layers * E * (2 * I * H + H * I) / r.us * 1e-6;
  r.target = 0.7;
  r.target_is_copy = true;
  if (cb.ok()) {  // bf16 per-expert loop (no SwiGLU), one graph
    std::vector<Tensor> b1, b2;
    for (int l = 0; l < layers; ++l) {
      b1.push_back(filled(size_t(E) * 2 * I * H * 2, 3000 + l, 1));
      b2.push_back(filled(size_t(E) * H * I * 2, 4000 + l, 1));
    }
    Tensor o = Tensor::empty(DType::kBF16, {E, H}, kDev);
    auto base = [&] {
      for (int l = 0; l < layers; ++l)
        for (int e = 0; e < E; ++e) {
          cb.gemm_bf16(x8.ptr<uint8_t>() + e * H * 2,
                       b1[size_t(l)].ptr<uint8_t>() + size_t(e) * 2 * I * H * 2, o.raw(), 1, 2 * I,
                       H, s);
          cb.gemm_bf16(h8.raw(), b2[size_t(l)].ptr<uint8_t>() + size_t(e) * H * I * 2, o.raw(), 1,
                       H, I, s);
        }
    };
    base();
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
    GraphExec gb;
    capture(gb, s, base);
    r.baseline_us =
        median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(gb.exec, s)); }, iters, s);
    r.ratio_baseline = r.baseline_us / r.us;
  }
  res.rows.push_back(r);
}

// Small M: the small-M wgmma kernel (64 x 32 tiles) against the 128 x 128 in-loop wgmma kernel
// (the batch-invariant choice for these shapes without it) and the decode kernel (fast order), at
// M = 1 and 16 on the decode shapes of a small MoE (hidden 512) and a larger model, dense and
// grouped over 32 experts with one active, and on Qwen3-30B-A3B's query/key/value projection and
// vocabulary head (bf16 W, as the recipes keep it). Three rows per case: the small-M time with the
// in-loop time as its baseline, again with the decode time, and the 64 x 128 tiles' time with the
// 64 x 32 tiles' as its baseline (ratio > 1: the first kernel is faster). Calls back to back
// (kDecodeBatch per sample), two W copies in rotation.
void small_m_rows(GemmBenchResult& res, const Tensor& act, cudaStream_t s, bool quick, int iters,
                  const std::function<bool(const std::string&, const std::string&)>& want) {
  struct Case {
    int64_t n, k, experts;
    std::vector<Format> formats;
  };
  const std::vector<Format> packed = {Format::kNvfp4, Format::kFp8};
  std::vector<Case> cases = {{1536, 512, 1, packed},           {768, 512, 32, packed},
                             {4096, 2048, 1, packed},          {2048, 4096, 1, packed},
                             {5120, 2048, 1, {Format::kBf16}}, {151936, 2048, 1, {Format::kBf16}}};
  if (quick) cases.resize(2);
  if (!cuda::wgmma_available(64)) return;
  for (const Case& c : cases)
    for (Format f : c.formats)
      for (int64_t m : {int64_t(1), int64_t(16)}) {
        const std::string label =
            fmt::format("{} w{}a16 {}x{}{} M={}", fmt_name(f),
                        f == Format::kNvfp4  ? "4"
                        : f == Format::kBf16 ? "16"
                                             : "8",
                        c.n, c.k, c.experts > 1 ? " grouped 32 experts, 1 active" : "", m);
        const std::string vs_inloop = label + " small_m vs cuda_wgmma_inloop",
                          vs_decode = label + " small_m vs cuda_decode",
                          wide_vs = label + " small_m_wide vs small_m";
        if (!want("small-m", vs_inloop) && !want("small-m", vs_decode) && !want("small-m", wide_vs))
          continue;
        PackedW w[2];
        for (int i = 0; i < 2; ++i) make_packed(w[i], f, c.experts * c.n, c.k, 700 + i);
        std::vector<int64_t> off(size_t(c.experts + 1), 0);
        for (int64_t e = 0; e < c.experts; ++e)  // the active expert: the middle one
          off[size_t(e + 1)] = off[size_t(e)] + (e == c.experts / 2 ? m : 0);
        const DeviceGroupTable t = group_table(off, c.n, s);
        GemmOperandView a;
        a.format = Format::kBf16, a.rows = m, a.cols = c.k, a.data = act.raw();
        Tensor out = Tensor::empty(DType::kF32, {m, c.n}, kDev);
        GemmOutView ov;
        ov.d_f32 = out.ptr<float>();
        auto time = [&](GemmVariant v, GemmOrder order) {
          return median_time_us(
              [&](int i) { call_qgemm(a, w[i % 2].view, c.n, t, {}, ov, v, order, s); }, iters, s,
              kDecodeBatch);
        };
        const double small = time(GemmVariant::kWgmmaSmallM, GemmOrder::kBatchInvariant);
        const double wide = time(GemmVariant::kWgmmaSmallMWide, GemmOrder::kBatchInvariant);
        const double inloop = time(GemmVariant::kWgmmaInloop, GemmOrder::kBatchInvariant);
        const double decode =
            f == Format::kBf16 ? 0.0 : time(GemmVariant::kDecode, GemmOrder::kFast);
        for (const auto& [name, us, base] :
             {std::tuple{vs_inloop, small, inloop}, std::tuple{vs_decode, small, decode},
              std::tuple{wide_vs, wide, small}}) {
          if (base == 0.0) continue;  // the decode kernel takes no bf16 W
          GemmBenchRow r;
          r.section = "small-m";
          r.name = name;
          r.us = us;
          r.bytes = w[0].bytes / double(c.experts);  // the active expert's weights
          r.gbps = r.bytes / r.us * 1e-3;
          r.ratio_copy = r.gbps / res.copy_gbps;
          r.tflops = 2.0 * double(m) * double(c.n) * double(c.k) / r.us * 1e-6;
          r.baseline_us = base;
          r.ratio_baseline = base / us;
          res.rows.push_back(r);
        }
      }
}

// Copy bandwidth: 1 GiB device-to-device, (read + write) / time.
double copy_gbps(cudaStream_t s, int iters) {
  const size_t bytes = size_t(1) << 30;
  const Tensor x = filled(bytes, 1, 0);
  Tensor y = Tensor::empty(DType::kU8, {int64_t(bytes)}, kDev);
  const double us = median_time_us(
      [&](int) {
        LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(y.raw(), x.raw(), bytes, cudaMemcpyDeviceToDevice, s));
      },
      iters, s);
  return 2.0 * double(bytes) / us * 1e-3;
}

}  // namespace

DeviceRates measure_device_rates(int iters) {
  DeviceRates r;
  cudaStream_t s;
  LOCKSTEP_CUDA_CHECK(cudaStreamCreate(&s));
  r.copy_gbps = copy_gbps(s, iters);
  Cublas cb;
  if (cb.ok()) {
    constexpr int64_t n = 8192;
    const Tensor a = filled(size_t(n * n * 2), 3, 1), w = filled(size_t(n * n * 2), 4, 1);
    Tensor d = Tensor::empty(DType::kBF16, {n, n}, kDev);
    const double us =
        median_time_us([&](int) { cb.gemm_bf16(a.raw(), w.raw(), d.raw(), n, n, n, s); }, iters, s);
    r.bf16_tflops = 2.0 * double(n) * double(n) * double(n) / us * 1e-6;
  }
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
  return r;
}

GemmBenchResult bench_gemm_cuda(const std::string& filter, bool quick, int iters) {
  GemmBenchResult res;
  cudaDeviceProp prop{};
  LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  res.gpu = prop.name;
  Cublas cb;
  res.have_cublas = cb.ok();
  cudaStream_t s;
  // A blocking stream: the inputs filled and freed on the legacy stream are ordered with it.
  LOCKSTEP_CUDA_CHECK(cudaStreamCreate(&s));
  auto want = [&](const std::string& sec, const std::string& name) {
    return filter.empty() || sec.find(filter) != std::string::npos ||
           name.find(filter) != std::string::npos;
  };
  res.copy_gbps = copy_gbps(s, iters);
  const Tensor act = filled(size_t(16) * 16384 * 2, 7, 1);  // bf16 activations, up to [16, 16384]
  decode_rows(res, act, cb, s, quick, iters, want);
  if (want("moe-decode", "moe nvfp4 48 layers x 8 experts"))
    moe_decode_row(res, cb, s, quick, iters);
  small_m_rows(res, act, s, quick, iters, want);

  // ---- large M: dense and grouped; the deterministic kernels and the fast path vs cuBLAS bf16
  // (dense: one call; grouped: the faster of a per-expert loop in a graph and one strided batched
  // call) ---------------------------------------------------------------------------------------
  // device_offsets: the table is built on the device from device offsets and bounded only by
  // the total rows, as the learner's MoE layers call the grouped GEMM (no host synchronisation).
  auto large = [&](const std::string& sec, const std::string& label, Format f, int64_t groups,
                   int64_t rows, int64_t n, int64_t k, bool device_offsets = false) {
    const int64_t M = groups * rows;
    std::vector<int64_t> off(size_t(groups + 1));
    for (int64_t e = 0; e <= groups; ++e) off[size_t(e)] = e * rows;
    GemmOperandView probe_a, probe_w;
    probe_a.format = probe_w.format = f, probe_a.rows = M, probe_w.rows = groups * n,
    probe_a.cols = probe_w.cols = k;
    Tensor d_off;
    if (device_offsets)
      d_off =
          Tensor::from_vector(std::span<const int64_t>(off), {groups + 1}, DType::kI64).to(kDev);
    const DeviceGroupTable t =
        device_offsets ? cuda::make_group_table_device(d_off.ptr<int64_t>(), int(groups), nullptr,
                                                       n, M, M, kDev, Stream{s})
                       : group_table(off, n, s);
    // The fast path names the kernel it picks for the call.
    const GemmVariant fast_kernel =
        cuda::choose_kernel(GemmVariant::kAuto, GemmOrder::kFast, probe_a, probe_w, t);
    const std::string det_name = label + " (deterministic tiled)",
                      wg_name = label + " (deterministic wgmma)",
                      fast_name =
                          fmt::format("{} (fast: {})", label, gemm_variant_name(fast_kernel));
    const bool want_det = !device_offsets && want(sec, det_name),
               want_fast = cb.ok() && want(sec, fast_name),
               want_wg = cuda::wgmma_available(k) && want(sec, wg_name);
    if (!want_det && !want_fast && !want_wg) return;
    PackedW a, w;
    make_packed(a, f, M, k, 500);
    make_packed(w, f, groups * n, k, 501);
    Tensor out = Tensor::empty(DType::kBF16, {M, n}, kDev);
    GemmOutView ov;
    ov.d_bf16 = out.ptr<uint16_t>();
    DeviceEpilogue ep;
    ep.out_bf16 = true;
    const int it = std::max(3, iters / 4);
    // Dense: kLargeBatch back-to-back calls per sample (GPU time per call in a stream of calls, as
    // in training; the host's launch work overlaps the previous call), for every row and the
    // baseline.
    constexpr int kLargeBatch = 3;
    const int batch = groups == 1 ? kLargeBatch : 1;
    // The baseline: cuBLAS bf16, timed alternately with each row (median_time_pair_us).
    std::function<void(int)> base;
    PackedW ab, wb;
    GraphExec gb;
    if (cb.ok()) {
      make_packed(ab, Format::kBf16, M, k, 600);
      make_packed(wb, Format::kBf16, groups * n, k, 601);
      auto loop = [&] {
        for (int64_t e = 0; e < groups; ++e)
          cb.gemm_bf16(ab.data.ptr<uint8_t>() + size_t(e * rows * k * 2),
                       wb.data.ptr<uint8_t>() + size_t(e * n * k * 2),
                       out.ptr<uint16_t>() + size_t(e * rows * n), rows, n, k, s);
      };
      if (groups == 1) {
        base = [loop](int) { loop(); };
      } else {
        loop();
        LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
        capture(gb, s, loop);
        auto graph = [&gb, this_s = s](int) {
          LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(gb.exec, this_s));
        };
        auto strided = [&, this_s = s](int) {
          cb.gemm_bf16_strided(ab.data.raw(), wb.data.raw(), out.raw(), groups, rows, n, k, this_s);
        };
        const auto [tg, ts] = median_time_pair_us(graph, strided, it, s);
        base = tg <= ts ? std::function<void(int)>(graph) : std::function<void(int)>(strided);
      }
    }
    auto row = [&](const std::string& name, GemmVariant kernel, GemmOrder order, double target) {
      GemmBenchRow r;
      r.section = sec;
      r.name = name;
      auto call = [&] { call_qgemm(a.view, w.view, n, t, ep, ov, kernel, order, s); };
      std::function<void(int)> timed = [&](int) { call(); };
      GraphExec g;
      if (groups > 1) {  // in a graph, as the baseline's per-expert loop
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
    if (want_det) row(det_name, GemmVariant::kTiled, GemmOrder::kBatchInvariant, 0.75);
    if (want_wg) row(wg_name, GemmVariant::kWgmma, GemmOrder::kBatchInvariant, 0.75);
    if (want_fast) row(fast_name, GemmVariant::kAuto, GemmOrder::kFast, 0.9);
  };
  const std::vector<int64_t> dense =
      quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 8192};
  for (int64_t d : dense)
    for (Format f : {Format::kNvfp4, Format::kMxfp8, Format::kFp8, Format::kBf16})
      large("dense", fmt::format("{} x {} {}^3", fmt_name(f), fmt_name(f), d), f, 1, d, d, d);
  const std::vector<int64_t> per =
      quick ? std::vector<int64_t>{128} : std::vector<int64_t>{128, 512, 1024};
  for (int64_t rows : per) {
    large("grouped", fmt::format("nvfp4 FC1 128 experts x {} rows, K=2048 N=1536", rows),
          Format::kNvfp4, 128, rows, 1536, 2048);
    large("grouped", fmt::format("nvfp4 FC2 128 experts x {} rows, K=768 N=2048", rows),
          Format::kNvfp4, 128, rows, 2048, 768);
  }
  if (!quick)
    large("grouped", "nvfp4 FC1 128 experts x 1024 rows, K=2048 N=1536, device offsets",
          Format::kNvfp4, 128, 1024, 1536, 2048, true);
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
  return res;
}

}  // namespace lockstep::bench
#endif  // LOCKSTEP_HAVE_CUDA
