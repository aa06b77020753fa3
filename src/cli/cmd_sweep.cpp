// `lockstep sweep`: format sensitivity (CONTRACT.md section 9) of real or generated tensors:
// SNR, relative L2, MAE and the worst row for E2M1..E2M4 and E3M1..E5M1 with E4M3 / E8M0 scales.
#include <fmt/format.h>

#include <cmath>

#include "commands.h"
#include "lockstep/quant/simulate.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/file_io.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::cli {
namespace {

struct SweepArgs {
  std::string file, tensor, scaling = "per_tensor";
  int64_t rows = 256, cols = 4096;
  uint64_t seed = 0;
  bool json = false, dry_run = false;
  std::string run_meta;
};

// A metric for the report: "overflow" when the reconstruction overflowed to +-Inf (a format
// property, not an error of 0 or inf dB), undefined (JSON null) when ||x|| = 0, "inf" / "-inf",
// else the number.
Json metric_json(const std::optional<double>& v, int64_t overflow) {
  if (overflow > 0) return "overflow";
  if (!v) return nullptr;
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  return *v;
}

std::string metric_text(const std::optional<double>& v, int64_t overflow, const char* spec) {
  if (overflow > 0) return "overflow";
  if (!v) return "undefined";
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  return fmt::format(fmt::runtime(spec), *v);
}

void run_sweep(const SweepArgs& a) {
  auto outer = scaling_from_name(a.scaling);
  if (!outer || (*outer != Scaling::kPerTensor && *outer != Scaling::kPerRow))
    throw UsageError(
        fmt::format("--scaling '{}': the sweep takes per_tensor or per_row", a.scaling));
  struct Item {
    std::string name;
    std::vector<float> values;
    int64_t rows, cols;
  };
  check_output_paths({{"--run-meta", a.run_meta}});
  check_outputs_not_inputs({{"--run-meta", a.run_meta}}, {{"file", a.file}});
  if (dry_run(a.dry_run, a.file.empty() ? "sweep the generated tensor" : "sweep " + a.file)) return;
  std::vector<Item> items;
  std::string source;
  if (a.file.empty()) {
    if (a.rows <= 0 || a.cols <= 0 || a.cols % 16 != 0)
      throw UsageError(fmt::format("--rows {} --cols {}: need positive sizes and cols % 16 == 0",
                                   a.rows, a.cols));
    source = fmt::format(
        "generated heavy-tailed activation-like tensor [{}, {}] (Student-t, 3 d.o.f., 8 outlier "
        "channels x30, seed {}); "
        "pass a safetensors FILE to sweep real tensors",
        a.rows, a.cols, a.seed);
    items.push_back(
        {"generated", generate_activation_like(a.rows, a.cols, a.seed), a.rows, a.cols});
  } else {
    SafetensorsFile f = read_safetensors(a.file);
    source = a.file;
    for (const NamedTensor& nt : f.tensors) {
      if (!a.tensor.empty() && nt.name != a.tensor) continue;
      const Tensor& t = nt.tensor;
      bool floating =
          t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16;
      if (t.dim() != 2 || !floating || t.shape()[1] % 16 != 0) {
        if (!a.tensor.empty())
          throw UsageError(
              fmt::format("{}: tensor '{}' {} is not a 2-D F32/BF16/F16 tensor with cols % 16 == 0",
                          a.file, nt.name, t.describe()));
        continue;
      }
      items.push_back({nt.name, to_f32(t), t.shape()[0], t.shape()[1]});
    }
    if (items.empty())
      throw UsageError(
          a.tensor.empty()
              ? fmt::format("{}: no 2-D F32/BF16/F16 tensor with cols % 16 == 0 to sweep", a.file)
              : fmt::format("{}: no tensor named '{}'", a.file, a.tensor));
  }
  Json js{
      {"source", source}, {"outer_scaling", a.scaling}, {"block", 16}, {"tensors", Json::array()}};
  if (!a.json) fmt::print("source: {}\nblock 16, outer scaling {}\n", source, a.scaling);
  for (const Item& it : items) {
    const Tensor m = Tensor::from_vector<float>(it.values, {it.rows, it.cols}, DType::kF32);
    std::vector<SweepRow> rows = sweep(m, *outer, it.name);
    Json jr = Json::array();
    if (!a.json) {
      fmt::print("\n{} [{}, {}]\n", it.name, it.rows, it.cols);
      fmt::print("{:<11} {:>9} {:>11} {:>11} {:>10} {:>12}\n", "format", "SNR dB", "rel-L2", "MAE",
                 "worst row", "worst rel-L2");
    }
    for (const SweepRow& r : rows) {
      const ErrorMetrics& m = r.metrics;
      const int64_t worst_overflow = std::isinf(r.worst_row_rel_l2) ? 1 : 0;
      if (!a.json)
        fmt::print(
            "{:<11} {:>9} {:>11} {:>11} {:>10} {:>12}{}\n", r.format.name(),
            metric_text(m.snr_db, m.overflow, "{:.2f}"),
            metric_text(m.rel_l2, m.overflow, "{:.4e}"), metric_text(m.mae, m.overflow, "{:.4e}"),
            r.worst_row, metric_text(r.worst_row_rel_l2, worst_overflow, "{:.4e}"),
            m.overflow > 0 ? fmt::format("  ({} value(s) dequantize to +-Inf)", m.overflow) : "");
      jr.push_back(
          {{"format", fmt::format("E{}M{}", r.format.e_bits, r.format.m_bits)},
           {"scale", r.format.scale == ScaleKind::kE4M3 ? "E4M3" : "E8M0"},
           {"snr_db", metric_json(m.snr_db, m.overflow)},
           {"rel_l2", metric_json(m.rel_l2, m.overflow)},
           {"mae", metric_json(m.mae, m.overflow)},
           {"max_abs", metric_json(m.max_abs, m.overflow)},
           {"overflow", m.overflow},
           {"worst_row",
            {{"row", r.worst_row}, {"rel_l2", metric_json(r.worst_row_rel_l2, worst_overflow)}}}});
    }
    js["tensors"].push_back({{"name", it.name}, {"shape", {it.rows, it.cols}}, {"results", jr}});
  }
  if (a.json) fmt::print("{}\n", js.dump(2));
  if (!a.run_meta.empty()) {
    Json meta = provenance("sweep", "cpu", Json{{"source", source}, {"outer_scaling", a.scaling}},
                           Json::object(), {{"generated_tensor", a.seed}});
    meta["results"] = js;
    write_file_atomic(a.run_meta, meta.dump(2) + "\n");
  }
}

}  // namespace

void register_sweep_command(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  CLI::App* s = app.add_subcommand(
      "sweep",
      "Format sensitivity sweep: SNR dB, rel-L2, MAE and worst row for simulated E2M1..E2M4 and\n"
      "E3M1..E5M1 formats (blocks of 16, E4M3 and E8M0 scales). Without FILE, sweeps a generated\n"
      "heavy-tailed activation-like tensor.\n"
      "Example: lockstep sweep            (generated tensor)\n"
      "         lockstep sweep model.safetensors --tensor layers.0.mlp.up_proj.weight --json");
  s->add_option("file", a->file, "safetensors file (optional)");
  s->add_option("--tensor", a->tensor, "sweep only this tensor of FILE");
  s->add_option("--scaling", a->scaling,
                "outer scaling of the E4M3-scaled formats: per_tensor or per_row")
      ->capture_default_str();
  add_integer_option<int64_t>(*s, "--rows", a->rows, 1, int64_t(1) << 20,
                              "rows of the generated tensor");
  add_integer_option<int64_t>(*s, "--cols", a->cols, 16, int64_t(1) << 20,
                              "cols of the generated tensor (a multiple of 16)");
  add_unsigned_option(*s, "--seed", a->seed, UINT64_MAX,
                      "seed of the generated tensor (0 to 2^64 - 1)");
  s->add_flag("--json", a->json, "machine-readable output");
  s->add_option("--run-meta", a->run_meta,
                "write the results with their provenance (run_meta.json) to this file");
  s->add_flag("--dry-run", a->dry_run, "print the environment and the command; run nothing");
  s->callback([a] { run_sweep(*a); });
}

}  // namespace lockstep::cli
