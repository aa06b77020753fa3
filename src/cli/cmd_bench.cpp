// `lockstep bench quantize [--device cpu|cuda] [--json] [--rows R --cols C]`: bytes moved per
// second by each quantizer. CPU: a small default shape so it finishes in seconds. CUDA: a >= 256 MB
// bf16 input and the ratio to a device-to-device copy measured in the same run (bench/RESULTS.md).
#include "lockstep/version.h"
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "lockstep/tensor/device.h"
#include "lockstep/quant/quantize.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "lockstep/quant/quantize_cuda.h"
#endif

namespace lockstep::cli {
namespace {

struct BenchArgs {
  std::string device = "cpu";
  bool json = false;
  int64_t rows = 0, cols = 0;
  std::string filter;
};

struct Row {
  std::string name;
  double us, bytes, gbps, ratio, target;
};

double q_bytes(const QTensor& q) {
  double b = 0;
  for (const QData* d : {&q.rowwise, &q.colwise})
    for (const Tensor* t : {&d->data, &d->block_scale, &d->amax, &d->scale_inv})
      if (t->defined()) b += double(t->nbytes());
  return b;
}

std::vector<Row> bench_cpu(int64_t rows, int64_t cols, const std::string& filter) {
  std::vector<float> v(size_t(rows * cols));
  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  for (float& x : v) x = nd(rng);
  const Tensor m = Tensor::from_vector<float>(v, {rows, cols}, DType::kF32);
  std::vector<Row> out;
  auto add = [&](const std::string& name, QuantConfig s) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    QTensor q = quantize(m, s);  // warm-up, and the output size
    std::vector<double> us;
    for (int i = 0; i < 5; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      q = quantize(m, s);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    const double bytes = double(v.size()) * 4 + q_bytes(q);
    out.push_back(Row{name, us[2], bytes, bytes / us[2] * 1e-3, 0, 0});
  };
  QuantConfig s;
  s.format = Format::kNvfp4, s.scaling = Scaling::kPerRow;
  add("nvfp4 per_row (per-token)", s);
  s.scaling = Scaling::kPerTensor;
  add("nvfp4 per_tensor", s);
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
  f.scaling = Scaling::kBlock128x128;
  add("fp8 128x128", f);
  f.scaling = Scaling::kPerTensor;
  add("fp8 per_tensor", f);
  return out;
}

void run_bench_quantize(const BenchArgs& a) {
  const auto dev = parse_device(a.device);
  if (!dev) throw UsageError(fmt::format("--device must be cpu or cuda, got '{}'", a.device));
  std::vector<Row> rows;
  int64_t r = a.rows, c = a.cols;
  std::string gpu;
  if (dev->is_cpu()) {
    if (r == 0) r = 1024;
    if (c == 0) c = 2048;
    rows = bench_cpu(r, c, a.filter);
  } else {
    require_device(*dev);
#if defined(LOCKSTEP_HAVE_CUDA)
    if (r == 0) r = 16384;
    if (c == 0) c = 8192;
    for (const auto& b : cuda::bench_quantize_cuda(r, c, a.filter)) rows.push_back(Row{b.name, b.us, b.bytes, b.gbps, b.ratio, b.target});
    DeviceReport rep = query_devices();
    if (!rep.gpus.empty()) gpu = rep.gpus[0].name;
#endif
  }
  if (a.json) {
    nlohmann::json j;
    j["device"] = a.device;
    j["gpu"] = gpu;
    j["rows"] = r;
    j["cols"] = c;
    j["input_dtype"] = dev->is_cpu() ? "f32" : "bf16";
    j["revision"] = lockstep_source_revision();
    for (const Row& x : rows)
      j["results"].push_back({{"op", x.name}, {"us", x.us}, {"bytes", x.bytes}, {"gbps", x.gbps}, {"ratio_to_copy", x.ratio},
                              {"target_ratio", x.target}, {"meets_target", x.target == 0 || x.ratio >= x.target}});
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("lockstep bench quantize --device {} ({} x {} {}{})\n", a.device, r, c, dev->is_cpu() ? "f32" : "bf16",
             gpu.empty() ? "" : ", " + gpu);
  fmt::print("{:<60} {:>10} {:>10} {:>9} {:>8} {:>7}\n", "op", "us", "MB moved", "GB/s", "x copy", "target");
  for (const Row& x : rows)
    fmt::print("{:<60} {:>10.1f} {:>10.1f} {:>9.1f} {:>8} {:>7}\n", x.name, x.us, x.bytes / 1e6, x.gbps,
               x.ratio > 0 ? fmt::format("{:.3f}", x.ratio) : "-",
               x.target > 0 ? fmt::format("{:.2f}{}", x.target, x.ratio >= x.target ? " ok" : " MISS") : "");
}

}  // namespace

void register_bench_commands(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (bytes moved per second)");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  CLI::App* q = bench->add_subcommand(
      "quantize",
      "Every quantizer's bandwidth; on CUDA also the ratio to a device-to-device copy of the same input.\n"
      "Example: lockstep bench quantize --device cuda --json");
  q->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  q->add_flag("--json", a->json, "machine-readable output");
  q->add_option("--rows", a->rows, "input rows (default: cpu 1024, cuda 16384)");
  q->add_option("--cols", a->cols, "input columns (default: cpu 2048, cuda 8192)");
  q->add_option("--only", a->filter, "run only the ops whose name contains this text");
  q->callback([a] { run_bench_quantize(*a); });
  register_bench_gemm_command(*bench);  // bench gemm (cmd_bench_gemm.cpp)
  register_bench_model_command(*bench);  // bench model (cmd_bench_model.cpp)
}

}  // namespace lockstep::cli
