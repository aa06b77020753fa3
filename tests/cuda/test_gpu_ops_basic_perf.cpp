// lockstep_test_gpu --mode perf --op rmsnorm,rope,swiglu,embedding,adamw,grad_norm,elementwise:
// the basic op families on CUDA at Qwen3-30B-A3B shapes (16K tokens, hidden 2048, 32 heads of 128,
// experts of 768 with top-8, vocab 151936), each timed as the median of back-to-back calls
// (bench/cuda_timing.h) with its bytes per call, so the achieved bandwidth can be set against the
// H200's copy bandwidth (about 4.2 TB/s, GPU.md). Inputs are larger than L2.
#include <cstdio>
#include <functional>
#include <random>

#include "cuda_timing.h"
#include "lockstep/ops/tensor_ops.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

namespace ops_basic_perf {

Tensor random_gpu(std::vector<int64_t> shape, uint64_t seed, float lo = -1, float hi = 1) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return Tensor::from_vector<float>(v, std::move(shape), DType::kF32).to(gpu());
}

Tensor ids_gpu(int64_t n, int64_t hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = int32_t(g() % uint64_t(hi));
  return Tensor::from_vector<int32_t>(v, {n}, DType::kI32).to(gpu());
}

struct Row {
  std::string op;
  double bytes, us;
};

bool run() {
  const char* ops[] = {"rmsnorm", "rope",      "swiglu",     "embedding",
                       "adamw",   "grad_norm", "elementwise"};
  bool any = false;
  for (const char* o : ops) any = any || (!g_opt.op.empty() && want(o));
  if (!any) return false;
  const int64_t T = 16384, H = 2048, heads = 32, D = 128, I = 768, k = 8, V = 151936;
  std::vector<Row> rows;
  auto timed = [&](const std::string& op, double bytes, const std::function<void(int)>& fn) {
    if (!selected(op)) return;
    rows.push_back({op, bytes, bench::median_time_us(fn, 20)});
  };
  if (want("rmsnorm")) {
    const std::pair<int64_t, int64_t> shapes[] = {{T, H}, {T * heads, D}};
    for (const auto& [r, d] : shapes) {
      const Tensor x = random_gpu({r, d}, 1), w = random_gpu({d}, 2), dy = random_gpu({r, d}, 3);
      Tensor rstd;
      ops::rmsnorm(x, w, 1e-6, &rstd);
      const std::string s = std::to_string(r) + "x" + std::to_string(d);
      timed("rmsnorm fwd " + s, 8.0 * r * d, [&](int) { ops::rmsnorm(x, w, 1e-6, nullptr); });
      timed("rmsnorm bwd " + s, 20.0 * r * d, [&](int) {
        Tensor dw;
        ops::rmsnorm_backward(dy, x, w, rstd, &dw);
      });
    }
  }
  if (want("rope")) {
    Tensor q = random_gpu({T, heads * D}, 4);
    const Tensor pos = ids_gpu(T, 4096, 5);
    const ops::RopeTable t = ops::rope_table(4096, D, 1e6, DType::kF32).to(gpu());
    timed("rope q 16384x32x128", 8.0 * T * heads * D,
          [&](int) { ops::rope_inplace(q, pos, heads, t); });
  }
  if (want("swiglu")) {
    const int64_t R = T * k;
    const Tensor x = random_gpu({R, 2 * I}, 6, -4, 4), p = random_gpu({R}, 7, 0, 1),
                 dy = random_gpu({R, I}, 8);
    timed("swiglu fwd weighted 131072x768", 12.0 * R * I, [&](int) { ops::swiglu(x, p); });
    timed("swiglu bwd weighted 131072x768", 20.0 * R * I,
          [&](int) { ops::swiglu_backward(x, p, dy); });
  }
  if (want("embedding")) {
    const Tensor table = random_gpu({V, H}, 9), ids = ids_gpu(T, V, 10),
                 dout = random_gpu({T, H}, 11);
    timed("embedding fwd 16384 of 151936x2048", 8.0 * T * H,
          [&](int) { ops::embedding(table, ids); });
    timed("embedding bwd 16384 into 151936x2048", 4.0 * T * H + 4.0 * V * H,
          [&](int) { ops::embedding_backward(dout, ids, V); });
  }
  if (want("adamw")) {
    const int64_t n = int64_t(1) << 27;
    Tensor p = random_gpu({n}, 12), m = random_gpu({n}, 13, -1e-3f, 1e-3f),
           v = random_gpu({n}, 14, 0, 1e-4f), amax;
    const Tensor g = random_gpu({n}, 15);
    const ops::AdamWConfig cfg;
    timed("adamw 2^27 with amax", 28.0 * double(n),
          [&](int i) { ops::adamw_step(p, g, m, v, cfg, 1 + i, 1.0, &amax); });
  }
  if (want("grad_norm")) {
    std::vector<Tensor> gs;
    int64_t total = 0;
    for (int i = 0; i < 96; ++i) {
      const int64_t n = (i % 3 == 0) ? H * 4096 : (i % 3 == 1) ? 4096 * 512 : H;
      gs.push_back(random_gpu({n}, 16 + uint64_t(i)));
      total += n;
    }
    timed("grad_norm 96 tensors " + std::to_string(total), 4.0 * double(total),
          [&](int) { ops::grad_norm(gs); });
    // One stacked expert weight of the benchmark preset (128 experts of 2 x 768 x 2048): 98,304
    // chunk sums for one tensor, added in order.
    const std::vector<Tensor> experts{random_gpu({128 * 2 * I * H}, 15)};
    timed("grad_norm 1 tensor " + std::to_string(128 * 2 * I * H), 4.0 * 128 * 2 * I * H,
          [&](int) { ops::grad_norm(experts); });
  }
  if (want("elementwise")) {
    Tensor a = random_gpu({T, H}, 20);
    const Tensor b = random_gpu({T, H}, 21), r = random_gpu({T}, 22);
    timed("add_inplace 16384x2048", 12.0 * T * H, [&](int) { ops::add_inplace(a, b); });
    timed("scale_rows 16384x2048", 8.0 * T * H, [&](int) { ops::scale_rows(b, r); });
    timed("row_dot 16384x2048", 8.0 * T * H, [&](int) { ops::row_dot(a, b); });
    timed("cast f32->bf16 16384x2048", 6.0 * T * H, [&](int) { cast(b, DType::kBF16); });
  }
  std::printf("%-44s %12s %10s\n", "op", "us", "GB/s");
  for (const Row& r : rows)
    std::printf("%-44s %12.1f %10.0f\n", r.op.c_str(), r.us, r.bytes / r.us / 1e3);
  std::printf("%zu passed, 0 failed, 0 skipped\n", rows.size());
  return true;
}

}  // namespace ops_basic_perf

bool perf_ops_basic() { return ops_basic_perf::run(); }

}  // namespace lockstep::gpu_test
