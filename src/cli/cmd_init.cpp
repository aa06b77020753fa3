// `lockstep init` (a model directory with random weights in the Hugging Face layout, from a
// config.json or a built-in preset) and `lockstep presets` (the preset registry): thin layers over
// model/config.h and model/weights.h.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>

#include "commands.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/model/weights.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;

struct InitArgs {
  std::string config, preset, output, dtype = "f32";
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 0;
  bool force = false, json = false, dry_run = false, list_presets = false;
};

Json preset_json(const std::string& name) {
  const ModelConfig c = model::preset(name);
  return Json{{"name", name},
              {"description", model::preset_description(name)},
              {"parameters", model::parameter_count(c)},
              {"config", Json(model::config_to_json(c))}};
}

void run_presets(bool json) {
  if (json) {
    Json out = Json::array();
    for (const auto& name : model::preset_names()) out.push_back(preset_json(name));
    fmt::print("{}\n", out.dump(2));
    return;
  }
  size_t w = 0;
  for (const auto& name : model::preset_names()) w = std::max(w, name.size());
  for (const auto& name : model::preset_names())
    fmt::print("{:<{}}  {:>8} parameters  {}\n", name, w,
               model::parameter_count(model::preset(name)), model::preset_description(name));
  fmt::print("\nCreate one with: lockstep init --preset NAME -o MODEL_DIR [--seed N]\n");
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  throw UsageError(fmt::format("--dtype must be f32 or bf16, got '{}'", s));
}

// A refusal before anything is written: the output must be absent, an empty directory, or (with
// --force) a directory.
void check_output(const InitArgs& a) {
  if (!fs::exists(a.output)) return;
  if (!fs::is_directory(a.output))
    throw UsageError(fmt::format("-o {}: exists and is not a directory", a.output));
  if (!fs::is_empty(a.output) && !a.force)
    throw UsageError(fmt::format(
        "-o {}: the directory exists and is not empty; pass --force to write the model into it "
        "(its config.json and weights files are replaced, other files are kept)",
        a.output));
}

void run_init(const InitArgs& a) {
  if (a.list_presets) {
    run_presets(a.json);
    return;
  }
  if (a.config.empty() == a.preset.empty())
    throw UsageError("give exactly one of --config CONFIG.json and --preset NAME");
  if (a.output.empty()) throw UsageError("-o MODEL_DIR is required");
  const DType dtype = parse_dtype(a.dtype);
  check_output_folder("-o", a.output);
  check_outputs_not_inputs({{"-o", a.output, /*folder=*/true}}, {{"--config", a.config}});
  const ModelConfig config =
      a.preset.empty() ? model::load_config(a.config) : model::preset(a.preset);
  check_output(a);
  const std::string source = a.preset.empty() ? "config " + a.config : "preset " + a.preset;
  if (dry_run(a.dry_run, fmt::format("random {} model ({}, seed {}, {}) -> {}", config.model_type,
                                     source, a.seed, a.dtype, a.output)))
    return;

  const model::ModelWeights w = model::init_weights(config, a.seed);
  const int64_t params = model::parameter_count(config);
  const Json meta = provenance(
      "init", "cpu",
      Json{{"source", a.preset.empty() ? Json{{"config", a.config}} : Json{{"preset", a.preset}}},
           {"output", a.output},
           {"dtype", a.dtype},
           {"parameters", params},
           {"max_shard_bytes", a.max_shard_bytes},
           {"init", fmt::format("Philox normal(0, {}) per matrix (stream = index in the layout), "
                                "ones for norms",
                                model::kInitStd)},
           {"config", Json(model::config_to_json(config))}},
      Json::object(), {{"init", a.seed}});
  model::save_model_dir(w, a.output, dtype, size_t(a.max_shard_bytes),
                        {{"lockstep.run_meta", meta.dump()}});
  write_file_atomic(fs::path(a.output) / "run_meta.json", meta.dump(2) + "\n");

  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(a.output))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  if (a.json) {
    fmt::print("{}\n", Json{{"output", a.output},
                            {"model_type", config.model_type},
                            {"source", source},
                            {"seed", a.seed},
                            {"dtype", a.dtype},
                            {"parameters", params},
                            {"files", files}}
                           .dump(2));
    return;
  }
  fmt::print("wrote {}: {} from {}, {} layers, {} parameters, {}, seed {}\n", a.output,
             config.model_type, source, config.num_hidden_layers, params, a.dtype, a.seed);
  std::string list;
  for (const auto& f : files) list += (list.empty() ? "" : ", ") + f;
  fmt::print("files: {}\n", list);
}

}  // namespace

void register_init_commands(CLI::App& app) {
  auto a = std::make_shared<InitArgs>();
  CLI::App* init = app.add_subcommand(
      "init",
      "Create a model directory with random weights in the Hugging Face layout (config.json +\n"
      "model.safetensors, or shards + model.safetensors.index.json) that lockstep and\n"
      "transformers both load. Weights: Philox normal(0, 0.02) for matrices, ones for norms, the\n"
      "same bits on every machine for a given seed; run_meta.json records the provenance.\n"
      "Example: lockstep init --preset tiny-moe -o models/tiny-moe --seed 1\n"
      "         lockstep init --config config.json -o models/mine --dtype bf16");
  init->add_option("--config", a->config, "a Hugging Face config.json (Qwen3 or Qwen3-MoE)");
  init->add_option("--preset", a->preset, "a built-in preset (lockstep presets lists them)");
  init->add_option("-o,--output", a->output, "the model directory to create");
  add_unsigned_option(*init, "--seed", a->seed, UINT64_MAX,
                      "Philox seed of the random weights (0 to 2^64 - 1)");
  init->add_option("--dtype", a->dtype, "stored dtype: f32 or bf16")->capture_default_str();
  add_unsigned_option(*init, "--max-shard-bytes", a->max_shard_bytes, uint64_t(1) << 62,
                      "shard the weights into files of at most this many bytes (0: one file)");
  init->add_flag("--force", a->force, "write into an existing non-empty directory");
  init->add_flag("--list-presets", a->list_presets, "list the built-in presets and exit");
  init->add_flag("--json", a->json, "machine-readable summary on stdout");
  init->add_flag("--dry-run", a->dry_run, "print the environment and the command; create nothing");
  init->callback([a] { run_init(*a); });

  auto json = std::make_shared<bool>(false);
  CLI::App* presets = app.add_subcommand(
      "presets",
      "List the built-in model presets (sizes, parameter counts; --json adds each config.json).\n"
      "Example: lockstep presets --json");
  presets->add_flag("--json", *json, "machine-readable list on stdout");
  presets->callback([json] { run_presets(*json); });
}

}  // namespace lockstep::cli
