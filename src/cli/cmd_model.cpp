// `lockstep forward`, `lockstep sample` and `lockstep align`: the learner's packed forward (logits
// of a token file), the sampler (continuous batching over a prompts file), and the
// learner-sampler log-prob gap of a sampled batch.
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "lockstep/model/align.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/safetensors.h"
#include "model_cli.h"
#include "train_cli.h"

namespace lockstep::cli {

void add_model_source_options(CLI::App& app, ModelSource& src, bool allow_preset) {
  app.add_option("--model", src.model_dir,
                 "model directory (config.json + model.safetensors or an index with shards)");
  if (allow_preset) {
    app.add_option("--preset", src.preset,
                   "a built-in config with random weights instead of --model (tiny-dense, "
                   "tiny-moe, ...)");
    app.add_option("--init-seed", src.init_seed, "seed of the preset's random weights (default 0)");
  }
}

model::ModelWeights load_model_source(const ModelSource& src) {
  if (src.model_dir.empty() == src.preset.empty())
    throw UsageError(src.preset.empty() && src.model_dir.empty()
                         ? "give the model: --model DIR (or --preset NAME where accepted)"
                         : "give either --model or --preset, not both");
  try {
    if (!src.preset.empty()) return model::init_weights(model::preset(src.preset), src.init_seed);
    return model::load_model_dir(src.model_dir);
  } catch (const model::WeightsError& e) {
    throw UsageError(e.what());
  }
}

Recipe select_run_recipe(SelectionInputs in) {
  in.read_environment();
  return select_recipe(in).recipe;
}

namespace {

// ---- forward ---------------------------------------------------------------------------------

struct ForwardArgs {
  ModelSource src;
  SelectionInputs recipe;
  std::string tokens, output;
  bool deterministic = false, json = false;
};

std::vector<int64_t> int_values(const Tensor& t, const std::string& what) {
  if (t.dim() != 1 || (t.dtype() != DType::kI32 && t.dtype() != DType::kI64))
    throw UsageError(fmt::format("{} {} must be a 1-D I32 or I64 tensor", what, t.describe()));
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  const Tensor c = t.contiguous();
  for (int64_t i = 0; i < t.numel(); ++i)
    v[size_t(i)] = t.dtype() == DType::kI32 ? c.ptr<int32_t>()[i] : c.ptr<int64_t>()[i];
  return v;
}

void run_forward(const ForwardArgs& a) {
  const model::ModelWeights w = load_model_source(a.src);
  const Recipe recipe = select_run_recipe(a.recipe);
  const SafetensorsFile f = read_safetensors(a.tokens);
  const Tensor* ids_t = f.find("ids");
  if (!ids_t) throw UsageError(fmt::format("{}: no tensor named 'ids' (I32/I64 [n])", a.tokens));
  const std::vector<int64_t> ids = int_values(*ids_t, a.tokens + ": 'ids'");
  if (ids.empty()) throw UsageError(fmt::format("{}: 'ids' is empty", a.tokens));
  std::vector<int64_t> cu{0, int64_t(ids.size())};
  if (const Tensor* c = f.find("cu_seqlens")) cu = int_values(*c, a.tokens + ": 'cu_seqlens'");
  std::vector<int32_t> ids32;
  for (int64_t v : ids) {
    if (v < 0 || v >= w.config.vocab_size)
      throw UsageError(
          fmt::format("{}: token id {} is out of range for the vocabulary of {} tokens", a.tokens,
                      v, w.config.vocab_size));
    ids32.push_back(int32_t(v));
  }
  model::DecoderWeights dw;
  dw.config = w.config;
  dw.plan = model::plan_for(w.config, recipe);
  dw.tensors = w.tensors;
  model::Decoder dec(std::move(dw));
  const model::ExecMode mode =
      a.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
  const Tensor logits = dec.forward(
      Tensor::from_vector<int32_t>(ids32, {int64_t(ids32.size())}, DType::kI32), cu, mode, false);
  SafetensorsFile out;
  out.tensors.push_back({"logits", logits});
  out.metadata["lockstep.recipe"] = recipe.name;
  out.metadata["lockstep.mode"] = std::string(model::exec_mode_name(mode));
  write_safetensors(a.output, out);
  if (a.json) {
    nlohmann::json j{{"output", a.output},         {"tokens", ids.size()},
                     {"sequences", cu.size() - 1}, {"vocab", w.config.vocab_size},
                     {"recipe", recipe.name},      {"deterministic", a.deterministic}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("wrote {}: logits [{}, {}] F32 ({} sequences, recipe {}, {} mode)\n", a.output,
               ids.size(), w.config.vocab_size, cu.size() - 1, recipe.name,
               model::exec_mode_name(mode));
  }
}

// ---- sample ----------------------------------------------------------------------------------

struct SampleArgs {
  ModelSource src;
  SelectionInputs recipe;
  std::string prompts, kv = "bf16";
  int64_t max_new = 16, top_k = 0, max_batch = 64;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  std::optional<int64_t> eos;
  bool json = false;
};

// One JSON array of token ids per non-empty line.
std::vector<model::SampleRequest> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("cannot read prompts file '{}'", path));
  std::vector<model::SampleRequest> reqs;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("{}:{}: not JSON ({})", path, lineno, e.what()));
    }
    if (j.is_object() && j.contains("prompt")) j = j["prompt"];
    if (!j.is_array())
      throw UsageError(fmt::format("{}:{}: want a JSON array of token ids", path, lineno));
    model::SampleRequest r;
    r.stream = uint32_t(reqs.size());
    for (const auto& v : j) {
      if (!v.is_number_integer())
        throw UsageError(fmt::format("{}:{}: token {} is not an integer", path, lineno, v.dump()));
      const int64_t id = v.get<int64_t>();
      if (id < INT32_MIN || id > INT32_MAX)
        throw UsageError(fmt::format("{}:{}: token id {} is out of range", path, lineno, id));
      r.prompt.push_back(int32_t(id));
    }
    if (r.prompt.empty())
      throw UsageError(
          fmt::format("{}:{}: empty prompt (give at least one token id)", path, lineno));
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) throw UsageError(fmt::format("{}: no prompts", path));
  return reqs;
}

model::KvDtype kv_from_name(const std::string& s) {
  if (s == "bf16") return model::KvDtype::kBf16;
  if (s == "fp8") return model::KvDtype::kFp8E4M3;
  throw UsageError(fmt::format("--kv-cache '{}': choose bf16 or fp8", s));
}

void run_sample(const SampleArgs& a) {
  const model::ModelWeights w = load_model_source(a.src);
  const Recipe recipe = select_run_recipe(a.recipe);
  const std::vector<model::SampleRequest> reqs = read_prompts(a.prompts);
  model::SamplerConfig sc;
  sc.temperature = a.temperature;
  sc.top_p = a.top_p;
  sc.top_k = a.top_k;
  sc.max_new = a.max_new;
  sc.seed = a.seed;
  sc.kv = kv_from_name(a.kv);
  sc.max_batch = a.max_batch;
  sc.eos = a.eos ? a.eos : w.config.eos_token_id;
  model::Sampler s(sc);
  s.load_policy(model::export_policy(w, recipe, 0), 0, recipe.name);
  const std::vector<model::SampleResult> res = s.generate(reqs);
  if (a.json) {
    nlohmann::json j{{"recipe", recipe.name}, {"seed", a.seed}, {"temperature", a.temperature}};
    j["results"] = nlohmann::json::array();
    for (size_t i = 0; i < res.size(); ++i)
      j["results"].push_back({{"prompt", reqs[i].prompt},
                              {"tokens", res[i].tokens},
                              {"logprobs", res[i].logprobs},
                              {"eos", res[i].eos}});
    fmt::print("{}\n", j.dump());
    return;
  }
  for (size_t i = 0; i < res.size(); ++i) {
    double sum = 0;
    for (float v : res[i].logprobs) sum += v;
    fmt::print("{}: {} -> {} (sum log-prob {:.4f}{})\n", i, nlohmann::json(reqs[i].prompt).dump(),
               nlohmann::json(res[i].tokens).dump(), sum, res[i].eos ? ", eos" : "");
  }
}

// ---- align -----------------------------------------------------------------------------------

struct AlignArgs {
  ModelSource src;
  SelectionInputs recipe;
  std::string learner_recipe, sampler_recipe;
  model::AlignOptions opt;
  std::string kv = "bf16";
  bool deterministic = false, json = false;
};

void run_align(AlignArgs a) {
  const model::ModelWeights w = load_model_source(a.src);
  Recipe recipe = select_run_recipe(a.recipe);
  a.opt.mode = a.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
  a.opt.kv = kv_from_name(a.kv);
  if (!a.learner_recipe.empty() && !a.sampler_recipe.empty())
    throw UsageError(
        "give either --sampler-recipe (the learner uses --recipe) or --learner-recipe (the "
        "sampler uses --recipe), not both");
  if (!a.learner_recipe.empty())
    a.opt.learner_recipe = builtin_recipe_or_throw(a.learner_recipe, "--learner-recipe").recipe;
  if (!a.sampler_recipe.empty()) {
    // As in train: --recipe is the learner's, the sampler quantizes with --sampler-recipe.
    a.opt.learner_recipe = recipe;
    recipe = resolve_sampler_recipe(a.sampler_recipe, recipe).value_or(recipe);
    a.learner_recipe = a.opt.learner_recipe->name;
  }
  const model::AlignResult r = model::align(w, recipe, a.opt);
  const model::GapStats& g = r.stats;
  if (a.json) {
    nlohmann::json j{{"recipe", recipe.name},
                     {"deterministic", a.deterministic},
                     {"tokens", g.tokens},
                     {"mean_abs_gap", g.mean_abs},
                     {"max_abs_gap", g.max_abs},
                     {"q05_gap", g.q05},
                     {"batch", a.opt.batch},
                     {"alone", a.opt.alone},
                     {"kv_cache", a.kv},
                     {"learner_recipe", a.learner_recipe.empty() ? recipe.name : a.learner_recipe},
                     {"sampler_recipe", recipe.name}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print(
      "recipe {}{} ({}, batch {}{}, kv {}): {} tokens, mean |gap| {:.3e}, max |gap| {:.3e}, q05 "
      "gap {:.3e}\n",
      a.learner_recipe.empty() ? recipe.name : "learner " + a.learner_recipe,
      a.learner_recipe.empty() ? "" : ", sampler " + recipe.name,
      a.deterministic ? "deterministic" : "fast", a.opt.batch, a.opt.alone ? " scored alone" : "",
      a.kv, g.tokens, g.mean_abs, g.max_abs, g.q05);
}

}  // namespace

void register_model_commands(CLI::App& app) {
  {
    auto a = std::make_shared<ForwardArgs>();
    CLI::App* c =
        app.add_subcommand("forward",
                           "Logits [tokens, vocab] F32 of a packed batch (the learner's forward)\n"
                           "Example: lockstep forward --model MODEL_DIR --tokens ids.safetensors "
                           "-o logits.safetensors "
                           "--recipe nvfp4_per_token --deterministic");
    add_model_source_options(*c, a->src, true);
    add_recipe_options(*c, a->recipe);
    c->add_option("--tokens", a->tokens,
                  "safetensors file: 'ids' I32/I64 [n], optional 'cu_seqlens' [b + 1]")
        ->required();
    c->add_option("-o,--output", a->output, "output safetensors file ('logits')")->required();
    c->add_flag("--deterministic", a->deterministic,
                "batch-invariant attention (the sampler's per-row function)");
    c->add_flag("--json", a->json, "print a JSON summary");
    c->callback([a] { run_forward(*a); });
  }
  {
    auto a = std::make_shared<SampleArgs>();
    CLI::App* c = app.add_subcommand(
        "sample",
        "Sample continuations of prompts (KV cache, continuous batching)\n"
        "Example: lockstep sample --model MODEL_DIR --prompts prompts.jsonl --max-new 16 "
        "--temperature 0.8 --seed 1 --json\n"
        "Prompts file: one JSON array of token ids per line, e.g. [1, 5, 9]");
    add_model_source_options(*c, a->src, true);
    add_recipe_options(*c, a->recipe);
    c->add_option("--prompts", a->prompts, "JSON lines file of token id arrays")->required();
    c->add_option("--max-new", a->max_new, "tokens to generate per prompt (default 16)");
    c->add_option("--temperature", a->temperature, "sampling temperature > 0 (default 1)");
    c->add_option("--top-p", a->top_p, "nucleus mass in (0, 1] (default 1)");
    c->add_option("--top-k", a->top_k, "keep the k most likely tokens (0: all)");
    c->add_option("--seed", a->seed, "Philox seed of the sampling uniforms (default 0)");
    c->add_option("--eos", a->eos, "stop token (default: the config's eos_token_id)");
    c->add_option("--kv-cache", a->kv, "bf16 or fp8 (E4M3 with per-head scales)");
    c->add_option("--max-batch", a->max_batch, "sequences decoded together (default 64)");
    c->add_flag("--json", a->json, "print the results as JSON");
    c->callback([a] { run_sample(*a); });
  }
  {
    auto a = std::make_shared<AlignArgs>();
    CLI::App* c = app.add_subcommand(
        "align",
        "Learner vs sampler log-probs of a sampled batch: mean |gap|, max |gap|, 5th percentile\n"
        "Example: lockstep align --preset tiny-moe --recipe nvfp4_per_token --deterministic "
        "--batch 8 --json");
    add_model_source_options(*c, a->src, true);
    add_recipe_options(*c, a->recipe);
    c->add_flag("--deterministic", a->deterministic,
                "batch-invariant learner (the gap must then be exactly 0 for row-local recipes)");
    c->add_option("--batch", a->opt.batch, "sequences (default 8), of mixed prompt lengths");
    c->add_flag("--alone", a->opt.alone, "sample and score each sequence alone");
    c->add_option("--max-new", a->opt.max_new, "generated tokens per sequence (default 16)");
    c->add_option("--max-prompt", a->opt.max_prompt, "longest prompt (default 8)");
    c->add_option("--temperature", a->opt.temperature, "sampling temperature (default 1)");
    c->add_option("--seed", a->opt.seed, "seed of prompts and sampling (default 0)");
    c->add_option("--kv-cache", a->kv, "bf16 or fp8 (fp8 differs by construction)");
    c->add_option(
        "--learner-recipe", a->learner_recipe,
        "rescore with this built-in recipe instead (e.g. bf16 behind a quantized sampler)");
    c->add_option("--sampler-recipe", a->sampler_recipe,
                  "sample with this recipe (name or JSON file) while the learner uses --recipe, "
                  "as train does");
    c->add_flag("--json", a->json,
                "print {recipe, deterministic, tokens, mean_abs_gap, max_abs_gap, q05_gap}");
    c->callback([a] { run_align(*a); });
  }
}

}  // namespace lockstep::cli
