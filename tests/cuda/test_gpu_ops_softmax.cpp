// lockstep_test_gpu: the softmax family on CUDA against the CPU entries, bit for bit (NaN == NaN):
// softmax / log_softmax and their backward, token log-probs and their backward, the MoE router
// and its backward, and sample_tokens (greedy, plain, temperature, top-k, top-p). Shapes: the
// vocabulary (151936 columns) with 1, 3 and 16 rows (several blocks per row) and 200 rows (a block
// per row), 16384 rows of 32 and 1 columns, ragged widths; values: normal, ties (equal logits),
// edge (-inf, huge magnitudes, subnormals, a NaN row, a +inf row, an all -inf row). Outputs are
// poisoned, every op runs twice and both runs must have the same bytes.
// --op names: softmax, log_softmax, token_logprobs, router, sample.
#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/ops/tensor_ops.h"
#include "lockstep/tensor/storage.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {
namespace {

struct RowShape {
  int64_t rows, cols;
};

std::string shape_name(const RowShape& s) {
  return std::to_string(s.rows) + "x" + std::to_string(s.cols);
}

// Row values: "normal" (a random scale per row), "ties" (a few levels, one row all equal), "edge".
std::vector<float> row_values(const RowShape& s, const std::string& dist, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  const float inf = INFINITY;
  std::vector<float> v(static_cast<size_t>(s.rows * s.cols));
  for (int64_t r = 0; r < s.rows; ++r) {
    const float scale = std::pow(10.0f, -1.0f + 2.5f * ud(g));
    for (int64_t c = 0; c < s.cols; ++c) {
      float x = nd(g) * scale;
      if (dist == "ties") x = (r % 5 == 0) ? 1.5f : float(g() % 3) - 1.0f;
      if (dist == "edge") {
        const float p = ud(g);
        if (p < 0.10f)
          x = -inf;
        else if (p < 0.12f)
          x = (g() % 2 ? 1.0f : -1.0f) * std::ldexp(1.0f, 100 + int(g() % 28));
        else if (p < 0.13f)
          x = 3.4e38f * (g() % 2 ? 1.0f : -1.0f);
        else if (p < 0.15f)
          x = std::ldexp(nd(g), -140);
      }
      v[size_t(r * s.cols + c)] = x;
    }
    if (dist == "edge" && s.rows >= 4) {
      float* row = v.data() + r * s.cols;
      if (r % 7 == 1) row[g() % s.cols] = NAN;
      if (r % 7 == 2) row[g() % s.cols] = inf;
      if (r % 7 == 3) std::fill(row, row + s.cols, -inf);
    }
  }
  return v;
}

Tensor host_f32(const std::vector<float>& v, std::vector<int64_t> shape) {
  return Tensor::from_vector<float>(v, std::move(shape), DType::kF32);
}
Tensor host_i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, DType::kI32);
}

// Runs f twice with poisoned device outputs; returns both results.
template <class F>
auto twice(F&& f) {
  set_poison_device_allocations(true);
  auto a = f();
  auto b = f();
  set_poison_device_allocations(false);
  return std::make_pair(std::move(a), std::move(b));
}

std::string same3(const Tensor& cpu, const Tensor& g0, const Tensor& g1, const std::string& what) {
  return compare_t(cpu, g0, true, what.c_str()) +
         compare_t(g0, g1, false, (what + " (second run)").c_str());
}

std::vector<RowShape> vocab_shapes() {
  if (g_opt.reduced) return {{1, 151936}, {3, 993}, {300, 257}, {16384, 1}};
  return {{1, 151936}, {3, 151936}, {16, 151936}, {200, 151936}, {16384, 32},
          {16384, 1},  {1, 1},      {7, 993},     {40, 4097},    {300, 1000}};
}
const std::vector<std::string>& dists() {
  static const std::vector<std::string> all{"normal", "ties", "edge"}, reduced{"edge"};
  return g_opt.reduced ? reduced : all;
}

void softmax_cases(bool log) {
  const std::string op = log ? "log_softmax" : "softmax";
  if (!want(op)) return;
  for (const RowShape& s : vocab_shapes())
    for (const std::string& d : dists()) {
      const std::string name = op + " " + shape_name(s) + " " + d;
      run_case(name, [&] {
        const Tensor x = host_f32(row_values(s, d, case_seed(name)), {s.rows, s.cols}),
                     xd = to_gpu(x);
        const auto fwd = [&](const Tensor& t) {
          return log ? ops::log_softmax(t) : ops::softmax(t);
        };
        const Tensor y = fwd(x);
        const auto [g0, g1] = twice([&] { return fwd(xd); });
        std::string err = same3(y, g0, g1, "y");
        // Backward with a random upstream gradient, on the CPU's y (the same input on both sides).
        const Tensor dy = host_f32(row_values(s, "normal", case_seed(name) + 1), {s.rows, s.cols});
        const Tensor yd = to_gpu(y), dyd = to_gpu(dy);
        const auto bwd = [&](const Tensor& a, const Tensor& b) {
          return log ? ops::log_softmax_backward(a, b) : ops::softmax_backward(a, b);
        };
        const Tensor dx = bwd(y, dy);
        const auto [d0, d1] = twice([&] { return bwd(yd, dyd); });
        return err + same3(dx, d0, d1, "dx");
      });
    }
}

void token_logprobs_cases() {
  if (!want("token_logprobs")) return;
  for (const RowShape& s : vocab_shapes())
    for (const std::string& d : dists()) {
      const std::string name = "token_logprobs " + shape_name(s) + " " + d;
      run_case(name, [&] {
        std::mt19937_64 g(case_seed(name));
        const Tensor x = host_f32(row_values(s, d, case_seed(name)), {s.rows, s.cols}),
                     xd = to_gpu(x);
        std::vector<int32_t> tv(static_cast<size_t>(s.rows));
        for (auto& t : tv) t = int32_t(g() % uint64_t(s.cols));
        const Tensor t = host_i32(tv), td = to_gpu(t);
        const ops::TokenLogprobs e = ops::token_logprobs(x, t);
        const auto [g0, g1] = twice([&] { return ops::token_logprobs(xd, td); });
        std::string err = same3(e.logp, g0.logp, g1.logp, "logp") +
                          same3(e.entropy, g0.entropy, g1.entropy, "entropy") +
                          same3(e.lse, g0.lse, g1.lse, "lse");
        std::vector<float> a(static_cast<size_t>(s.rows)), b(static_cast<size_t>(s.rows));
        for (auto& v : a) v = float(int(g() % 7) - 3) * 0.25f;
        for (auto& v : b) v = float(int(g() % 5) - 2) * 0.5f;
        const Tensor dl = host_f32(a, {s.rows}), dh = host_f32(b, {s.rows});
        const ops::TokenLogprobs ed{to_gpu(e.logp), to_gpu(e.entropy), to_gpu(e.lse)};
        for (int mode = 0; mode < 2; ++mode) {  // both gradients, then dlogp only
          const Tensor dhm = mode == 0 ? dh : Tensor();
          const Tensor dx = ops::token_logprobs_backward(x, t, e, dl, dhm);
          const auto [d0, d1] = twice(
              [&] { return ops::token_logprobs_backward(xd, td, ed, to_gpu(dl), to_gpu(dhm)); });
          err += same3(dx, d0, d1, mode == 0 ? "dlogits" : "dlogits (dlogp only)");
        }
        return err;
      });
    }
  // Targets on the device outside the vocabulary: NaN log-prob and a NaN gradient row, the other
  // rows as on the CPU (which refuses such targets, so it runs with them replaced by 0).
  const std::string name = "token_logprobs 6x300 targets out of range";
  run_case(name, [&] {
    const RowShape s{6, 300};
    const Tensor x = host_f32(row_values(s, "normal", case_seed(name)), {6, 300});
    std::vector<int32_t> tv{5, 300, 7, -2, 299, 0}, safe = tv;
    safe[1] = safe[3] = 0;
    const ops::TokenLogprobs e = ops::token_logprobs(x, host_i32(safe));
    const ops::TokenLogprobs g = ops::token_logprobs(to_gpu(x), to_gpu(host_i32(tv)));
    Tensor want_lp = e.logp.clone();
    want_lp.ptr<float>()[1] = want_lp.ptr<float>()[3] = NAN;
    const Tensor dl = host_f32(std::vector<float>(6, 0.5f), {6});
    Tensor dx = ops::token_logprobs_backward(x, host_i32(safe), e, dl, Tensor());
    std::fill(dx.ptr<float>() + 300, dx.ptr<float>() + 600, NAN);
    std::fill(dx.ptr<float>() + 900, dx.ptr<float>() + 1200, NAN);
    const Tensor gd = ops::token_logprobs_backward(
        to_gpu(x), to_gpu(host_i32(tv)),
        ops::TokenLogprobs{to_gpu(e.logp), to_gpu(e.entropy), to_gpu(e.lse)}, to_gpu(dl), Tensor());
    return compare_t(want_lp, g.logp, true, "logp") + compare_t(e.lse, g.lse, true, "lse") +
           compare_t(dx, gd, true, "dlogits");
  });
}

void router_cases() {
  if (!want("router")) return;
  struct R {
    int64_t rows, experts, k;
  };
  // Rows wider than the 32 lanes several times over (512, 600 experts) beside the Qwen3 shapes.
  std::vector<R> rs = {{16384, 128, 8}, {1, 128, 8}, {7, 64, 1},  {5, 32, 32}, {3, 1, 1},
                       {33, 100, 5},    {9, 256, 8}, {9, 512, 8}, {10, 600, 8}};
  if (g_opt.reduced) rs = {{1, 128, 8}, {33, 100, 5}, {5, 32, 32}, {10, 600, 8}};
  for (const R& c : rs)
    for (const std::string& d : dists())
      for (bool renorm : {false, true}) {
        const std::string name = "router " + std::to_string(c.rows) + "x" +
                                 std::to_string(c.experts) + " k" + std::to_string(c.k) + " " + d +
                                 (renorm ? " renorm" : "");
        run_case(name, [&] {
          const Tensor x =
              host_f32(row_values({c.rows, c.experts}, d, case_seed(name)), {c.rows, c.experts});
          const ops::RouterOut e = ops::router_topk(x, c.k, renorm);
          const Tensor xd = to_gpu(x);
          const auto [g0, g1] = twice([&] { return ops::router_topk(xd, c.k, renorm); });
          std::string err = same3(e.probs, g0.probs, g1.probs, "probs") +
                            same3(e.expert_ids, g0.expert_ids, g1.expert_ids, "expert_ids") +
                            same3(e.weights, g0.weights, g1.weights, "weights");
          const Tensor dw =
              host_f32(row_values({c.rows, c.k}, "normal", case_seed(name) + 1), {c.rows, c.k});
          const Tensor dl = ops::router_topk_backward(e, dw, renorm);
          const ops::RouterOut ed{to_gpu(e.probs), to_gpu(e.expert_ids), to_gpu(e.weights)};
          const Tensor dwd = to_gpu(dw);
          const auto [d0, d1] = twice([&] { return ops::router_topk_backward(ed, dwd, renorm); });
          err += same3(dl, d0, d1, "dlogits");
          // Routing replay of the same experts in reverse slot order (another renormalising sum).
          std::vector<int32_t> rev(e.expert_ids.ptr<int32_t>(),
                                   e.expert_ids.ptr<int32_t>() + e.expert_ids.numel());
          for (int64_t r = 0; r < c.rows; ++r)
            std::reverse(rev.begin() + r * c.k, rev.begin() + (r + 1) * c.k);
          const Tensor ids = Tensor::from_vector<int32_t>(rev, {c.rows, c.k}, DType::kI32);
          const ops::RouterOut re = ops::router_replay(x, ids, renorm);
          const Tensor idsd = to_gpu(ids);
          const auto [r0, r1] = twice([&] { return ops::router_replay(xd, idsd, renorm); });
          return err + same3(re.probs, r0.probs, r1.probs, "replay probs") +
                 same3(re.weights, r0.weights, r1.weights, "replay weights");
        });
      }
}

void sample_cases() {
  if (!want("sample")) return;
  struct C {
    const char* name;
    ops::SampleConfig cfg;
  };
  const std::vector<C> cs = {{"greedy", {1.0, 1, 1.0, 11}},   {"plain", {1.0, 0, 1.0, 12}},
                             {"t0.7", {0.7, 0, 1.0, 13}},     {"top_k50", {1.0, 50, 1.0, 14}},
                             {"top_p0.9", {0.8, 0, 0.9, 15}}, {"k20_p0.5", {1.3, 20, 0.5, 16}}};
  for (const RowShape& s : vocab_shapes())
    for (const std::string& d : dists())
      for (const C& c : cs) {
        if (g_opt.reduced && std::string(c.name) == "t0.7") continue;
        const std::string name = std::string("sample ") + c.name + " " + shape_name(s) + " " + d;
        run_case(name, [&] {
          std::mt19937_64 g(case_seed(name));
          const Tensor x = host_f32(row_values(s, d, case_seed(name)), {s.rows, s.cols});
          std::vector<int32_t> sv(static_cast<size_t>(s.rows));
          std::vector<int64_t> pv(static_cast<size_t>(s.rows));
          for (auto& v : sv) v = int32_t(g());
          for (auto& v : pv) v = int64_t(g() % 100000);
          const Tensor st = host_i32(sv);
          // I64 positions on one half of the cases, I32 on the other.
          const bool p64 = (case_seed(name) & 1) != 0;
          std::vector<int32_t> pv32(pv.begin(), pv.end());
          const Tensor pos =
              p64 ? Tensor::from_vector<int64_t>(pv, {s.rows}, DType::kI64) : host_i32(pv32);
          const ops::SampledTokens e = ops::sample_tokens(x, st, pos, c.cfg);
          const Tensor xd = to_gpu(x), std_ = to_gpu(st), posd = to_gpu(pos);
          const auto [g0, g1] = twice([&] { return ops::sample_tokens(xd, std_, posd, c.cfg); });
          return same3(e.tokens, g0.tokens, g1.tokens, "tokens") +
                 same3(e.logprobs, g0.logprobs, g1.logprobs, "logprobs");
        });
      }
}

}  // namespace

void test_softmax_family() {
  softmax_cases(false);
  softmax_cases(true);
  token_logprobs_cases();
  router_cases();
  sample_cases();
}

}  // namespace lockstep::gpu_test
