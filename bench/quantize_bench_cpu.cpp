// The CPU rows of `lockstep bench quantize` (a small shape: it keeps the benchmark code running on
// machines without a GPU), the table both devices print, and the CUDA entries' refusals in builds
// without CUDA.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>

#include "gemm_bench.h"
#include "lockstep/quant/quantize.h"
#include "quantize_bench.h"

namespace lockstep::bench {

std::vector<QuantBenchRow> bench_quantize_cpu(int64_t rows, int64_t cols,
                                              const std::string& filter) {
  std::vector<float> v(size_t(rows * cols));
  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  for (float& x : v) x = nd(rng);
  const Tensor m = Tensor::from_vector<float>(v, {rows, cols}, DType::kF32);
  std::vector<QuantBenchRow> out;
  auto add = [&](const std::string& name, QuantConfig s) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    QTensor q = quantize(m, s);  // warm-up, and the output size
    std::vector<double> us;
    for (int i = 0; i < 5; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      q = quantize(m, s);
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    QuantBenchRow r;
    r.name = name;
    r.us = us[2];
    r.bytes = double(v.size()) * 4 + qtensor_bytes(q);
    r.gbps = r.bytes / r.us * 1e-3;
    out.push_back(r);
  };
  QuantConfig s;
  s.format = Format::kNvfp4, s.scaling = Scaling::kPerRow;
  add("nvfp4 per_row (per-token)", s);
  s.scaling = Scaling::kPerTensor;
  add("nvfp4 per_tensor", s);
  s.colwise = true;
  add("nvfp4 per_tensor rowwise+columnwise", s);
  s.colwise = false;
  s.block2d = true;
  add("nvfp4 2-D 16x16 per_tensor", s);
  QuantConfig mx;
  mx.format = Format::kMxfp8, mx.scaling = Scaling::kBlock1x32;
  add("mxfp8 rowwise", mx);
  mx.colwise = true;
  add("mxfp8 rowwise+columnwise", mx);
  QuantConfig f;
  f.format = Format::kFp8, f.scaling = Scaling::kBlock1x128;
  add("fp8 1x128", f);
  f.colwise = true;
  add("fp8 1x128 rowwise+columnwise", f);
  f.colwise = false;
  f.scaling = Scaling::kBlock128x128;
  add("fp8 128x128", f);
  f.scaling = Scaling::kPerTensor;
  add("fp8 per_tensor", f);
  return out;
}

std::string format_quant_bench(const std::vector<QuantBenchRow>& rows) {
  std::string s = fmt::format("{:<64} {:>9} {:>9} {:>8} {:>7} {:>8} {:>7} {:>12}\n", "op", "us",
                              "MB moved", "GB/s", "x copy", "ceiling", "x ceil", "target");
  for (const QuantBenchRow& r : rows) {
    std::string target;
    if (r.target > 0) {
      const double got = r.two_read() ? r.of_ceiling() : r.ratio;
      target = fmt::format("{:.2f}{} {}", r.target, r.two_read() ? " ceil" : "",
                           got >= r.target ? "ok" : "MISS");
    }
    s += fmt::format("{:<64} {:>9.1f} {:>9.1f} {:>8.1f} {:>7} {:>8} {:>7} {:>12}\n", r.name, r.us,
                     r.bytes / 1e6, r.gbps, r.ratio > 0 ? fmt::format("{:.3f}", r.ratio) : "-",
                     r.two_read() ? fmt::format("{:.3f}", r.ceiling) : "-",
                     r.two_read() && r.ratio > 0 ? fmt::format("{:.3f}", r.of_ceiling()) : "-",
                     target);
  }
  return s;
}

#if !defined(LOCKSTEP_HAVE_CUDA)
std::vector<QuantBenchRow> bench_quantize_cuda(int64_t, int64_t, const std::string&, int) {
  throw std::runtime_error(
      "bench quantize --device cuda needs a CUDA build of lockstep (configure with "
      "-DLOCKSTEP_CUDA=ON)");
}
GemmBenchResult bench_gemm_cuda(const std::string&, bool, int) {
  throw std::runtime_error(
      "bench gemm needs a CUDA build of lockstep (configure with -DLOCKSTEP_CUDA=ON)");
}
#endif

}  // namespace lockstep::bench
