// lockstep_test_gpu --op rmsnorm,rope,swiglu,embedding,adamw,grad_norm,elementwise: the Tensor
// entries of those op families on CUDA against the same entries on the CPU, bit for bit (their
// row functions are shared, so the orders are the same): random and edge values (zeros, NaN, inf,
// subnormals, huge), awkward shapes (one row, 993 columns, vocab 151936, 4097 tokens), device
// outputs poisoned, every GPU call run twice with identical bytes and no device-to-host copy
// (grad_norm: exactly one, its result). Out-of-range device indices give the documented NaN rows.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "lockstep/ops/tensor_ops.h"
#include "lockstep/tensor/storage.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

// Runs cpu() once and gpu() twice with poisoned device allocations: every output equals the CPU's
// bits (NaN payloads aside: x86 and the GPU make different NaNs), both GPU runs are identical, and
// the GPU runs copy nothing from the device to the host.
void check_outs(const std::string& name, const std::function<std::vector<Tensor>()>& cpu,
                const std::function<std::vector<Tensor>()>& gpu_fn) {
  run_case(name, [&]() -> std::string {
    const std::vector<Tensor> expect = cpu();
    set_poison_device_allocations(true);
    const int64_t d2h = device_to_host_copies();
    const std::vector<Tensor> got0 = gpu_fn(), got1 = gpu_fn();
    synchronize(gpu());
    const int64_t copies = device_to_host_copies() - d2h;
    set_poison_device_allocations(false);
    std::string err;
    if (copies != 0) err += " " + std::to_string(copies) + " device-to-host copies";
    if (got0.size() != expect.size() || got1.size() != expect.size()) return err + " output count";
    for (size_t i = 0; i < expect.size(); ++i) {
      if (got0[i].defined() && !got0[i].is_cuda())
        err += " output " + std::to_string(i) + " on host";
      const std::string what = "out" + std::to_string(i);
      err += compare_t(expect[i], got0[i], true, what.c_str());
      const std::string again = compare_t(got0[i], got1[i], false, what.c_str());
      if (!again.empty()) err += " | second run differs:" + again;
    }
    return err;
  });
}

namespace ops_basic_cases {

using Outs = std::vector<Tensor>;

std::string dims(std::initializer_list<int64_t> v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

Tensor values(int64_t rows, int64_t cols, Dist d, uint64_t seed) {
  return host_tensor(make_values(rows, cols, d, false, seed), rows, cols, false);
}

// [n] I32 in [0, hi) (skewed to small values, so ids repeat), a few set to `bad` when bad_every >
// 0.
Tensor indices(int64_t n, int64_t hi, uint64_t seed, int64_t bad_every = 0,
               std::vector<int32_t> bad = {}) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = g();
    v[size_t(i)] = int32_t((r % 4 == 0) ? (r >> 8) % uint64_t(std::min<int64_t>(hi, 7))
                                        : (r >> 8) % uint64_t(hi));
    if (bad_every > 0 && i % bad_every == 1) v[size_t(i)] = bad[size_t(i / bad_every) % bad.size()];
  }
  return Tensor::from_vector<int32_t>(v, {n}, DType::kI32);
}

std::vector<Dist> dists(bool with_zeros = true) {
  if (g_opt.reduced) return {Dist::kEdge};
  std::vector<Dist> d{Dist::kNormal, Dist::kEdge, Dist::kNanRows};
  if (with_zeros) d.push_back(Dist::kZeros);
  return d;
}

void test_rmsnorm() {
  // Rows of up to 1024 run a block per row, the row staged in shared memory up to 8192 columns
  // (1 x 8192, 3 x 4097) and read from global memory beyond (2 x 8200).
  std::vector<Shape> shapes{{1, 2048}, {300, 2048}, {2048, 128}, {993, 128}, {7, 993}, {0, 64},
                            {600, 70}, {1, 1},      {1, 8192},   {3, 4097},  {2, 8200}};
  if (g_opt.reduced) shapes = {{1, 2048}, {300, 128}, {7, 993}, {0, 64}, {2, 8200}};
  for (const Shape& sh : shapes)
    for (Dist dist : dists()) {
      const std::string name = "rmsnorm " + dims({sh.rows, sh.cols}) + " " + dist_name(dist);
      if (!selected(name)) continue;
      const uint64_t seed = case_seed(name);
      const Tensor x = values(sh.rows, sh.cols, dist, seed);
      const Tensor w = values(1, sh.cols, Dist::kNormal, seed + 1).view({sh.cols});
      const Tensor dy = values(sh.rows, sh.cols, Dist::kNormal, seed + 2);
      const Tensor res = values(sh.rows, sh.cols, Dist::kNormal, seed + 3);
      const Tensor xd = to_gpu(x), wd = to_gpu(w), dyd = to_gpu(dy), resd = to_gpu(res);
      // The bf16 output (a bf16 GEMM operand's producer): the CPU's is cast(y, BF16). add_rmsnorm
      // (the residual add in the norm's kernel): the CPU's is add_inplace, then rmsnorm; the
      // updated x is compared too.
      auto run = [](const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& res) -> Outs {
        Tensor rstd, dw, rstd_a;
        const Tensor y = ops::rmsnorm(x, w, 1e-6, &rstd);
        const Tensor dx = ops::rmsnorm_backward(dy, x, w, rstd, &dw);
        const Tensor yb = ops::rmsnorm(x, w, 1e-6, nullptr, DType::kBF16);
        Tensor xa = x.clone(), xab = x.clone();
        const Tensor ya = ops::add_rmsnorm(xa, res, w, 1e-6, &rstd_a);
        const Tensor yab = ops::add_rmsnorm(xab, res, w, 1e-6, nullptr, DType::kBF16);
        return {y, rstd, dx, dw, yb, xa, ya, rstd_a, xab, yab};
      };
      check_outs(
          name, [&] { return run(x, w, dy, res); }, [&] { return run(xd, wd, dyd, resd); });
    }
}

void test_rope() {
  struct Case {
    int64_t tokens, heads, head_dim, max_pos;
  };
  std::vector<Case> cases{{1, 32, 128, 4097}, {37, 4, 128, 4097}, {4097, 4, 128, 4097},
                          {5, 3, 2, 9},       {64, 8, 64, 100},   {0, 4, 128, 16}};
  if (g_opt.reduced) cases = {{1, 32, 128, 4097}, {37, 4, 128, 4097}, {5, 3, 2, 9}};
  for (const Case& c : cases)
    for (Dist dist : dists(false)) {
      const std::string name = "rope " + dims({c.tokens, c.heads, c.head_dim}) + " pos<" +
                               std::to_string(c.max_pos) + " " + dist_name(dist);
      if (!selected(name)) continue;
      const uint64_t seed = case_seed(name);
      const ops::RopeTable table = ops::rope_table(c.max_pos, c.head_dim, 1e6, DType::kF32);
      const ops::RopeTable tabled = table.to(gpu());
      const Tensor x = values(c.tokens, c.heads * c.head_dim, dist, seed);
      const Tensor pos = indices(c.tokens, c.max_pos, seed + 1);
      const Tensor xd = to_gpu(x), posd = to_gpu(pos);
      auto run = [&](const Tensor& x, const Tensor& pos, const ops::RopeTable& t) -> Outs {
        Tensor y = x.clone(), dx = x.clone();
        ops::rope_inplace(y, pos, c.heads, t);
        ops::rope_backward_inplace(dx, pos, c.heads, t);
        return {y, dx};
      };
      check_outs(
          name, [&] { return run(x, pos, table); }, [&] { return run(xd, posd, tabled); });
    }
  // Positions outside the table on the device: that token's rows are NaN, the others as the CPU.
  const std::string name = "rope out-of-range positions";
  run_case(name, [&]() -> std::string {
    const int64_t tokens = 40, heads = 2, hd = 16, max_pos = 30;
    const ops::RopeTable table = ops::rope_table(max_pos, hd, 1e4, DType::kF32);
    const Tensor x = values(tokens, heads * hd, Dist::kNormal, case_seed(name));
    Tensor pos = indices(tokens, max_pos, case_seed(name) + 1, 10, {-1, int32_t(max_pos)});
    Tensor y = to_gpu(x);
    ops::rope_inplace(y, to_gpu(pos), heads, table.to(gpu()));
    const Tensor yh = y.to(Device::cpu());
    Tensor ref = x.clone();
    std::vector<int32_t> fixed(pos.data<int32_t>().begin(), pos.data<int32_t>().end());
    for (int32_t& p : fixed) p = (p < 0 || p >= max_pos) ? 0 : p;
    ops::rope_inplace(ref, Tensor::from_vector<int32_t>(fixed, {tokens}, DType::kI32), heads,
                      table);
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t p = pos.data<int32_t>()[size_t(t)];
      const bool bad = p < 0 || p >= max_pos;
      for (int64_t i = 0; i < heads * hd; ++i) {
        const float g = yh.ptr<float>()[t * heads * hd + i],
                    e = ref.ptr<float>()[t * heads * hd + i];
        if (bad ? !std::isnan(g) : std::memcmp(&g, &e, 4) != 0)
          return " token " + std::to_string(t) + " element " + std::to_string(i);
      }
    }
    return "";
  });
}

void test_swiglu() {
  std::vector<Shape> shapes{{1, 768}, {300, 768}, {7, 993}, {64, 1}, {0, 16}};
  if (g_opt.reduced) shapes = {{1, 768}, {7, 993}, {0, 16}};
  for (const Shape& sh : shapes)
    for (Dist dist : dists())
      for (bool weighted : {false, true}) {
        const std::string name = "swiglu op " + dims({sh.rows, sh.cols}) + " " + dist_name(dist) +
                                 (weighted ? " weighted" : "");
        if (!selected(name)) continue;
        const uint64_t seed = case_seed(name);
        const Tensor x = values(sh.rows, 2 * sh.cols, dist, seed);
        const Tensor p =
            weighted ? values(1, sh.rows, Dist::kNormal, seed + 1).view({sh.rows}) : Tensor();
        const Tensor dy = values(sh.rows, sh.cols, Dist::kNormal, seed + 2);
        const Tensor xd = to_gpu(x), pd = to_gpu(p), dyd = to_gpu(dy);
        auto run = [](const Tensor& x, const Tensor& p, const Tensor& dy) -> Outs {
          const Tensor y = ops::swiglu(x, p);
          const ops::SwigluGrads g = ops::swiglu_backward(x, p, dy);
          return {y, g.dx, g.dp, ops::swiglu(x, p, DType::kBF16)};
        };
        check_outs(
            name, [&] { return run(x, p, dy); }, [&] { return run(xd, pd, dyd); });
      }
}

void test_embedding() {
  struct Case {
    int64_t vocab, d, tokens;
  };
  std::vector<Case> cases{{1000, 2048, 300}, {151936, 128, 4097}, {5, 3, 2000},
                          {50, 64, 0},       {1, 1, 17},          {151936, 2048, 1024}};
  if (g_opt.reduced) cases = {{1000, 256, 300}, {151936, 8, 100}, {5, 3, 200}};
  for (const Case& c : cases)
    for (Dist dist : {Dist::kNormal, Dist::kEdge}) {
      if (g_opt.reduced && dist != Dist::kEdge) continue;
      if (c.vocab * c.d > (int64_t(1) << 28) && dist != Dist::kNormal) continue;  // 1.2 GB tables
      const std::string name = "embedding " + dims({c.vocab, c.d}) + " tokens " +
                               std::to_string(c.tokens) + " " + dist_name(dist);
      if (!selected(name)) continue;
      const uint64_t seed = case_seed(name);
      const Tensor table = values(c.vocab, c.d, dist, seed);
      const Tensor ids = indices(c.tokens, c.vocab, seed + 1);
      const Tensor dout = values(c.tokens, c.d, dist, seed + 2);
      const Tensor td = to_gpu(table), idd = to_gpu(ids), dd = to_gpu(dout);
      auto run = [&](const Tensor& t, const Tensor& i, const Tensor& g) -> Outs {
        return {ops::embedding(t, i), ops::embedding_backward(g, i, c.vocab)};
      };
      check_outs(
          name, [&] { return run(table, ids, dout); }, [&] { return run(td, idd, dd); });
    }
  // Ids outside the vocabulary on the device: NaN forward rows; no gradient row receives them.
  const std::string name = "embedding out-of-range ids";
  run_case(name, [&]() -> std::string {
    const int64_t vocab = 20, d = 12, tokens = 300;
    const Tensor table = values(vocab, d, Dist::kNormal, case_seed(name));
    const Tensor ids = indices(tokens, vocab, case_seed(name) + 1, 7, {-1, int32_t(vocab), -5});
    const Tensor dout = values(tokens, d, Dist::kNormal, case_seed(name) + 2);
    const Tensor out = ops::embedding(to_gpu(table), to_gpu(ids)).to(Device::cpu());
    const Tensor dt = ops::embedding_backward(to_gpu(dout), to_gpu(ids), vocab).to(Device::cpu());
    std::vector<int32_t> keep_ids;
    std::vector<float> keep_rows;
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t id = ids.data<int32_t>()[size_t(t)];
      const bool bad = id < 0 || id >= vocab;
      for (int64_t c = 0; c < d; ++c) {
        const float g = out.ptr<float>()[t * d + c];
        if (bad ? !std::isnan(g) : g != table.ptr<float>()[id * d + c])
          return " forward token " + std::to_string(t);
      }
      if (bad) continue;
      keep_ids.push_back(id);
      keep_rows.insert(keep_rows.end(), dout.ptr<float>() + t * d, dout.ptr<float>() + (t + 1) * d);
    }
    const int64_t kept = int64_t(keep_ids.size());
    const Tensor ref =
        ops::embedding_backward(Tensor::from_vector<float>(keep_rows, {kept, d}, DType::kF32),
                                Tensor::from_vector<int32_t>(keep_ids, {kept}, DType::kI32), vocab);
    return compare_t(ref, dt, false, "dtable");
  });
}

void test_adamw() {
  std::vector<int64_t> sizes{1, 1000, (int64_t(1) << 20) + 3, 0};
  if (g_opt.reduced) sizes = {1, 1000, 70001};
  for (int64_t n : sizes)
    for (Dist dist : dists(false))
      for (int variant = 0; variant < 3; ++variant) {
        // 0: step 1, no scale, amax; 1: step 7, scale 0.37, decay, amax; 2: step 2, no amax.
        const int64_t step = variant == 0 ? 1 : variant == 1 ? 7 : 2;
        const double scale = variant == 1 ? 0.37 : 1.0;
        const bool want_amax = variant != 2;
        // Variant 1 splits the amax into 4 equal domains where 4 divides n (the converter's
        // per-expert amax).
        const int64_t domains = variant == 1 && n % 4 == 0 ? 4 : 1;
        ops::AdamWConfig cfg;
        cfg.lr = 3e-4, cfg.beta2 = 0.95, cfg.weight_decay = variant == 1 ? 0.1 : 0.0;
        const std::string name = "adamw n" + std::to_string(n) + " step " + std::to_string(step) +
                                 (want_amax ? " amax" + std::to_string(domains) + " " : " ") +
                                 dist_name(dist);
        if (!selected(name)) continue;
        const uint64_t seed = case_seed(name);
        const Tensor p = values(1, n, dist, seed).view({n});
        const Tensor g = values(1, n, dist, seed + 1).view({n});
        const Tensor m = ops::scale(values(1, n, Dist::kNormal, seed + 2).view({n}), 1e-3);
        std::vector<float> vv = make_values(1, n, Dist::kNormal, false, seed + 3);
        for (float& x : vv) x = x * x * 1e-4f;
        const Tensor v = Tensor::from_vector<float>(vv, {n}, DType::kF32);
        auto run = [&](const Tensor& p0, const Tensor& g, const Tensor& m0,
                       const Tensor& v0) -> Outs {
          Tensor pp = p0.clone(), mm = m0.clone(), vv2 = v0.clone(), amax;
          ops::adamw_step(pp, g, mm, vv2, cfg, step, scale, want_amax ? &amax : nullptr, domains);
          return {pp, mm, vv2, amax};
        };
        const Tensor pd = to_gpu(p), gd = to_gpu(g), md = to_gpu(m), vd = to_gpu(v);
        check_outs(
            name, [&] { return run(p, g, m, v); }, [&] { return run(pd, gd, md, vd); });
      }
}

void test_grad_norm() {
  // More than two tiles of 2048 chunk sums in one tensor (the combine kernel stages tiles).
  const std::vector<int64_t> kTiles{3, ops::kGradNormChunk * 4100 + 17, 5};
  std::vector<std::vector<int64_t>> lists{
      {10000, 4096, 1, 0, 50001, 3 << 20}, {1}, {0, 0}, {4097, 8191, 8193, 12288}, kTiles};
  if (g_opt.reduced) lists = {{10000, 1, 0, 4097}, {0, 0}, kTiles};
  for (size_t li = 0; li < lists.size(); ++li)
    for (Dist dist : dists(false)) {
      const std::string name = "grad_norm list" + std::to_string(li) + " " + dist_name(dist);
      run_case(name, [&]() -> std::string {
        std::vector<Tensor> host, dev;
        for (size_t i = 0; i < lists[li].size(); ++i) {
          const int64_t n = lists[li][i];
          host.push_back(values(1, n, dist, case_seed(name) + i).view({n}));
          dev.push_back(to_gpu(host.back()));
        }
        const double expect = ops::grad_norm(host);
        const int64_t d2h = device_to_host_copies();
        const double got0 = ops::grad_norm(dev), got1 = ops::grad_norm(dev);
        std::string err;
        if (device_to_host_copies() - d2h != 2) err += " not one device-to-host copy per call";
        auto same = [](double a, double b) {
          return std::memcmp(&a, &b, 8) == 0 || (std::isnan(a) && std::isnan(b));
        };
        if (!same(expect, got0) || !same(got0, got1))
          err += " norm cpu " + std::to_string(expect) + " cuda " + std::to_string(got0) + ", " +
                 std::to_string(got1);
        return err;
      });
    }
}

void test_elementwise() {
  std::vector<Shape> shapes{{1, 1}, {993, 512}, {7, 20001}, {0, 5}, {5, 0}};
  if (g_opt.reduced) shapes = {{1, 1}, {993, 512}, {0, 5}};
  for (const Shape& sh : shapes)
    for (Dist dist : dists()) {
      const std::string tail = dims({sh.rows, sh.cols}) + " " + dist_name(dist);
      const uint64_t seed = case_seed(tail);
      const Tensor a = values(sh.rows, sh.cols, dist, seed);
      const Tensor b = values(sh.rows, sh.cols, dist, seed + 1);
      const Tensor r = values(1, sh.rows, dist, seed + 2).view({sh.rows});
      const Tensor ad = to_gpu(a), bd = to_gpu(b), rd = to_gpu(r);
      auto arith = [](const Tensor& a, const Tensor& b, const Tensor& r) -> Outs {
        Tensor acc = a.clone(), rounded = a.clone(), sig = a.clone();
        ops::add_inplace(acc, b);
        ops::round_bf16_inplace(rounded);
        ops::sigmoid_inplace(sig);
        return {ops::scale(a, 0.37),   ops::add(a, b),    acc, rounded, sig,
                ops::scale_rows(a, r), ops::row_dot(a, b)};
      };
      check_outs(
          "elementwise " + tail, [&] { return arith(a, b, r); }, [&] { return arith(ad, bd, rd); });
      const std::pair<DType, DType> casts[] = {
          {DType::kF32, DType::kBF16}, {DType::kBF16, DType::kF32}, {DType::kF32, DType::kF16},
          {DType::kF16, DType::kF32},  {DType::kBF16, DType::kF16}, {DType::kF16, DType::kBF16}};
      for (const auto& [from, to] : casts) {
        const std::string name = std::string("elementwise cast ") + std::string(dtype_name(from)) +
                                 "->" + std::string(dtype_name(to)) + " " + tail;
        const Tensor src = cast(a, from), srcd = to_gpu(src);
        check_outs(
            name, [&]() -> Outs { return {cast(src, to)}; },
            [&]() -> Outs { return {cast(srcd, to)}; });
      }
    }
}

void run_all() {
  if (want("rmsnorm")) test_rmsnorm();
  if (want("rope")) test_rope();
  if (want("swiglu")) test_swiglu();
  if (want("embedding")) test_embedding();
  if (want("adamw")) test_adamw();
  if (want("grad_norm")) test_grad_norm();
  if (want("elementwise")) test_elementwise();
}

}  // namespace ops_basic_cases

void test_ops_basic() { ops_basic_cases::run_all(); }

}  // namespace lockstep::gpu_test
