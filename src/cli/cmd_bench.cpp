// `lockstep bench quantize [--device cpu|cuda] [--json] [--rows R --cols C]`: bytes moved per
// second by each quantizer. CPU: a small default shape so it finishes in seconds. CUDA: a >= 256 MB
// bf16 input and the ratio to a device-to-device copy measured in the same run (bench/RESULTS.md).
#include <fmt/format.h>
#include <omp.h>
#include <stdlib.h>

#include "bench_quantize_file.h"
#include "commands.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/device.h"
#include "lockstep/version.h"
#include "quantize_bench.h"

namespace lockstep::cli {
namespace {

struct BenchArgs {
  std::string device = "cpu";
  bool json = false;
  int64_t rows = 0, cols = 0;
  std::string filter;
  double file_mb = 256;  // cpu: size of the end-to-end input file
  int threads = 0, runs = 3;
  std::string dir;
};

void run_bench_quantize(const BenchArgs& a) {
  const auto dev = parse_device(a.device);
  if (!dev) throw UsageError(fmt::format("--device must be cpu or cuda, got '{}'", a.device));
  std::vector<bench::QuantBenchRow> rows;
  FileBenchOptions file;
  std::vector<FileBenchRow> file_rows;
  int64_t r = a.rows, c = a.cols;
  std::string gpu;
  if (dev->is_cpu()) {
    if (r == 0) r = 1024;
    if (c == 0) c = 2048;
    if (!(a.file_mb >= 1 && a.file_mb <= 1 << 20))
      throw UsageError(fmt::format("--file-mb {}: expected 1 to {}", a.file_mb, 1 << 20));
    if (a.threads < 0 || a.runs < 1) throw UsageError("--threads must be >= 0 and --runs >= 1");
    file.bytes = uint64_t(a.file_mb * (1 << 20));
    file.threads = a.threads > 0 ? a.threads : omp_get_max_threads();
    file.runs = a.runs, file.dir = a.dir, file.filter = a.filter;
    file_rows = bench_quantize_file(file);  // first: the spawning process must still be small
    rows = bench::bench_quantize_cpu(r, c, a.filter);
  } else {
    require_device(*dev);
    if (r == 0) r = 16384;
    if (c == 0) c = 8192;
    rows = bench::bench_quantize_cuda(r, c, a.filter);
    DeviceReport rep = query_devices();
    if (!rep.gpus.empty()) gpu = rep.gpus[0].name;
  }
  double load = -1;  // the machine's 1-minute load average after the run (shared machines)
  getloadavg(&load, 1);
  if (a.json) {
    Json j;
    j["device"] = a.device;
    j["gpu"] = gpu;
    j["rows"] = r;
    j["cols"] = c;
    j["input_dtype"] = dev->is_cpu() ? "f32" : "bf16";
    j["revision"] = lockstep_source_revision();
    j["results"] = Json::array();
    for (const auto& x : rows) {
      const double got = x.two_read() ? x.of_ceiling() : x.ratio;
      j["results"].push_back({{"op", x.name},
                              {"us", x.us},
                              {"bytes", x.bytes},
                              {"gbps", x.gbps},
                              {"ratio_to_copy", x.ratio},
                              {"two_read", x.two_read()},
                              {"ceiling", x.ceiling},
                              {"ratio_to_ceiling", x.two_read() ? x.of_ceiling() : x.ratio},
                              {"target", x.target},
                              {"target_of", x.two_read() ? "ceiling" : "copy"},
                              {"meets_target", x.target == 0 || got >= x.target}});
    }
    j["end_to_end"] = Json::array();
    for (const FileBenchRow& x : file_rows)
      j["end_to_end"].push_back({{"op", x.name},
                                 {"seconds", x.seconds},
                                 {"input_bytes", x.input_bytes},
                                 {"output_bytes", x.output_bytes},
                                 {"gbps_input", x.gbps},
                                 {"memcpy_gbps", x.memcpy_gbps},
                                 {"ratio_to_memcpy", x.ratio},
                                 {"target", kFileBenchTarget},
                                 {"peak_rss_bytes", x.peak_rss},
                                 {"peak_rss_over_input", x.rss_ratio},
                                 {"rss_target", kFileBenchRssTarget},
                                 {"threads", file.threads},
                                 {"load_average_1min", load}});
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("lockstep bench quantize --device {} ({} x {} {}{})\n", a.device, r, c,
             dev->is_cpu() ? "f32" : "bf16", gpu.empty() ? "" : ", " + gpu);
  fmt::print("{}", bench::format_quant_bench(rows));
  if (file_rows.empty()) return;
  fmt::print(
      "\nend to end: `lockstep quantize` as a child process on a {:.0f} MB bf16 file (in the page "
      "cache), {} thread(s), median of {} run(s); memcpy on the same threads; load average "
      "{:.2f}\n",
      file_rows[0].input_bytes / 1e6, file.threads, file.runs, load);
  fmt::print("{}", format_file_bench(file_rows));
}

}  // namespace

void register_bench_commands(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (bytes moved per second)");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  CLI::App* q =
      bench->add_subcommand("quantize",
                            "Every quantizer's bandwidth; on CUDA also the ratio to a "
                            "device-to-device copy of the same input; on the CPU also\n"
                            "the whole `lockstep quantize` command on a bf16 file against "
                            "memcpy, and its peak memory.\n"
                            "Example: lockstep bench quantize --device cpu --file-mb 256 "
                            "--threads 2");
  q->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  q->add_flag("--json", a->json, "machine-readable output");
  add_integer_option<int64_t>(*q, "--rows", a->rows, 1, int64_t(1) << 24,
                              "input rows (default: cpu 1024, cuda 16384)");
  add_integer_option<int64_t>(*q, "--cols", a->cols, 1, int64_t(1) << 24,
                              "input columns (default: cpu 2048, cuda 8192)");
  q->add_option("--only", a->filter, "run only the ops whose name contains this text");
  add_real_option(
      *q, "--file-mb", a->file_mb, 1.0, double(1 << 20), false,
      "cpu: size in MiB of the bf16 file the whole `lockstep quantize` command is timed on");
  add_integer_option(*q, "--threads", a->threads, 0, 4096,
                     "cpu: threads of the timed command and of memcpy (0: all)");
  add_integer_option(*q, "--runs", a->runs, 1, 1000,
                     "cpu: timed runs of the command (median; after one warm-up)");
  q->add_option("--dir", a->dir,
                "cpu: folder for the generated input and the output (default: temp)");
  q->callback([a] { run_bench_quantize(*a); });
  register_bench_gemm_command(*bench);    // bench gemm (cmd_bench_gemm.cpp)
  register_bench_header_command(*bench);  // bench safetensors-header (cmd_bench_header.cpp)
  register_bench_model_command(*bench);   // bench model (cmd_bench_model.cpp)
  register_bench_sync_command(*bench);    // bench sync (cmd_bench_sync.cpp)
}

}  // namespace lockstep::cli
