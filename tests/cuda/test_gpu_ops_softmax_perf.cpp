// lockstep_test_gpu --mode perf --op softmax|log_softmax|token_logprobs|router|sample: times of the
// softmax family on CUDA (median of CUDA-event samples after warm-up; "1 call": one call with its
// launches, "stream": 20 calls back to back, "graph": the same 20 calls recorded as one CUDA graph
// and replayed, so the host's part of a call is out of the figure as in a decode step's graph;
// "-" when a call cannot be recorded), with the bandwidth of one read of the input plus the writes
// (the least any kernel must move), for decode batches (1, 32, 256 rows of 151936) and the
// learner's 16384 x 151936 logits.
#include <fmt/format.h>

#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "lockstep/ops/tensor_ops.h"
#include "lockstep/tensor/graph.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {
namespace {

constexpr int64_t kVocab = 151936;

// A device tensor [rows, cols] of N(0, 2) values: 64 distinct host rows copied over the rest.
Tensor device_logits(int64_t rows, int64_t cols) {
  const int64_t block = std::min<int64_t>(rows, 64);
  std::mt19937_64 g(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(block * cols));
  for (float& x : v) x = nd(g);
  const Tensor src = to_gpu(Tensor::from_vector<float>(v, {block, cols}, DType::kF32));
  Tensor t = Tensor::empty(DType::kF32, {rows, cols}, gpu());
  for (int64_t r = 0; r < rows; r += block) {
    const int64_t n = std::min(block, rows - r);
    Tensor dst = t.slice_rows(r, r + n);
    dst.copy_from(src.slice_rows(0, n));
  }
  return t;
}

Tensor device_i32(int64_t n, int32_t mod) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 7919) % mod);
  return to_gpu(Tensor::from_vector<int32_t>(v, {n}, DType::kI32));
}

// Time per call of 20 calls of fn recorded as one CUDA graph and replayed; -1 when they cannot be
// recorded (a host copy or wait inside the call).
double graph_us(const std::function<void(int)>& fn) {
  constexpr int kCalls = 20;
  try {
    const OwnedStream s(gpu());
    DeviceGraph g;
    g.capture(gpu(), s.get(), [&] {
      for (int i = 0; i < kCalls; ++i) fn(i);
    });
    return bench::median_time_us([&](int) { g.replay(s.get()); }, 7, cuda::cu(s.get())) / kCalls;
  } catch (const std::exception&) {
    return -1;
  }
}

void line(const std::string& op, const std::string& shape, double bytes,
          const std::function<void(int)>& fn) {
  const double one = bench::median_time_us(fn, 15);
  const double stream = bench::median_time_us(fn, 7, nullptr, 20);
  const double graph = graph_us(fn);
  const std::string g = graph < 0 ? "-" : fmt::format("{:.1f} us", graph);
  std::printf("%-28s %-16s %10.1f us %10.1f us %13s %9.0f GB/s\n", op.c_str(), shape.c_str(), one,
              stream, g.c_str(), bytes / ((graph < 0 ? stream : graph) * 1e3));
}

}  // namespace

void perf_softmax_family() {
  std::printf("%-28s %-16s %13s %13s %13s %14s\n", "op", "shape", "1 call", "stream", "graph",
              "min bytes/t");
  for (const int64_t b : {int64_t(1), int64_t(32), int64_t(256)}) {
    const std::string shape = std::to_string(b) + "x" + std::to_string(kVocab);
    const Tensor x = device_logits(b, kVocab);
    const double n = double(b * kVocab);
    if (want("log_softmax")) line("log_softmax", shape, 8 * n, [&](int) { ops::log_softmax(x); });
    if (want("softmax")) line("softmax", shape, 8 * n, [&](int) { ops::softmax(x); });
    if (want("token_logprobs")) {
      const Tensor t = device_i32(b, int32_t(kVocab));
      line("token_logprobs", shape, 4 * n, [&](int) { ops::token_logprobs(x, t); });
    }
    if (want("sample")) {
      const Tensor s = device_i32(b, 1000), p = device_i32(b, 100000);
      const std::pair<const char*, ops::SampleConfig> cfgs[] = {
          {"sample greedy", {1.0, 1, 1.0, 1}},
          {"sample t=1", {1.0, 0, 1.0, 1}},
          {"sample top_p 0.9", {1.0, 0, 0.9, 1}},
          {"sample top_k 50", {1.0, 50, 1.0, 1}}};
      for (const auto& [name, cfg] : cfgs)
        line(name, shape, 4 * n, [&](int) { ops::sample_tokens(x, s, p, cfg); });
    }
  }
  if (want("token_logprobs")) {
    const int64_t T = 16384;
    const Tensor x = device_logits(T, kVocab), t = device_i32(T, int32_t(kVocab));
    const double n = double(T * kVocab);
    const std::string shape = std::to_string(T) + "x" + std::to_string(kVocab);
    line("token_logprobs", shape, 4 * n, [&](int) { ops::token_logprobs(x, t); });
    const ops::TokenLogprobs f = ops::token_logprobs(x, t);
    const Tensor dl =
        to_gpu(Tensor::from_vector<float>(std::vector<float>(size_t(T), 0.5f), {T}, DType::kF32));
    line("token_logprobs_backward", shape, 8 * n,
         [&](int) { ops::token_logprobs_backward(x, t, f, dl, dl); });
  }
  if (want("router")) {
    // Decode batches (1, 256 tokens: a warp per token) beside the learner's 16384.
    for (const int64_t T : {int64_t(1), int64_t(256), int64_t(16384)}) {
      const Tensor x = device_logits(T, 128);
      line("router_topk k8", std::to_string(T) + "x128", 4.0 * double(T) * 128 * 2,
           [&](int) { ops::router_topk(x, 8, true); });
    }
  }
}

}  // namespace lockstep::gpu_test
