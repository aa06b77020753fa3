// `lockstep bench gemm [--json] [--only TEXT] [--quick]`: the CUDA GEMMs' bandwidth (decode, MoE
// decode) and TFLOP/s (dense, grouped) with cuBLAS bf16 baselines and the device copy bandwidth
// measured in the same run (bench/RESULTS.md, GEMM). Registered under `bench` by cmd_bench.cpp.
#include <fmt/format.h>

#include "commands.h"
#include "gemm_bench.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/device.h"
#include "lockstep/version.h"

namespace lockstep::cli {
namespace {

struct BenchGemmArgs {
  bool json = false, quick = false;
  std::string filter;
  int iters = 30;
};

void run_bench_gemm(const BenchGemmArgs& a) {
  require_device(Device::cuda());  // throws with a message in builds or machines without CUDA
  const bench::GemmBenchResult r = bench::bench_gemm_cuda(a.filter, a.quick, a.iters);
  if (a.json) {
    Json j;
    j["gpu"] = r.gpu;
    j["revision"] = lockstep_source_revision();
    j["copy_gbps"] = r.copy_gbps;
    j["cublas"] = r.have_cublas;
    j["results"] = Json::array();
    for (const auto& x : r.rows) {
      const double got = x.target_is_copy ? x.ratio_copy : x.ratio_baseline;
      j["results"].push_back({{"section", x.section},
                              {"op", x.name},
                              {"us", x.us},
                              {"bytes", x.bytes},
                              {"gbps", x.gbps},
                              {"ratio_to_copy", x.ratio_copy},
                              {"tflops", x.tflops},
                              {"baseline_us", x.baseline_us},
                              {"ratio_to_baseline", x.ratio_baseline},
                              {"target", x.target},
                              {"target_of", x.target_is_copy ? "copy" : "baseline"},
                              {"meets_target", x.target == 0 || got >= x.target}});
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("lockstep bench gemm ({}, copy {:.0f} GB/s, cuBLAS bf16 baseline {})\n", r.gpu,
             r.copy_gbps, r.have_cublas ? "loaded" : "MISSING");
  fmt::print("{:<11} {:<62} {:>9} {:>8} {:>7} {:>8} {:>9} {:>8} {:>11}\n", "section", "op", "us",
             "GB/s", "x copy", "TFLOP/s", "bf16 us", "x bf16", "target");
  for (const auto& x : r.rows) {
    const double got = x.target_is_copy ? x.ratio_copy : x.ratio_baseline;
    fmt::print("{:<11} {:<62} {:>9.1f} {:>8.0f} {:>7} {:>8.1f} {:>9} {:>8} {:>11}\n", x.section,
               x.name, x.us, x.gbps, x.ratio_copy > 0 ? fmt::format("{:.3f}", x.ratio_copy) : "-",
               x.tflops, x.baseline_us > 0 ? fmt::format("{:.1f}", x.baseline_us) : "-",
               x.ratio_baseline > 0 ? fmt::format("{:.3f}", x.ratio_baseline) : "-",
               x.target > 0 ? fmt::format("{:.2f}{} {}", x.target, x.target_is_copy ? "c" : "b",
                                          got >= x.target ? "ok" : "MISS")
                            : "");
  }
}

}  // namespace

void register_bench_gemm_command(CLI::App& bench) {
  auto a = std::make_shared<BenchGemmArgs>();
  CLI::App* g =
      bench.add_subcommand("gemm",
                           "CUDA quantized GEMMs: decode bandwidth vs device copy and cuBLAS bf16, "
                           "MoE decode, dense and grouped\n"
                           "large-M TFLOP/s vs cuBLAS bf16, all measured in the same run.\n"
                           "Example: lockstep bench gemm --json > gemm.json");
  g->add_flag("--json", a->json, "machine-readable output");
  g->add_flag("--quick", a->quick, "fewer, smaller shapes (smoke run)");
  g->add_option("--only", a->filter, "run only the rows whose section or name contains this text");
  add_integer_option(*g, "--iters", a->iters, 1, 1'000'000, "timed iterations per row (median)");
  g->callback([a] { run_bench_gemm(*a); });
}

}  // namespace lockstep::cli
