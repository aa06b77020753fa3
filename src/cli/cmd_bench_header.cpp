// `lockstep bench safetensors-header [--tensors N]...`: the time to parse and validate the header
// of a big checkpoint (a generated MoE-style header with N tensors, parse only, no tensor data),
// so that the parser's linear time is measured where the suite and bench/RESULTS.md can reach it.
#include <fmt/format.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/safetensors.h"
#include "lockstep/version.h"

namespace lockstep::cli {
namespace {

struct HeaderBenchArgs {
  std::vector<int64_t> tensors{40000, 400000};
  int64_t runs = 3;
  bool json = false;
};

// An MoE checkpoint's header: per layer 128 experts x 3 projections (BF16 [64, 32] or [32, 64])
// plus attention and norm tensors, named as Hugging Face Qwen3-MoE names them, laid out in order.
// Returns the 8-byte length + the JSON header, and the file size the header implies.
std::pair<std::vector<std::byte>, uint64_t> moe_header(int64_t n) {
  std::string text = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t offset = 0;
  int64_t made = 0;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols) {
    const uint64_t bytes = uint64_t(rows * cols * 2);
    text += fmt::format(",\"{}\":{{\"dtype\":\"BF16\",\"shape\":[{},{}],\"data_offsets\":[{},{}]}}",
                        name, rows, cols, offset, offset + bytes);
    offset += bytes;
    ++made;
  };
  for (int64_t layer = 0; made < n; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    for (const char* w : {"q_proj", "k_proj", "v_proj", "o_proj"})
      if (made < n) add(p + "self_attn." + w + ".weight", 32, 32);
    for (const char* w : {"input_layernorm", "post_attention_layernorm"})
      if (made < n) add(p + w + ".weight", 1, 32);
    for (int64_t e = 0; e < 128 && made < n; ++e)
      for (const char* w : {"gate_proj", "up_proj", "down_proj"})
        if (made < n)
          add(fmt::format("{}mlp.experts.{}.{}.weight", p, e, w), w[0] == 'd' ? 32 : 64,
              w[0] == 'd' ? 64 : 32);
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size());
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = std::byte(uint8_t(len >> (8 * i)));
  std::memcpy(out.data() + 8, text.data(), text.size());
  return {std::move(out), 8 + len + offset};
}

struct HeaderBenchRow {
  int64_t tensors = 0;
  uint64_t header_bytes = 0;
  double seconds = 0;      // median wall time of a parse
  double cpu_seconds = 0;  // median CPU time of the parsing thread (what a shared machine's load
                           // does not inflate)
};

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

void run_bench_header(const HeaderBenchArgs& a) {
  std::vector<HeaderBenchRow> rows;
  for (const int64_t n : a.tensors) {
    const auto [prefix, file_size] = moe_header(n);
    std::vector<double> times, cpu;
    for (int64_t r = 0; r < a.runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu_seconds();
      const SafetensorsHeader h = parse_safetensors_header(prefix, file_size, "generated header");
      cpu.push_back(thread_cpu_seconds() - c0);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (int64_t(h.tensors.size()) != n)
        throw std::logic_error(fmt::format("parsed {} tensors, generated {}", h.tensors.size(), n));
    }
    std::sort(times.begin(), times.end());
    std::sort(cpu.begin(), cpu.end());
    rows.push_back({n, prefix.size() - 8, times[times.size() / 2], cpu[cpu.size() / 2]});
  }
  double load = -1;  // the machine's 1-minute load average after the run (shared machines)
  getloadavg(&load, 1);
  if (a.json) {
    Json j;
    j["revision"] = lockstep_source_revision();
    j["runs"] = a.runs;
    j["load_average_1min"] = load;
    j["results"] = Json::array();
    for (const HeaderBenchRow& r : rows)
      j["results"].push_back({{"tensors", r.tensors},
                              {"header_bytes", r.header_bytes},
                              {"seconds", r.seconds},
                              {"cpu_seconds", r.cpu_seconds},
                              {"us_per_tensor", r.seconds * 1e6 / double(r.tensors)}});
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "lockstep bench safetensors-header: parse + validate a generated MoE header (no data), "
      "median of {} run(s), load average {:.2f}\n",
      a.runs, load);
  fmt::print("{:>10}  {:>14}  {:>10}  {:>12}  {:>12}\n", "tensors", "header bytes", "seconds",
             "cpu seconds", "us / tensor");
  for (const HeaderBenchRow& r : rows)
    fmt::print("{:>10}  {:>14}  {:>10.3f}  {:>12.3f}  {:>12.2f}\n", r.tensors, r.header_bytes,
               r.seconds, r.cpu_seconds, r.seconds * 1e6 / double(r.tensors));
}

}  // namespace

void register_bench_header_command(CLI::App& bench) {
  auto a = std::make_shared<HeaderBenchArgs>();
  CLI::App* c = bench.add_subcommand(
      "safetensors-header",
      "Time to parse and validate the header of a checkpoint with many tensors (a generated\n"
      "Qwen3-MoE-style header, parse only, no tensor data); linear in the tensor count.\n"
      "Example: lockstep bench safetensors-header --tensors 40000 --tensors 400000");
  c->add_option_function<std::vector<std::string>>(
       "--tensors",
       [a](const std::vector<std::string>& v) {
         a->tensors.clear();
         for (const std::string& s : v)
           a->tensors.push_back(int64_t(parse_unsigned(s, "--tensors", 4000000)));
         for (int64_t n : a->tensors)
           if (n < 1) throw UsageError("--tensors: expected at least 1 tensor");
       },
       "tensors in a header (repeat for several; default 40000 and 400000)")
      ->type_name("N");
  add_integer_option(*c, "--runs", a->runs, int64_t(1), int64_t(100),
                     "timed parses per size (median)");
  c->add_flag("--json", a->json, "machine-readable output");
  c->callback([a] { run_bench_header(*a); });
}

}  // namespace lockstep::cli
