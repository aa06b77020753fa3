// `lockstep bench sync`: convert + sync per policy version where learner and sampler share one
// device: export_policy of the F32 masters (quantized once by the recipe, checksum stamped) and
// Sampler::load_policy (checksum verified where the bytes live, decoder weights in place), timed
// per recipe with the ratio to bf16 and the targets (NVFP4 <= 0.5x, MXFP8 and FP8 block
// <= 0.75x). Warm-up versions are excluded; each figure is the median of --reps versions.
// A recipe whose weights take an outer amax (NVFP4 per_tensor / per_group) is timed as the trainer
// runs it: the amax of each weight (per expert where the recipe says so) comes from the AdamW step
// that wrote it (an update with lr 0 here, untimed, leaving the masters as they are), so the export
// reads each master once; the export that reads the masters for their amax is timed beside it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "commands.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/ops/tensor_ops.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/storage.h"

namespace lockstep::cli {
namespace {

struct BenchSyncArgs {
  std::vector<std::string> presets{"gpu-moe", "qwen3-30b-a3b-4l"};
  std::vector<std::string> recipes{"bf16", "nvfp4_per_token", "nvfp4_per_tensor", "mxfp8",
                                   "fp8_block"};
  int reps = 7, warmup = 2;
  std::string device = "auto";
  bool json = false;
};

struct SyncRow {
  std::string preset, recipe;
  double total_ms = 0, export_ms = 0, load_ms = 0;  // medians
  double export_read_amax_ms = 0;  // the export reading the amax (recipes that take one; else 0)
  double policy_mb = 0, master_mb = 0;
  double d2h_per_version = 0;  // device-to-host copies per version (0 on the CPU)
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The target ratio to bf16 a recipe's weight format has (0: none).
double target_ratio(const Recipe& r) {
  switch (r.linear[Gemm::kFprop].b.format) {
    case Format::kNvfp4:
      return 0.5;
    case Format::kMxfp8:
    case Format::kFp8:
      return 0.75;
    default:
      return 0.0;
  }
}

void run_bench_sync(const BenchSyncArgs& a) {
  const Device dev = device_flag(a.device);
  std::vector<SyncRow> rows;
  int64_t version = 0;
  for (const std::string& pname : a.presets) {
    const model::ModelConfig cfg = model::preset(pname);
    model::ModelWeights w = model::init_weights(cfg, 0);
    double master = 0;
    for (auto& [name, t] : w.tensors) {
      t = t.to(dev);
      master += double(t.nbytes());
    }
    synchronize(dev);
    for (const std::string& rname : a.recipes) {
      const Recipe& recipe = builtin_recipe_or_throw(rname, "--recipe").recipe;
      // The optimizer's amax: one AdamW update with lr 0 (masters unchanged) per weight that takes
      // one, with the converter's domain count.
      model::WeightAmax amax;
      for (const auto& [name, domains] : model::weight_amax_domain_counts(cfg, recipe)) {
        Tensor& p = w.tensors.at(name);
        Tensor g = Tensor(DType::kF32, p.shape(), dev), m1 = g.clone(), v1 = g.clone();
        ops::AdamWConfig zero;
        zero.lr = 0.0;
        zero.weight_decay = 0.0;
        ops::adamw_step(p, g, m1, v1, zero, 1, 1.0, &amax[name], domains);
      }
      synchronize(dev);
      const model::WeightAmax* given = amax.empty() ? nullptr : &amax;
      model::SamplerConfig sc;
      sc.device = dev;
      model::Sampler sampler(sc);
      std::vector<double> total, exp, load, read;
      SyncRow r{pname, rname};
      r.master_mb = master * 1e-6;
      const int64_t d2h0 = device_to_host_copies();
      for (int i = 0; i < a.warmup + a.reps; ++i) {
        const int64_t v = ++version;
        const auto t0 = std::chrono::steady_clock::now();
        model::PolicyVersion p = model::export_policy(w, recipe, v, {}, given);
        synchronize(dev);
        const double t_exp = ms_since(t0);
        if (given) {
          const auto tr = std::chrono::steady_clock::now();
          model::PolicyVersion q = model::export_policy(w, recipe, v);
          synchronize(dev);
          if (i >= a.warmup) read.push_back(ms_since(tr));
          if (q.checksum != p.checksum)
            throw std::runtime_error(fmt::format(
                "bench sync {} {}: the export with the optimizer's amax differs from the export "
                "that reads it (checksums {:016x} and {:016x})",
                pname, rname, p.checksum, q.checksum));
        }
        r.policy_mb = double(p.nbytes()) * 1e-6;
        const auto t1 = std::chrono::steady_clock::now();
        sampler.load_policy(std::move(p), v, recipe.name);
        synchronize(dev);
        if (i < a.warmup) continue;
        const double t_load = ms_since(t1);
        load.push_back(t_load);
        exp.push_back(t_exp);
        total.push_back(t_exp + t_load);
      }
      r.total_ms = median(total);
      r.export_ms = median(exp);
      r.load_ms = median(load);
      r.export_read_amax_ms = read.empty() ? 0.0 : median(read);
      r.d2h_per_version = double(device_to_host_copies() - d2h0) / double(a.warmup + a.reps);
      rows.push_back(r);
      fmt::print(stderr, "bench sync {} {}: {:.2f} ms per version\n", pname, rname, r.total_ms);
    }
  }
  auto bf16_ms = [&](const SyncRow& r) {
    for (const SyncRow& b : rows)
      if (b.preset == r.preset && b.recipe == "bf16") return b.total_ms;
    return 0.0;
  };
  auto verdict = [&](const SyncRow& r, double ratio) -> std::string {
    const double t = target_ratio(builtin_recipe_or_throw(r.recipe, "--recipe").recipe);
    if (t == 0 || ratio == 0) return "-";
    return fmt::format("{} (<= {:.2f})", ratio <= t ? "met" : "missed", t);
  };
  if (a.json) {
    Json j{
        {"device", dev.str()}, {"reps", a.reps}, {"warmup", a.warmup}, {"results", Json::array()}};
    for (const SyncRow& r : rows) {
      const double b = bf16_ms(r), ratio = b > 0 ? r.total_ms / b : 0.0;
      j["results"].push_back(
          {{"preset", r.preset},
           {"recipe", r.recipe},
           {"convert_sync_ms", r.total_ms},
           {"export_ms", r.export_ms},
           {"load_ms", r.load_ms},
           {"optimizer_amax", r.export_read_amax_ms > 0},
           {"export_read_amax_ms", r.export_read_amax_ms},
           {"ratio_to_bf16", ratio},
           {"target_ratio", target_ratio(builtin_recipe_or_throw(r.recipe, "r").recipe)},
           {"target_met", verdict(r, ratio).starts_with("met")},
           {"policy_mb", r.policy_mb},
           {"master_mb", r.master_mb},
           {"device_to_host_copies_per_version", r.d2h_per_version}});
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "lockstep bench sync ({}; export_policy + Sampler::load_policy per version, median of {} "
      "after {} warm-up)\n",
      dev.str(), a.reps, a.warmup);
  fmt::print("{:<18} {:<17} {:>10} {:>10} {:>9} {:>9} {:>10} {:>6} {:<16} {}\n", "preset", "recipe",
             "total ms", "export ms", "load ms", "x bf16", "policy MB", "d2h", "target",
             "export ms reading the amax");
  for (const SyncRow& r : rows) {
    const double b = bf16_ms(r), ratio = b > 0 ? r.total_ms / b : 0.0;
    fmt::print("{:<18} {:<17} {:>10.2f} {:>10.2f} {:>9.2f} {:>9.2f} {:>10.1f} {:>6.1f} {:<16} {}\n",
               r.preset, r.recipe, r.total_ms, r.export_ms, r.load_ms, ratio, r.policy_mb,
               r.d2h_per_version, verdict(r, ratio),
               r.export_read_amax_ms > 0 ? fmt::format("{:.2f}", r.export_read_amax_ms) : "-");
  }
}

}  // namespace

void register_bench_sync_command(CLI::App& bench) {
  auto a = std::make_shared<BenchSyncArgs>();
  CLI::App* c = bench.add_subcommand(
      "sync",
      "Convert + sync per policy version (export_policy + load_policy) per recipe, ratio to bf16\n"
      "Example: lockstep bench sync --device cuda --preset gpu-moe --json");
  c->add_option("--preset", a->presets, "presets to run (default gpu-moe qwen3-30b-a3b-4l)");
  c->add_option("--recipe", a->recipes,
                "recipes to run (default bf16 nvfp4_per_token nvfp4_per_tensor mxfp8 fp8_block; "
                "bf16 is the ratio's denominator)");
  add_integer_option(*c, "--reps", a->reps, 1, 1'000'000, "timed versions (median)");
  add_integer_option(*c, "--warmup", a->warmup, 0, 1'000'000, "untimed versions first");
  c->add_flag("--json", a->json, "print JSON");
  add_device_option(*c, a->device);
  c->callback([a] { run_bench_sync(*a); });
}

}  // namespace lockstep::cli
