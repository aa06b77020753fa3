// The end-to-end rows of `lockstep bench quantize --device cpu`: the whole `lockstep quantize`
// command (read, quantize, write, fsync) run as a child process on a generated bf16 file, its
// input GB/s against the memcpy bandwidth of the same threads measured in the same run, and its
// peak RSS against the input size (the child's, from wait4). It runs before anything else of the
// bench, so that the spawning process is small (a child's peak RSS starts from its parent's).
#include "bench_quantize_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "lockstep/tensor/safetensors.h"

extern char** environ;

namespace lockstep::cli {
namespace {

constexpr int64_t kCols = 4096, kMaxRows = 4096;  // tensors of up to 32 MiB of bf16

// Pseudo-normal bf16 (a sum of four uniform bytes, centred) for row r of tensor t.
void fill_row(uint16_t* row, uint64_t t, int64_t r) {
  uint64_t s = (t << 40) ^ uint64_t(r) ^ 0x9E3779B97F4A7C15ull;
  for (int64_t c = 0; c < kCols; ++c) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
    const int sum =
        int(s & 255) + int((s >> 8) & 255) + int((s >> 16) & 255) + int((s >> 24) & 255);
    const float v = float(sum - 510) * (1.0f / 147.0f);  // mean 0, standard deviation ~1
    uint32_t b;
    std::memcpy(&b, &v, 4);
    row[c] = uint16_t(b >> 16);  // truncation: any bf16 does
  }
}

// Writes `bytes` (rounded down to whole 16-row slabs) of bf16 tensors w.0, w.1, ... to `path`,
// one tensor in memory at a time.
void write_input(const std::string& path, uint64_t bytes) {
  const int64_t total_rows = std::max<int64_t>(16, int64_t(bytes / (kCols * 2)) / 16 * 16);
  std::vector<TensorSpec> specs;
  for (int64_t r = 0; r < total_rows; r += kMaxRows)
    specs.push_back({fmt::format("w.{}", specs.size()),
                     DType::kBF16,
                     {std::min(kMaxRows, total_rows - r), kCols}});
  SafetensorsStreamWriter w(specs, {}, path);
  AtomicFile out(path);
  w.start(out);
  std::vector<uint16_t> buf;
  for (size_t t = 0; t < specs.size(); ++t) {
    const int64_t rows = specs[t].shape[0];
    buf.resize(size_t(rows * kCols));
    for (int64_t r = 0; r < rows; ++r) fill_row(buf.data() + r * kCols, t, r);
    w.write(specs[t].name, std::as_bytes(std::span(buf)));
  }
  w.finish();
  out.commit();
}

// write_input in a forked child: a spawned command's peak RSS (ru_maxrss) starts from the peak of
// the process that spawns it, so this one must never hold the input's buffers. Called before
// this process starts any thread.
void write_input_in_child(const std::string& path, uint64_t bytes) {
  const pid_t pid = fork();
  if (pid < 0)
    throw std::runtime_error(fmt::format("bench: fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    int rc = 0;
    try {
      write_input(path, bytes);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lockstep: error: bench input %s: %s\n", path.c_str(), e.what());
      rc = 1;
    }
    std::_Exit(rc);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format("bench: writing the input {} failed", path));
}

// memcpy bandwidth (bytes copied per second) of `threads` threads over `bytes`-sized buffers,
// each thread a fixed contiguous share; the best of five.
double memcpy_gbps(uint64_t bytes, int threads) {
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes, std::byte{2});
  double best = 0;
  for (int it = 0; it < 5; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const uint64_t n = uint64_t(omp_get_num_threads()), i = uint64_t(omp_get_thread_num());
      const uint64_t lo = bytes * i / n, hi = bytes * (i + 1) / n;
      std::memcpy(b.data() + lo, a.data() + lo, hi - lo);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(bytes) / s * 1e-9);
  }
  return best;
}

struct ChildRun {
  double seconds = 0;
  int64_t peak_rss = 0;  // bytes
};

// Runs this executable with `args` and OMP_NUM_THREADS=threads, stdout to /dev/null.
ChildRun run_child(const std::vector<std::string>& args, int threads) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "OMP_NUM_THREADS=", 16) != 0) env.emplace_back(*e);
  env.push_back(fmt::format("OMP_NUM_THREADS={}", threads));
  std::vector<char*> argv, envp;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int err = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0)
    throw std::runtime_error(fmt::format("bench: cannot run {}: {}", exe, std::strerror(err)));
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) != pid)
    throw std::runtime_error(
        fmt::format("bench: waiting for {} failed: {}", exe, std::strerror(errno)));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string command = exe;
    for (const std::string& a : args) command.append(" ").append(a);
    throw std::runtime_error(fmt::format("bench: `{}` failed (status {})", command, status));
  }
  return {s, int64_t(ru.ru_maxrss) * 1024};
}

}  // namespace

std::vector<FileBenchRow> bench_quantize_file(const FileBenchOptions& o) {
  namespace fs = std::filesystem;
  const fs::path dir = o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir);
  const std::string tag = fmt::format("lockstep-bench-{}", getpid());
  const std::string in = (dir / (tag + ".in.safetensors")).string();
  const std::string out = (dir / (tag + ".out.safetensors")).string();
  struct Cleanup {
    std::string a, b;
    ~Cleanup() {
      std::error_code ec;
      fs::remove(a, ec), fs::remove(b, ec);
    }
  } cleanup{in, out};
  write_input_in_child(in, o.bytes);
  const uint64_t file_bytes = fs::file_size(in);
  struct Op {
    const char* name;
    std::vector<std::string> flags;
  };
  const std::vector<Op> ops = {
      {"quantize file nvfp4 per_tensor", {"--format", "nvfp4", "--scaling", "per_tensor"}},
      {"quantize file nvfp4 per_row", {"--format", "nvfp4", "--scaling", "per_row"}},
      {"quantize file nvfp4 2-D 16x16", {"--format", "nvfp4", "--block2d"}},
      {"quantize file mxfp8", {"--format", "mxfp8"}},
      {"quantize file fp8 per_row", {"--format", "fp8", "--scaling", "per_row"}},
      {"quantize file fp8 1x128", {"--format", "fp8", "--scaling", "block_1x128"}}};
  std::vector<FileBenchRow> rows;
  for (const Op& op : ops) {
    if (!o.filter.empty() && std::string(op.name).find(o.filter) == std::string::npos) continue;
    std::vector<std::string> args = {"quantize", in, "-o", out};
    args.insert(args.end(), op.flags.begin(), op.flags.end());
    std::vector<ChildRun> runs;
    for (int i = 0; i < o.runs + 1; ++i) runs.push_back(run_child(args, o.threads));  // 1 warm-up
    runs.erase(runs.begin());
    std::sort(runs.begin(), runs.end(),
              [](const ChildRun& x, const ChildRun& y) { return x.seconds < y.seconds; });
    FileBenchRow r;
    r.name = op.name;
    r.seconds = runs[runs.size() / 2].seconds;
    r.input_bytes = double(file_bytes);
    r.output_bytes = double(fs::file_size(out));
    r.gbps = r.input_bytes / r.seconds * 1e-9;
    for (const ChildRun& c : runs) r.peak_rss = std::max(r.peak_rss, double(c.peak_rss));
    r.rss_ratio = r.peak_rss / r.input_bytes;
    rows.push_back(r);
  }
  // memcpy last: a child's peak RSS counts the parent's resident pages at spawn, so the copy
  // buffers must not exist while the command runs.
  const double copy = memcpy_gbps(file_bytes, o.threads);
  for (FileBenchRow& r : rows) r.memcpy_gbps = copy, r.ratio = r.gbps / copy;
  return rows;
}

std::string format_file_bench(const std::vector<FileBenchRow>& rows) {
  std::string s = fmt::format("{:<34} {:>8} {:>9} {:>9} {:>10} {:>7} {:>6} {:>9} {:>7} {:>6}\n",
                              "op (whole command)", "s", "input MB", "GB/s in", "memcpy GB/s",
                              "x copy", "target", "peak MB", "x input", "target");
  for (const FileBenchRow& r : rows)
    s += fmt::format(
        "{:<34} {:>8.3f} {:>9.1f} {:>9.3f} {:>10.2f} {:>7.3f} {:>6} {:>9.1f} {:>7.2f} {:>6}\n",
        r.name, r.seconds, r.input_bytes / 1e6, r.gbps, r.memcpy_gbps, r.ratio,
        r.ratio >= kFileBenchTarget ? "ok" : "MISS", r.peak_rss / 1e6, r.rss_ratio,
        r.rss_ratio <= kFileBenchRssTarget ? "ok" : "MISS");
  return s;
}

}  // namespace lockstep::cli
