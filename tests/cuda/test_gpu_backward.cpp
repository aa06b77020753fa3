// lockstep_test_gpu --op backward / chain: the backward layouts on CUDA against the CPU (dX = dY W
// as qgemm(dY rowwise, W colwise), dW = dY^T X as qgemm(dY colwise, X colwise), their grouped
// forms: W colwise per expert and groups along K), and the device-resident chain quantize -> qgemm
// -> quantize with no device-to-host copy in between. Same bits where every partial sum is exact
// in any order (small-integer inputs), within the analytic bound otherwise.
#include <algorithm>
#include <random>

#include "test_gpu_gemm.h"

namespace lockstep::gpu_test {

using gemm_test::random_values;

namespace {

struct Recipe {
  std::string name;
  QuantConfig act, wgt;  // activations / gradients, weights (both copies)
  bool dense = false;    // bf16 operands (no quantization)
  int64_t row_multiple;  // token rows per group (blocks down the columns)
};

std::vector<Recipe> recipes() {
  auto q = [](Format f, Scaling s) {
    QuantConfig c;
    c.format = f, c.scaling = s, c.rowwise = true, c.colwise = true;
    return c;
  };
  std::vector<Recipe> r;
  r.push_back({"nvfp4 per_tensor", q(Format::kNvfp4, Scaling::kPerTensor),
               q(Format::kNvfp4, Scaling::kPerTensor), false, 16});
  r.push_back({"nvfp4 per_row", q(Format::kNvfp4, Scaling::kPerRow),
               q(Format::kNvfp4, Scaling::kPerRow), false, 16});
  QuantConfig w2d = q(Format::kNvfp4, Scaling::kPerTensor);
  w2d.block2d = true;
  r.push_back({"nvfp4 W 2-D", q(Format::kNvfp4, Scaling::kPerRow), w2d, false, 16});
  QuantConfig had = q(Format::kNvfp4, Scaling::kPerTensor);
  had.hadamard = true;
  r.push_back({"nvfp4 hadamard", had, q(Format::kNvfp4, Scaling::kPerTensor), false, 16});
  QuantConfig b1 = q(Format::kFp8, Scaling::kBlock1x128),
              b2 = q(Format::kFp8, Scaling::kBlock128x128);
  b1.pow2 = b2.pow2 = true;
  r.push_back({"fp8 1x128 x 128x128", b1, b2, false, 128});
  r.push_back({"fp8 per_tensor", q(Format::kFp8, Scaling::kPerTensor),
               q(Format::kFp8, Scaling::kPerTensor), false, 16});
  r.push_back({"fp8 per_row", q(Format::kFp8, Scaling::kPerRow), q(Format::kFp8, Scaling::kPerRow),
               false, 16});
  r.push_back({"mxfp8", q(Format::kMxfp8, Scaling::kBlock1x32),
               q(Format::kMxfp8, Scaling::kBlock1x32), false, 32});
  r.push_back({"bf16", {}, {}, true, 16});
  return r;
}

std::vector<float> small_ints(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = float(int(g() % 13) - 6);
  return v;
}

// An operand on both devices: the CPU quantizes the host tensor, CUDA the device tensor.
struct Both {
  QTensor qc, qg;
  Tensor tc, tg;
  bool dense = false;
  GemmArg cpu() const { return dense ? GemmArg(tc) : GemmArg(qc); }
  GemmArg gpu_arg() const { return dense ? GemmArg(tg) : GemmArg(qg); }
};
Both both(const std::vector<float>& v, int64_t rows, int64_t cols, const QuantConfig& cfg,
          bool dense, std::span<const int64_t> offsets = {}) {
  Both b;
  b.dense = dense;
  b.tc = from_f32(v, {rows, cols}, DType::kBF16);
  b.tg = to_gpu(b.tc);
  if (!dense) {
    b.qc = quantize_grouped(b.tc, offsets, cfg, "x");
    b.qg = quantize_grouped(b.tg, offsets, cfg, "x");
  }
  return b;
}

bool chunked_cfg(const Recipe& r, const QuantConfig& c) {
  return !r.dense && c.format == Format::kFp8 &&
         (c.scaling == Scaling::kBlock1x128 || c.scaling == Scaling::kBlock128x128);
}

// CUDA result vs the CPU result on the same operands: bits when the premise holds, else the bound.
std::string compare_gemm(const GemmArg& ac, const GemmArg& wc, const GemmResult& cpu,
                         const GemmResult& gpu, Copy ca, Copy cw) {
  if (any_order_exact(ac, wc, ca, cw))
    return same_bits(cpu.d, gpu.d, "bits") ? "" : " bits differ (exact premise)";
  return within_bound(gpu.d, qgemm_f64(ac, wc, ca, cw));
}

void dense_backward() {
  const int64_t M = 256, K = 192, N = 128;  // tokens, in, out
  for (const Recipe& r : recipes())
    for (bool ints : {true, false}) {
      const std::string base = "backward " + r.name + (ints ? " ints" : " random");
      const uint64_t seed = case_seed(base);
      auto vals = [&](int64_t n, uint64_t s, float scale) {
        return ints ? small_ints(n, s) : random_values(n, s, scale);
      };
      std::string qerr;
      Both x, w, dy;
      try {
        x = both(vals(M * K, seed, 1.0f), M, K, r.act, r.dense);
        w = both(vals(N * K, seed + 1, 0.05f), N, K, r.wgt, r.dense);
        dy = both(vals(M * N, seed + 2, 0.5f), M, N, r.act, r.dense);
        if (!r.dense)
          qerr = compare_q(x.qc, x.qg.to(Device::cpu())) + compare_q(w.qc, w.qg.to(Device::cpu())) +
                 compare_q(dy.qc, dy.qg.to(Device::cpu()));
      } catch (const std::exception& e) {
        report(base + " quantize", std::string(" threw: ") + e.what());
        continue;
      }
      if (selected(base + " quantize")) report(base + " quantize", qerr);
      struct Layout {
        const char* what;
        const Both *a, *b;
        Copy ca, cb;
        const QuantConfig *qa, *qb;
        int64_t rows, k;
      };
      const Layout layouts[] = {
          {"dX = dY W", &dy, &w, Copy::kRowwise, Copy::kColwise, &r.act, &r.wgt, M, N},
          {"dW = dY^T X", &dy, &x, Copy::kColwise, Copy::kColwise, &r.act, &r.act, N, M}};
      for (const Layout& L : layouts) {
        const bool ch = chunked_cfg(r, *L.qa) || chunked_cfg(r, *L.qb);
        const std::vector<GemmVariant> ks = kernels_for(ch, L.rows, L.k);
        if (ks.empty()) skip(base + " " + L.what, "no applicable kernel");
        GemmConfig cfg;
        cfg.a_copy = L.ca, cfg.w_copy = L.cb;
        const GemmResult cpu = qgemm(L.a->cpu(), L.b->cpu(), cfg);
        for (GemmVariant k : ks) {
          const std::string name = base + " " + L.what + " " + kernel_label(k);
          run_case(name, [&] {
            std::string err;
            GemmConfig c = cfg;
            force_variant(c, k);
            const GemmResult g = gpu_qgemm(L.a->gpu_arg(), L.b->gpu_arg(), c);
            if (!kernel_matches(k, ran(g))) err += " ran " + kernel_label(ran(g));
            err += compare_gemm(L.a->cpu(), L.b->cpu(), cpu, g, L.ca, L.cb);
            return err;
          });
        }
      }
    }
}

// Grouped: dgrad with W colwise per expert (the fprop weight stack [E * N, K] read as the groups'
// [K, N] transposes), wgrad with groups along K (token rows per expert).
void grouped_backward() {
  const int64_t E = 4, K = 128;
  for (const Recipe& r : recipes()) {
    // Expert e's weight rows [e N, (e + 1) N) are one group of the weight stack, so N is a
    // multiple of the recipe's row blocks (128 for FP8 128x128 weights).
    const int64_t N = std::max<int64_t>(64, r.row_multiple);
    const std::string base = "backward grouped " + r.name;
    const uint64_t seed = case_seed(base);
    std::mt19937_64 g(seed);
    std::vector<int64_t> off{0};
    for (int64_t e = 0; e < E; ++e)
      off.push_back(off.back() + (e == 1 ? 0 : r.row_multiple * int64_t(1 + g() % 3)));
    std::vector<int64_t> woff(size_t(E + 1));
    for (int64_t e = 0; e <= E; ++e) woff[size_t(e)] = e * N;
    const int64_t rows = off.back();
    const Tensor offs = Tensor::from_vector<int64_t>(off, {E + 1}, DType::kI64);
    Both x, w, dy;
    try {
      x = both(small_ints(rows * K, seed), rows, K, r.act, r.dense, off);
      w = both(small_ints(E * N * K, seed + 1), E * N, K, r.wgt, r.dense, woff);
      dy = both(small_ints(rows * N, seed + 2), rows, N, r.act, r.dense, off);
    } catch (const std::exception& e) {
      report(base, std::string(" threw: ") + e.what());
      continue;
    }
    // dgrad: out [rows, K], group e = dY_e W_e (GEMM K = N).
    for (int place = 0; place < 2; ++place) {
      const bool ch = chunked_cfg(r, r.act) || chunked_cfg(r, r.wgt);
      for (GemmVariant k : kernels_for(ch, place == 0 ? 3 * r.row_multiple : rows, N, place == 0)) {
        const std::string name =
            base + " dgrad " + (place == 0 ? "host" : "device") + " offsets " + kernel_label(k);
        if (!selected(name)) continue;
        std::string err;
        try {
          GemmConfig cfg;
          cfg.w_copy = Copy::kColwise;
          const GemmResult cpu = grouped_qgemm(dy.cpu(), offs, w.cpu(), cfg);
          force_variant(cfg, k);
          const GemmResult gr =
              gpu_grouped(dy.gpu_arg(), place == 0 ? offs : to_gpu(offs), w.gpu_arg(), cfg);
          err = same_bits(cpu.d, gr.d, name) ? "" : " bits differ (small-integer inputs)";
        } catch (const std::exception& e) {
          err = std::string(" threw: ") + e.what();
        }
        report(name, err);
      }
    }
    // wgrad: out [E * N, K], group e = dY_e^T X_e (GEMM K = the group's rows, padded on CUDA).
    const bool ch = chunked_cfg(r, r.act);
    for (GemmVariant k : kernels_for(ch, N, 64)) {
      const std::string name = base + " wgrad (groups along K) " + kernel_label(k);
      run_case(name, [&] {
        std::string err;
        GemmConfig cfg;
        cfg.a_copy = cfg.w_copy = Copy::kColwise;
        cfg.epilogue.row_amax = true;
        const GemmResult cpu = grouped_qgemm(dy.cpu(), offs, x.cpu(), cfg);
        force_variant(cfg, k);
        const GemmResult gr = gpu_grouped(dy.gpu_arg(), offs, x.gpu_arg(), cfg);
        err = (same_bits(cpu.d, gr.d, name) ? "" : " bits differ (small-integer inputs)") +
              compare_t(cpu.row_amax, gr.row_amax, true, "row_amax");
        return err;
      });
    }
  }
}

}  // namespace

void test_backward() {
  if (!want("backward")) return;
  dense_backward();
  grouped_backward();
}

// quantize -> qgemm -> quantize of the output, all on the device: no device-to-host copy inside,
// the CPU chain's bytes on exact inputs, the bound and an exact last step otherwise.
void test_chain() {
  if (!want("chain")) return;
  const int64_t M = 96, K = 256, N = 160;
  struct Chain {
    std::string name;
    QuantConfig a, w, out;
    DType out_dtype;
  };
  auto q = [](Format f, Scaling s) {
    QuantConfig c;
    c.format = f, c.scaling = s;
    return c;
  };
  QuantConfig b1 = q(Format::kFp8, Scaling::kBlock1x128),
              b2 = q(Format::kFp8, Scaling::kBlock128x128);
  b1.pow2 = b2.pow2 = true;
  const std::vector<Chain> chains = {
      {"nvfp4 per_row x nvfp4 per_tensor -> bf16 -> nvfp4 per_row",
       q(Format::kNvfp4, Scaling::kPerRow), q(Format::kNvfp4, Scaling::kPerTensor),
       q(Format::kNvfp4, Scaling::kPerRow), DType::kBF16},
      {"fp8 1x128 x 128x128 -> f32 -> fp8 1x128", b1, b2, b1, DType::kF32},
      {"mxfp8 -> f32 -> mxfp8 row+col", q(Format::kMxfp8, Scaling::kBlock1x32),
       q(Format::kMxfp8, Scaling::kBlock1x32),
       [] {
         QuantConfig c;
         c.format = Format::kMxfp8, c.scaling = Scaling::kBlock1x32, c.colwise = true;
         return c;
       }(),
       DType::kF32}};
  for (const Chain& ch : chains)
    for (bool ints : {true, false}) {
      const std::string base = "chain " + ch.name + (ints ? " ints" : " random");
      const bool chunk = ch.a.format == Format::kFp8;
      for (GemmVariant k : kernels_for(chunk, M, K)) {
        const std::string name = base + " " + kernel_label(k);
        if (!selected(name)) continue;
        const uint64_t seed = case_seed(base);
        const Tensor x = from_f32(ints ? small_ints(M * K, seed) : random_values(M * K, seed, 1.0f),
                                  {M, K}, DType::kBF16);
        const Tensor w =
            from_f32(ints ? small_ints(N * K, seed + 1) : random_values(N * K, seed + 1, 0.05f),
                     {N, K}, DType::kBF16);
        std::string err;
        try {
          GemmConfig cfg;
          cfg.out_dtype = ch.out_dtype;
          force_variant(cfg, k);
          const QTensor xq = quantize(x, ch.a), wq = quantize(w, ch.w);
          GemmConfig host_cfg;
          host_cfg.out_dtype = ch.out_dtype;
          const GemmResult d = qgemm(xq, wq, host_cfg);
          const QTensor dq = quantize(d.d, ch.out);
          const Tensor xd = to_gpu(x), wd = to_gpu(w);
          const int64_t before = device_to_host_copies();
          set_poison_device_allocations(true);
          const QTensor xqd = quantize(xd, ch.a),
                        wqd = quantize(wd, ch.w);  // device in, device out
          const GemmResult dd = qgemm(xqd, wqd, cfg);
          const QTensor dqd = quantize(dd.d, ch.out);
          set_poison_device_allocations(false);
          if (device_to_host_copies() != before) err += " a device-to-host copy inside the chain";
          if (!dd.d.is_cuda() || dqd.device() != gpu()) err += " a chain result left the device";
          if (any_order_exact(xq, wq)) {
            err += compare_q(dq, dqd.to(Device::cpu()));
          } else {
            err += within_bound(dd.d, qgemm_f64(xq, wq));
            err += compare_q(quantize(dd.d.to(Device::cpu()), ch.out), dqd.to(Device::cpu()));
          }
        } catch (const std::exception& e) {
          set_poison_device_allocations(false);
          err += std::string(" threw: ") + e.what();
        }
        report(name, err);
      }
    }
}

}  // namespace lockstep::gpu_test
