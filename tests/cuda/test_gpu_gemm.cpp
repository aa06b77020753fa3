// lockstep_test_gpu --op gemm: the CUDA GEMMs through qgemm against the CPU path and the float64
// oracle (docs/gemm.md): bit-exact on format-grid inputs (F32 and BF16 outputs), the analytic bound
// on random inputs, batch invariance (row alone / batch / permuted batch, a second run), the
// refusals, and the kernel policy. Every case runs on every applicable kernel, or on --kernel.
#include "test_gpu_gemm.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <tuple>

#include "gemm/qgemm_cuda_types.h"

namespace lockstep::gpu_test {

using gemm_test::bf16_kind;
using gemm_test::make;
using gemm_test::q_kind;
using gemm_test::random_values;

namespace {

struct GemmShape {
  int64_t M, N, K;
};
std::string shape_name(const GemmShape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
}

GemmConfig forced(GemmVariant k, DType out = DType::kF32) {
  GemmConfig c;
  force_variant(c, k);
  c.out_dtype = out;
  return c;
}

void grid_exact() {
  std::vector<GemmShape> shapes = {{1, 136, 256},   {3, 256, 384},  {16, 200, 256}, {37, 137, 256},
                                   {130, 260, 128}, {5, 128, 4224}, {300, 136, 256}};
  if (g_opt.reduced) shapes = {{3, 256, 384}, {130, 260, 128}, {300, 136, 256}};
  for (const GemmShape& s : shapes)
    for (const Pairing& p : pairings()) {
      const std::string base = "gemm grid " + p.a.label + " x " + p.w.label + " " + shape_name(s);
      const uint64_t seed = case_seed(base);
      const Held a = make(p.a, grid_values_narrow(p.a, s.M, s.K, seed, 3), s.M, s.K);
      const Held w = make(p.w, grid_values_narrow(p.w, s.N, s.K, seed + 1, 5), s.N, s.K);
      const std::vector<GemmVariant> ks = kernels_for(chunked(p.a) || chunked(p.w), s.M, s.K);
      if (ks.empty()) skip(base, "no applicable kernel");
      if (ks.empty() || !any_order_exact(a.op(), w.op())) continue;
      const GemmResult cpu = qgemm(a.op(), w.op()),
                       cpu16 = qgemm(a.op(), w.op(), forced(GemmVariant::kAuto, DType::kBF16));
      const DevHeld da = dev(a), dw = dev(w);
      for (GemmVariant k : ks) {
        const std::string name = base + " " + kernel_label(k);
        run_case(name, [&] {
          std::string err;
          const GemmResult g = gpu_qgemm(da.op(), dw.op(), forced(k));
          if (!kernel_matches(k, ran(g))) err += " ran " + kernel_label(ran(g));
          if (!same_bits(g.d, cpu.d, name)) err += " f32 out differs from the cpu";
          // bf16 output (the cuBLAS path lets cuBLAS round when D = acc: bf16 / mxfp8 operands)
          const GemmResult g16 = gpu_qgemm(da.op(), dw.op(), forced(k, DType::kBF16));
          err += compare_t(cpu16.d, g16.d, false, "bf16 out");
          return err;
        });
      }
    }
}

void random_bound() {
  std::vector<GemmShape> shapes = {{1, 136, 512},  {9, 200, 4352},  {16, 64, 2048},
                                   {70, 150, 512}, {200, 300, 512}, {260, 150, 512}};
  if (g_opt.reduced) shapes = {{9, 136, 512}, {70, 150, 512}, {260, 150, 512}};
  for (const GemmShape& s : shapes)
    for (const Pairing& p : pairings()) {
      const std::string base = "gemm random " + p.a.label + " x " + p.w.label + " " + shape_name(s);
      const uint64_t seed = case_seed(base);
      const Held a = make(p.a, random_values(s.M * s.K, seed, 2.0f), s.M, s.K);
      const Held w = make(p.w, random_values(s.N * s.K, seed + 1, 0.05f), s.N, s.K);
      const std::vector<GemmVariant> ks = kernels_for(chunked(p.a) || chunked(p.w), s.M, s.K);
      if (ks.empty()) skip(base, "no applicable kernel");
      if (ks.empty()) continue;
      const GemmF64 ref = qgemm_f64(a.op(), w.op());
      const DevHeld da = dev(a), dw = dev(w);
      for (GemmVariant k : ks) {
        const std::string name = base + " " + kernel_label(k);
        run_case(name, [&] {
          std::string err;
          err = within_bound(gpu_qgemm(da.op(), dw.op(), forced(k)).d, ref);
          return err;
        });
      }
    }
}

// Row i's bits: row alone, full batch, permuted batch; and a second run gives the same bytes.
void batch_invariance() {
  const std::vector<Pairing> all = pairings();
  std::vector<Pairing> ps = {all[0], all[4], all[5], all[6], all[7], all[9]};
  if (g_opt.reduced) ps = {all[0], all[9]};
  const std::vector<std::tuple<int64_t, GemmVariant, int64_t>> cases = {
      {16, GemmVariant::kDecode, 2304},      {13, GemmVariant::kDecode, 2304},
      {16, GemmVariant::kDecode, 8192},      {150, GemmVariant::kTiled, 2304},
      {150, GemmVariant::kWgmma, 2304},      {300, GemmVariant::kWgmma, 2304},
      {13, GemmVariant::kWgmma, 2304},       {40, GemmVariant::kWgmmaSmallM, 2304},
      {13, GemmVariant::kWgmmaSmallM, 4096}, {13, GemmVariant::kWgmmaSmallMWide, 2304}};
  for (const Pairing& p : ps)
    for (const auto& [M, kernel0, K] : cases) {
      GemmVariant kernel = kernel0;
      const int64_t N = 136;
      const bool ch = chunked(p.a) || chunked(p.w);
      if (g_opt.kernel != GemmVariant::kAuto) kernel = g_opt.kernel;
      const std::string name = "gemm batch-invariance " + p.a.label + " x " + p.w.label +
                               " M=" + std::to_string(M) + " K=" + std::to_string(K) + " " +
                               kernel_label(kernel);
      if (!selected(name)) continue;
      // (a row alone has 1 row: every kernel taking M takes it too)
      if (!applicable(kernel, ch, M, K, true)) {
        skip(name, "kernel does not take the case");
        continue;
      }
      const uint64_t seed = case_seed(name);
      const std::vector<float> xa = random_values(M * K, seed, 1.5f),
                               xw = random_values(N * K, seed + 1, 0.1f);
      const Held w = make(p.w, xw, N, K), a = make(p.a, xa, M, K);
      const DevHeld dw = dev(w), da = dev(a);
      std::string err;
      try {
        const GemmResult full = gpu_qgemm(da.op(), dw.op(), forced(kernel));
        const GemmResult again = gpu_qgemm(da.op(), dw.op(), forced(kernel));
        if (!same_bits(full.d, again.d, name + " repeat")) err += " second run differs";
        std::vector<int64_t> perm(static_cast<size_t>(M));
        std::iota(perm.begin(), perm.end(), 0);
        std::mt19937_64 g(seed);
        std::shuffle(perm.begin(), perm.end(), g);
        std::vector<float> xp(xa.size());
        for (int64_t i = 0; i < M; ++i)
          std::copy_n(xa.begin() + perm[size_t(i)] * K, K, xp.begin() + i * K);
        const DevHeld dp = dev(make(p.a, xp, M, K));
        const GemmResult permuted = gpu_qgemm(dp.op(), dw.op(), forced(kernel));
        const std::vector<float> f = to_f32(full.d), pm = to_f32(permuted.d);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j)
            if (num::f32_bits(pm[size_t(i * N + j)]) !=
                num::f32_bits(f[size_t(perm[size_t(i)] * N + j)])) {
              err += " permuted row " + std::to_string(i) + " differs";
              i = M;
              break;
            }
        for (int64_t i : {int64_t(0), M / 2, M - 1}) {
          const std::vector<float> row(xa.begin() + i * K, xa.begin() + (i + 1) * K);
          const DevHeld dr = dev(make(p.a, row, 1, K));
          const std::vector<float> alone = to_f32(gpu_qgemm(dr.op(), dw.op(), forced(kernel)).d);
          for (int64_t j = 0; j < N; ++j)
            if (num::f32_bits(alone[size_t(j)]) != num::f32_bits(f[size_t(i * N + j)])) {
              err += " row " + std::to_string(i) + " alone differs";
              break;
            }
        }
      } catch (const std::exception& e) {
        err += std::string(" threw: ") + e.what();
      }
      report(name, err);
    }
}

void refusals() {
  if (g_opt.kernel != GemmVariant::kAuto) return;  // (a policy check, not a per-kernel case)
  // fp8 block scaling runs on the tiled kernel (the automatic choice); the others refuse by name.
  const Held a = make(bf16_kind(), random_values(4 * 256, 1, 1.0f), 4, 256);
  const Held w =
      make(q_kind(Format::kFp8, Scaling::kBlock1x128), random_values(8 * 256, 2, 1.0f), 8, 256);
  const DevHeld da = dev(a), dw = dev(w);
  {
    const std::string name = "gemm refusal: fp8 block scaling picks the tiled kernel";
    if (selected(name)) {
      const GemmResult aut = gpu_qgemm(da.op(), dw.op(), {});
      const GemmResult tiled = gpu_qgemm(da.op(), dw.op(), forced(GemmVariant::kTiled));
      report(name, (ran(aut) == GemmVariant::kTiled ? "" : " ran " + kernel_label(ran(aut))) +
                       std::string(same_bits(aut.d, tiled.d, name) ? "" : " bits differ"));
    }
  }
  for (GemmVariant k : {GemmVariant::kDecode, GemmVariant::kWgmma, GemmVariant::kCublas}) {
    const std::string name = "gemm refusal: fp8 block scaling refused by " + kernel_label(k);
    if (!selected(name)) continue;
    if (k == GemmVariant::kWgmma && !cuda::wgmma_available(256)) continue;
    if (k == GemmVariant::kCublas && !cuda::cublas_available()) continue;
    bool threw = false;
    try {
      gpu_qgemm(da.op(), dw.op(), forced(k));
    } catch (const GemmError& e) {
      threw = std::string(e.what()).find("fp8 block scaling") != std::string::npos;
    }
    report(name, threw ? "" : " no GemmError naming fp8 block scaling");
  }
  // The decode kernel's shared memory bounds K (nvfp4 W with 9-16 rows: K <= 48128): beyond, the
  // automatic choice takes another kernel and a forced decode is refused naming the limit. The
  // batch-invariant order never takes it (its chain differs from the kernel large M runs).
  auto pick = [](int64_t rows, int64_t K, GemmOrder order = GemmOrder::kFast) {
    cuda::GemmOperandView av, wv;
    av.format = Format::kBf16, av.rows = rows, av.cols = K;
    wv.format = Format::kNvfp4, wv.rows = 8, wv.cols = K;
    cuda::DeviceGroupTable t;
    t.groups = 1, t.max_rows = rows, t.total_rows = rows;
    return cuda::choose_kernel(GemmVariant::kAuto, order, av, wv, t);
  };
  const std::string route = "gemm refusal: decode route by K, rows and order";
  if (selected(route))
    report(
        route,
        std::string(pick(12, 48128) == GemmVariant::kDecode ? "" : " 12 rows K=48128 not decode") +
            (pick(12, 49152) != GemmVariant::kDecode ? "" : " 12 rows K=49152 decode") +
            (pick(4, 49152) == GemmVariant::kDecode ? "" : " 4 rows K=49152 not decode") +
            (pick(4, 2048, GemmOrder::kBatchInvariant) != GemmVariant::kDecode
                 ? ""
                 : " 4 rows K=2048 batch-invariant decode"));
  const std::string big = "gemm refusal: decode refuses K=49152 with 12 rows naming shared memory";
  if (selected(big)) {
    const int64_t M = 12, K = 49152;
    const DevHeld a2 = dev(make(bf16_kind(), random_values(M * K, 3, 1.0f), M, K));
    const DevHeld w2 =
        dev(make(q_kind(Format::kNvfp4, Scaling::kPerRow), random_values(8 * K, 4, 0.05f), 8, K));
    bool threw = false;
    try {
      gpu_qgemm(a2.op(), w2.op(), forced(GemmVariant::kDecode));
    } catch (const GemmError& e) {
      threw = std::string(e.what()).find("shared memory") != std::string::npos;
    }
    const GemmResult aut = gpu_qgemm(a2.op(), w2.op(), {});
    const GemmResult picked = gpu_qgemm(a2.op(), w2.op(), forced(pick(M, K)));
    report(big,
           std::string(threw ? "" : " no GemmError naming shared memory") +
               (same_bits(aut.d, picked.d, big) ? "" : " auto differs from the picked kernel"));
  }
  // Dense F32 operands run on the CPU only.
  const std::string f32 = "gemm refusal: f32 dense operands on cuda";
  if (selected(f32)) {
    const Tensor af = to_gpu(gemm_test::f32_tensor(random_values(4 * 64, 5), 4, 64));
    bool threw = false;
    try {
      gpu_qgemm(af, af, {});
    } catch (const GemmError& e) {
      threw = std::string(e.what()).find("BF16") != std::string::npos;
    }
    report(f32, threw ? "" : " no GemmError naming BF16");
  }
}

// The fast order's routing, and kFast giving the bits of the kernel it names.
void fast_path() {
  if (g_opt.kernel != GemmVariant::kAuto) return;
  const std::string name = "gemm fast path routing";
  if (!selected(name)) return;
  const bool wg = cuda::wgmma_available(2048), cb = cuda::cublas_available();
  // host: the group table from host offsets (else built on the device: no cuBLAS).
  auto route = [](Format wf, int groups, int64_t max_rows, int64_t k, bool host = true) {
    cuda::GemmOperandView av, wv;
    av.format = Format::kBf16, av.cols = k;
    wv.format = wf, wv.cols = k;
    cuda::DeviceGroupTable t;
    t.groups = groups, t.max_rows = max_rows, t.total_rows = max_rows * groups;
    if (host) t.host.resize(size_t(groups));
    return cuda::choose_kernel(GemmVariant::kAuto, GemmOrder::kFast, av, wv, t);
  };
  const GemmVariant dense_mx = cb   ? GemmVariant::kCublas
                               : wg ? GemmVariant::kWgmma
                                    : GemmVariant::kTiled;
  const GemmVariant packed = wg   ? GemmVariant::kWgmma
                             : cb ? GemmVariant::kCublas
                                  : GemmVariant::kTiled;
  std::string err;
  auto expect = [&](GemmVariant got, GemmVariant want_k, const char* what) {
    if (got != want_k) err += std::string(" ") + what + ": " + kernel_label(got);
  };
  expect(route(Format::kNvfp4, 8, 1, 2048), GemmVariant::kDecode, "1 row per expert");
  expect(route(Format::kNvfp4, 128, 512, 2048), packed, "grouped nvfp4");
  expect(route(Format::kMxfp8, 128, 512, 2048), packed, "grouped mxfp8");
  expect(route(Format::kNvfp4, 1, 4096, 2048), packed, "dense nvfp4");
  expect(route(Format::kFp8, 1, 4096, 2048), packed, "dense fp8");
  expect(route(Format::kMxfp8, 1, 4096, 2048), dense_mx, "dense mxfp8");
  expect(route(Format::kBf16, 1, 4, 2048), dense_mx, "bf16 W 4 rows");
  expect(route(Format::kBf16, 128, 512, 2048), dense_mx, "grouped bf16 W");
  expect(route(Format::kBf16, 8, 1, 2048, false), GemmVariant::kDecode,
         "bf16 W, 1 row per expert, device offsets");
  expect(route(Format::kBf16, 8, 17, 2048, false), wg ? GemmVariant::kWgmma : GemmVariant::kTiled,
         "bf16 W, 17 rows, device offsets");
  expect(route(Format::kNvfp4, 4, 100, 96), cb ? GemmVariant::kCublas : GemmVariant::kTiled,
         "K = 96");
  // kFast gives the bits of the kernel it names (grouped nvfp4, random inputs).
  const int64_t E = 3, N = 128, K = 256;
  const std::vector<int64_t> off = {0, 40, 40, 170};
  const Tensor offs = Tensor::from_vector<int64_t>(off, {4}, DType::kI64);
  const DevHeld a = dev(make(bf16_kind(), random_values(off.back() * K, 7, 1.0f), off.back(), K));
  const DevHeld w = dev(
      make(q_kind(Format::kNvfp4, Scaling::kPerRow), random_values(E * N * K, 8, 0.05f), E * N, K));
  GemmConfig fast;
  fast.order = GemmOrder::kFast;
  const GemmResult f = gpu_grouped(a.op(), offs, w.op(), fast);
  const GemmResult ref = gpu_grouped(a.op(), offs, w.op(), forced(ran(f)));
  if (!same_bits(f.d, ref.d, name)) err += " kFast differs from " + kernel_label(ran(f));
  report(name, err);
}

}  // namespace

void test_gemm() {
  if (!want("gemm")) return;
  grid_exact();
  random_bound();
  batch_invariance();
  refusals();
  fast_path();
}

}  // namespace lockstep::gpu_test
