// `lockstep export` and `lockstep convert`: a policy (a model with a recipe, or a training run's
// checkpoint) or a bf16 checkpoint streamed from disk, written as a Hugging Face model directory
// in a serving stack's format (convert/export.h, docs/export.md).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "lockstep/convert/export.h"
#include "lockstep/diag/progress.h"
#include "lockstep/model/learner.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/rl/trainer.h"
#include "model_cli.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;
using json = Json;

struct ExportArgs {
  std::string model_dir, run_dir, format, output;
  std::optional<int64_t> version;
  SelectionInputs recipe;
  bool fuse_scales = true, weights_only = false, json = false;
  std::optional<float> input_amax;
  uint64_t max_shard_bytes = 5'000'000'000;
};

void add_export_options(CLI::App& c, ExportArgs& a) {
  c.add_option("--format", a.format, "output format: " + convert::hf_format_names())->required();
  c.add_option("-o,--output", a.output, "output model directory (must not exist)")->required();
  c.add_flag("--fuse-scales,!--no-fuse-scales", a.fuse_scales,
             "q, k and v share one NVFP4 outer scale (default; the learner's bytes, what fused "
             "QKV layers read); --no-fuse-scales gives each projection its own");
  c.add_flag("--weights-only", a.weights_only,
             "declare the weights alone (NVFP4: W4A16_NVFP4 / nvfp4a16), whatever the recipe "
             "does to activations");
  c.add_option("--input-amax", a.input_amax,
               "NVFP4 with quantized activations: the activation amax the static input scale "
               "stands for (lockstep's activation scales are dynamic)");
  add_unsigned_option(c, "--max-shard-bytes", a.max_shard_bytes, uint64_t(1) << 50,
                      "tensor bytes per safetensors shard");
  c.add_flag("--json", a.json, "print a JSON summary");
}

convert::HfExportOptions export_options(const ExportArgs& a) {
  convert::HfExportOptions o;
  o.format = convert::hf_format_or_throw(a.format);
  o.convert.fuse_scales = a.fuse_scales;
  o.weights_only = a.weights_only;
  o.input_amax = a.input_amax;
  o.max_shard_bytes = a.max_shard_bytes;
  return o;
}

// A progress bar over lockstep tensors (a step is one lockstep tensor converted and written),
// shown once the work has taken more than two seconds.
struct TensorProgress {
  std::optional<diag::ProgressDisplay> display;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  void operator()(int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!display && s < 2.0) return;
    if (!display)
      display.emplace(diag::ProgressDisplay::for_stderr({std::max<int64_t>(1, total / 10), 20}));
    display->update({done, total, s, std::nullopt, std::nullopt, std::nullopt});
    if (done == total) display->finish();
  }
};

json export_read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return nullptr;
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("{}: not JSON ({})", p.string(), e.what()));
  }
}

void export_report(const ExportArgs& a, const convert::ExportResult& r, const std::string& recipe,
                   std::optional<int64_t> version, double seconds) {
  if (a.json) {
    json j{{"output", a.output},
           {"format", a.format},
           {"recipe", recipe},
           {"files", r.files},
           {"tensor_bytes", r.tensor_bytes},
           {"quantized_modules", r.quantized_modules},
           {"bf16_modules", r.bf16_modules},
           {"seconds", seconds}};
    if (version) j["version"] = *version;
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print(
      "wrote {} ({}, recipe {}{}): {} files, {:.1f} MB of tensors, {} quantized and {} "
      "bf16 linear tensors, {:.2f} s\n",
      a.output, a.format, recipe, version ? fmt::format(", version {}", *version) : "",
      r.files.size(), double(r.tensor_bytes) / 1e6, r.quantized_modules, r.bf16_modules, seconds);
}

double export_seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_export(ExportArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  if (a.model_dir.empty() == a.run_dir.empty())
    throw UsageError("give the policy: --model DIR --recipe R, or --run RUN_DIR [--version V]");
  convert::HfExportOptions opt = export_options(a);
  TensorProgress progress;
  opt.on_progress = [&](int64_t d, int64_t t) { progress(d, t); };
  model::PolicyVersion p;
  json source_config;
  std::string tokenizer_dir;
  if (!a.model_dir.empty()) {
    if (a.version) throw UsageError("--version selects a version of a run (--run RUN_DIR)");
    const model::ModelWeights w = load_model_source({a.model_dir, "", 0});
    const Recipe recipe = select_run_recipe(a.recipe).recipe;
    // Check the format against the recipe before converting anything.
    convert::plan_export(w.config, recipe, opt);
    p = model::export_policy(w, recipe, 0, opt.convert);
    source_config = export_read_json(fs::path(a.model_dir) / "config.json");
    tokenizer_dir = a.model_dir;
  } else {
    if (a.recipe.recipe_name || a.recipe.recipe_file)
      throw UsageError("a run brings its recipe: drop --recipe / --recipe-file with --run");
    const fs::path run(a.run_dir);
    if (!rl::is_run_dir(run))
      throw UsageError(fmt::format(
          "--run {}: not a training run folder (run_meta.json from lockstep train and a "
          "checkpoint/)",
          a.run_dir));
    const json meta = export_read_json(run / "run_meta.json");
    const Recipe recipe = recipe_from_json(Json::parse(meta.at("recipe").at("content").dump()),
                                           (run / "run_meta.json").string() + ": recipe");
    const json state = export_read_json(run / "checkpoint" / "trainer.json");
    const int64_t latest = state.value("policy_version", int64_t(-1));
    const int64_t v = a.version.value_or(latest);
    model::ModelWeights w;
    if (v == latest) {
      w = model::Learner::load_checkpoint((run / "checkpoint").string())->weights();
    } else if (v == 0) {
      w = model::load_model_dir((run / "reference").string());
    } else {
      throw UsageError(fmt::format(
          "--run {}: no version {} (the run keeps version 0, its reference, and version {}, its "
          "checkpoint)",
          a.run_dir, v, latest));
    }
    convert::plan_export(w.config, recipe, opt);
    p = model::export_policy(w, recipe, v, opt.convert);
    source_config = export_read_json(run / "reference" / "config.json");
    tokenizer_dir = (run / "reference").string();
    if (meta.contains("model") && meta["model"].is_object() && meta["model"].contains("path") &&
        meta["model"]["path"].is_string()) {
      const fs::path src = meta["model"]["path"].get<std::string>();
      std::error_code ec;
      if (fs::is_directory(src, ec)) tokenizer_dir = src.string();
    }
    opt.metadata["lockstep.run"] = fs::absolute(run).string();
  }
  opt.metadata["lockstep.policy_version"] = std::to_string(p.version);
  opt.metadata["lockstep.checksum"] = fmt::format("{:016x}", p.checksum);
  opt.metadata["lockstep.checksum_version"] = std::to_string(model::kPolicyChecksumVersion);
  const convert::ExportResult r =
      convert::export_policy_dir(p, source_config, tokenizer_dir, a.output, opt);
  export_report(a, r, p.recipe.name, p.version, export_seconds_since(t0));
}

void run_convert(ExportArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  convert::HfExportOptions opt = export_options(a);
  TensorProgress progress;
  opt.on_progress = [&](int64_t d, int64_t t) { progress(d, t); };
  const Recipe recipe = select_run_recipe(a.recipe).recipe;
  const convert::ExportResult r = convert::convert_model_dir(a.model_dir, recipe, a.output, opt);
  export_report(a, r, recipe.name, std::nullopt, export_seconds_since(t0));
}

}  // namespace

void register_export_commands(CLI::App& app) {
  {
    auto a = std::make_shared<ExportArgs>();
    CLI::App* c = app.add_subcommand(
        "export",
        "Write a policy as a Hugging Face model directory in a serving stack's format\n"
        "Example: lockstep export --model MODEL_DIR --recipe nvfp4_per_token_w_per_tensor "
        "--format modelopt-nvfp4 -o OUT_DIR\n"
        "         lockstep export --run runs/add --format compressed-tensors-nvfp4 -o OUT_DIR");
    c->add_option("--model", a->model_dir, "model directory (config.json + safetensors)");
    c->add_option("--run", a->run_dir, "a lockstep train run folder (brings its recipe)");
    c->add_option("--version", a->version,
                  "with --run: the policy version (default: the checkpoint's; 0: the reference)");
    add_recipe_options(*c, a->recipe);
    add_export_options(*c, *a);
    c->callback([a] { run_export(*a); });
  }
  {
    auto a = std::make_shared<ExportArgs>();
    CLI::App* c = app.add_subcommand(
        "convert",
        "Convert a bf16 Hugging Face checkpoint, one tensor at a time (peak memory about one "
        "fused tensor), into a serving stack's format\n"
        "Example: lockstep convert MODEL_DIR --recipe fp8_block --format fp8-block -o OUT_DIR");
    c->add_option("MODEL_DIR", a->model_dir, "bf16 / f32 model directory")->required();
    add_recipe_options(*c, a->recipe);
    add_export_options(*c, *a);
    c->callback([a] { run_convert(*a); });
  }
}

}  // namespace lockstep::cli
