// `lockstep forward`, `lockstep sample` and `lockstep align`: the learner's packed forward (logits
// of a token file), the sampler (continuous batching over a prompts file), and the
// learner-sampler log-prob gap of a sampled batch.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "lockstep/model/align.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/json.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/file_io.h"
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
    add_unsigned_option(app, "--init-seed", src.init_seed, UINT64_MAX,
                        "seed of the preset's random weights");
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

SelectedRecipe select_run_recipe(SelectionInputs in) {
  in.read_environment();
  return select_recipe(in);
}

static std::vector<PathArg> model_inputs(const ModelSource& src, const SelectionInputs& recipe) {
  std::vector<PathArg> in{{"--model", src.model_dir}};
  if (recipe.recipe_file) in.push_back({"--recipe-file", *recipe.recipe_file});
  return in;
}

namespace {

// Logits that overflow fp32 on the way (finite weights, NaN or +inf logits) as a user error.
template <class F>
auto finite_logits(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::domain_error& e) {
    throw UsageError(fmt::format("{} (the model's activations overflow fp32)", e.what()));
  }
}

// ---- forward ---------------------------------------------------------------------------------

struct ForwardArgs {
  ModelSource src;
  SelectionInputs recipe;
  std::string tokens, output;
  std::string device = "auto";
  bool deterministic = false, json = false, dry_run = false;
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
  check_output_paths({{"-o", a.output}});
  std::vector<PathArg> inputs = model_inputs(a.src, a.recipe);
  inputs.push_back({"--tokens", a.tokens});
  check_outputs_not_inputs({{"-o", a.output}}, inputs);
  const SelectedRecipe sel = select_run_recipe(a.recipe);
  const Recipe& recipe = sel.recipe;
  const Device dev = device_flag(a.device);
  const model::ModelWeights w = load_model_source(a.src);
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
  if (cu.size() < 2 || cu.front() != 0 || cu.back() != int64_t(ids.size()) ||
      !std::is_sorted(cu.begin(), cu.end()))
    throw UsageError(fmt::format(
        "{}: 'cu_seqlens' must rise from 0 to the token count {} (one entry per sequence start, "
        "plus the end)",
        a.tokens, ids.size()));
  const model::ExecMode mode =
      a.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
  if (dry_run(a.dry_run, sel,
              fmt::format("logits [{}, {}] F32 of {} sequence(s) from {} ({} mode) -> {}",
                          ids.size(), w.config.vocab_size, cu.size() - 1,
                          a.src.model_dir.empty() ? "preset " + a.src.preset : a.src.model_dir,
                          model::exec_mode_name(mode), a.output)))
    return;
  model::DecoderWeights dw;
  dw.config = w.config;
  dw.plan = model::plan_for(w.config, recipe);
  for (const auto& [name, t] : w.tensors) dw.tensors[name] = t.to(dev);
  model::Decoder dec(std::move(dw));
  const Tensor logits =
      dec.forward(Tensor::from_vector<int32_t>(ids32, {int64_t(ids32.size())}, DType::kI32), cu,
                  mode, false)
          .to(Device::cpu());
  // Finite weights can still overflow fp32 on the way to the logits: an error, never a file of
  // NaN.
  if (const int64_t bad = count_nonfinite(to_f32(logits)); bad > 0)
    throw UsageError(fmt::format(
        "{} of {} logits are not finite (NaN or Inf): the model's activations overflow fp32 on "
        "these tokens; nothing was written",
        bad, logits.numel()));
  SafetensorsFile out;
  out.tensors.push_back({"logits", logits});
  out.metadata["lockstep.recipe"] = recipe.name;
  out.metadata["lockstep.mode"] = std::string(model::exec_mode_name(mode));
  write_safetensors(a.output, out);
  if (a.json) {
    Json j{{"output", a.output},         {"tokens", ids.size()},
           {"sequences", cu.size() - 1}, {"vocab", w.config.vocab_size},
           {"recipe", recipe.name},      {"deterministic", a.deterministic},
           {"device", dev.str()}};
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
  std::string prompts, kv = "bf16", device = "auto";
  int64_t max_new = 16, top_k = 0, max_batch = 64;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  std::optional<int64_t> eos;
  bool json = false, dry_run = false;
};

// One JSON array of token ids per non-empty line.
std::vector<model::SampleRequest> read_prompts(const std::string& path) {
  std::string text;
  try {
    text = read_input_file(path);  // a FIFO or device (/dev/zero) is refused, never read
  } catch (const InputPathError& e) {
    throw UsageError(fmt::format("cannot read prompts file: {}", e.what()));
  }
  std::istringstream in(text);
  std::vector<model::SampleRequest> reqs;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j;
    try {
      j = Json::parse(line);
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
  const SelectedRecipe sel = select_run_recipe(a.recipe);
  const Recipe& recipe = sel.recipe;
  const model::ModelWeights w = load_model_source(a.src);
  const std::vector<model::SampleRequest> reqs = read_prompts(a.prompts);
  for (size_t i = 0; i < reqs.size(); ++i)
    for (int32_t id : reqs[i].prompt)
      if (id < 0 || id >= w.config.vocab_size)
        throw UsageError(
            fmt::format("{}: prompt {}: token id {} is outside the vocabulary of {} "
                        "tokens",
                        a.prompts, i + 1, id, w.config.vocab_size));
  if (a.eos && (*a.eos < 0 || *a.eos >= w.config.vocab_size))
    throw UsageError(
        fmt::format("--eos {}: outside the vocabulary of {} tokens", *a.eos, w.config.vocab_size));
  if (dry_run(a.dry_run, sel,
              fmt::format("sample up to {} tokens for each of {} prompt(s) from {} (seed {}, "
                          "temperature {})",
                          a.max_new, reqs.size(),
                          a.src.model_dir.empty() ? "preset " + a.src.preset : a.src.model_dir,
                          a.seed, a.temperature)))
    return;
  model::SamplerConfig sc;
  sc.temperature = a.temperature;
  sc.top_p = a.top_p;
  sc.top_k = a.top_k;
  sc.max_new = a.max_new;
  sc.seed = a.seed;
  sc.kv = kv_from_name(a.kv);
  sc.max_batch = a.max_batch;
  sc.eos = a.eos ? a.eos : w.config.eos_token_id;
  sc.device = device_flag(a.device);
  model::Sampler s(sc);
  s.load_policy(model::export_policy(w, recipe, 0), 0, recipe.name);
  const std::vector<model::SampleResult> res = finite_logits([&] { return s.generate(reqs); });
  // A non-finite log-prob means the logits overflowed: an error, never a null in the output.
  for (size_t i = 0; i < res.size(); ++i)
    for (size_t k = 0; k < res[i].logprobs.size(); ++k)
      if (!std::isfinite(res[i].logprobs[k]))
        throw UsageError(fmt::format(
            "prompt {}: the log-prob of generated token {} is {} (the model's logits are not "
            "finite: its activations overflow fp32)",
            i + 1, k + 1, res[i].logprobs[k]));
  if (a.json) {
    Json j{{"recipe", recipe.name}, {"seed", a.seed}, {"temperature", a.temperature}};
    j["results"] = Json::array();
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
    fmt::print("{}: {} -> {} (sum log-prob {:.4f}{})\n", i, Json(reqs[i].prompt).dump(),
               Json(res[i].tokens).dump(), sum, res[i].eos ? ", eos" : "");
  }
}

// ---- align -----------------------------------------------------------------------------------

struct AlignArgs {
  ModelSource src;
  SelectionInputs recipe;
  std::string learner_recipe, sampler_recipe;
  model::AlignOptions opt;
  std::string kv = "bf16", learner_kv = "bf16";
  std::string device = "auto";
  bool deterministic = false, json = false, dry_run = false;
};

void run_align(AlignArgs a) {
  a.opt.device = device_flag(a.device);
  const SelectedRecipe sel = select_run_recipe(a.recipe);
  Recipe recipe = sel.recipe;
  a.opt.mode = a.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
  a.opt.kv = kv_from_name(a.kv);
  if (a.learner_kv != "bf16" && a.learner_kv != "match")
    throw UsageError(fmt::format("--learner-kv '{}': choose bf16 or match", a.learner_kv));
  a.opt.learner_kv_match = a.learner_kv == "match";
  if (!a.learner_recipe.empty() && !a.sampler_recipe.empty())
    throw UsageError(
        "give either --sampler-recipe (the learner uses --recipe) or --learner-recipe (the "
        "sampler uses --recipe), not both");
  if (!a.learner_recipe.empty())
    a.opt.learner_recipe = builtin_recipe_or_throw(a.learner_recipe, "--learner-recipe").recipe;
  if (a.opt.max_prompt < a.opt.min_prompt)
    throw UsageError(fmt::format("--max-prompt {} is below the shortest prompt ({})",
                                 a.opt.max_prompt, a.opt.min_prompt));
  const model::ModelWeights w = load_model_source(a.src);
  if (a.opt.routing_replay) {
    try {
      model::require_moe_for_replay(w.config, "--routing-replay");
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  if (dry_run(a.dry_run, sel,
              fmt::format("sample {} sequence(s) of up to {} tokens from {} and score them with "
                          "the learner ({}{})",
                          a.opt.batch, a.opt.max_new,
                          a.src.model_dir.empty() ? "preset " + a.src.preset : a.src.model_dir,
                          a.deterministic ? "deterministic" : "fast",
                          a.opt.routing_replay ? ", with and without routing replay" : "")))
    return;
  if (!a.sampler_recipe.empty()) {
    // As in train: --recipe is the learner's, the sampler quantizes with --sampler-recipe.
    a.opt.learner_recipe = recipe;
    recipe = resolve_sampler_recipe(a.sampler_recipe, recipe).value_or(recipe);
    a.learner_recipe = a.opt.learner_recipe->name;
  }
  const model::AlignResult r = finite_logits([&] { return model::align(w, recipe, a.opt); });
  const model::GapStats& g = r.stats;
  const model::GapStats& gn = r.stats_no_replay;
  // A NaN gap is no agreement at all: an error, never a max of 0.
  for (const std::vector<double>* d : {&r.delta, &r.delta_no_replay})
    for (size_t i = 0; i < d->size(); ++i)
      if (!std::isfinite((*d)[i]))
        throw UsageError(fmt::format(
            "the learner - sampler log-prob gap of generated token {} is {} (the model's logits "
            "are not finite: its activations overflow fp32)",
            i + 1, (*d)[i]));
  const auto or_null = [&](double v) { return a.opt.routing_replay ? Json(v) : Json(nullptr); };
  if (a.json) {
    Json j{{"recipe", recipe.name},
           {"deterministic", a.deterministic},
           {"tokens", g.tokens},
           {"mean_abs_gap", g.mean_abs},
           {"max_abs_gap", g.max_abs},
           {"q05_gap", g.q05},
           {"batch", a.opt.batch},
           {"alone", a.opt.alone},
           {"kv_cache", a.kv},
           {"learner_kv", a.learner_kv},
           {"learner_recipe", a.learner_recipe.empty() ? recipe.name : a.learner_recipe},
           {"sampler_recipe", recipe.name},
           {"routing_replay", a.opt.routing_replay},
           {"no_replay_mean_abs_gap", or_null(gn.mean_abs)},
           {"no_replay_max_abs_gap", or_null(gn.max_abs)},
           {"no_replay_q05_gap", or_null(gn.q05)},
           {"routing_mismatch", or_null(r.routing_mismatch)},
           {"device", a.opt.device.str()}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print(
      "recipe {}{} ({}, batch {}{}, kv {}{}): {} tokens, mean |gap| {:.3e}, max |gap| {:.3e}, q05 "
      "gap {:.3e}\n",
      a.learner_recipe.empty() ? recipe.name : "learner " + a.learner_recipe,
      a.learner_recipe.empty() ? "" : ", sampler " + recipe.name,
      a.deterministic ? "deterministic" : "fast", a.opt.batch, a.opt.alone ? " scored alone" : "",
      a.kv, a.opt.learner_kv_match && a.kv != "bf16" ? ", learner kv matched" : "", g.tokens,
      g.mean_abs, g.max_abs, g.q05);
  if (a.opt.routing_replay)
    fmt::print(
        "  the gap above is with routing replay (the sampler's experts); the learner's own "
        "routing: mean |gap| {:.3e}, max |gap| {:.3e}, q05 gap {:.3e}; {:.2f}% of (row, MoE "
        "layer) pairs chose other experts\n",
        gn.mean_abs, gn.max_abs, gn.q05, 100.0 * r.routing_mismatch);
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
    add_device_option(*c, a->device);
    c->add_flag("--dry-run", a->dry_run,
                "check the model, tokens and output, print what would run; write nothing");
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
    add_integer_option<int64_t>(*c, "--max-new", a->max_new, 1, 1'000'000,
                                "tokens to generate per prompt");
    add_real_option(*c, "--temperature", a->temperature, 0.0, 100.0, true,
                    "sampling temperature, finite and > 0");
    add_real_option(*c, "--top-p", a->top_p, 0.0, 1.0, true, "nucleus mass in (0, 1]");
    add_integer_option<int64_t>(*c, "--top-k", a->top_k, 0, int64_t(1) << 31,
                                "keep the k most likely tokens (0: all)");
    add_unsigned_option(*c, "--seed", a->seed, UINT64_MAX, "Philox seed of the sampling uniforms");
    add_integer_option<int64_t>(*c, "--eos", a->eos, 0, int64_t(1) << 31,
                                "stop token (default: the config's eos_token_id)");
    c->add_option("--kv-cache", a->kv, "bf16 or fp8 (E4M3 with per-head scales)");
    add_integer_option<int64_t>(*c, "--max-batch", a->max_batch, 1, 1'000'000,
                                "sequences decoded together");
    c->add_flag("--json", a->json, "print the results as JSON");
    add_device_option(*c, a->device);
    c->add_flag("--dry-run", a->dry_run,
                "check the model and prompts, print what would run; sample nothing");
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
    add_integer_option<int64_t>(*c, "--batch", a->opt.batch, 1, 1'000'000,
                                "sequences, of mixed prompt lengths");
    c->add_flag("--alone", a->opt.alone, "sample and score each sequence alone");
    add_integer_option<int64_t>(*c, "--max-new", a->opt.max_new, 1, 1'000'000,
                                "generated tokens per sequence");
    add_integer_option<int64_t>(*c, "--max-prompt", a->opt.max_prompt, 1, 1'000'000,
                                "longest prompt");
    add_real_option(*c, "--temperature", a->opt.temperature, 0.0, 100.0, true,
                    "sampling temperature, finite and > 0");
    add_unsigned_option(*c, "--seed", a->opt.seed, UINT64_MAX, "seed of prompts and sampling");
    c->add_option("--kv-cache", a->kv,
                  "bf16 or fp8 (fp8 differs by construction unless --learner-kv match)");
    c->add_option("--learner-kv", a->learner_kv,
                  "the learner's K / V rounding: bf16, or match (round like the sampler's cache)")
        ->capture_default_str();
    c->add_option(
        "--learner-recipe", a->learner_recipe,
        "rescore with this built-in recipe instead (e.g. bf16 behind a quantized sampler)");
    c->add_option("--sampler-recipe", a->sampler_recipe,
                  "sample with this recipe (name or JSON file) while the learner uses --recipe, "
                  "as train does");
    c->add_flag("--routing-replay", a->opt.routing_replay,
                "the learner reuses the sampler's experts (MoE models); reports the gap with "
                "and without replay");
    c->add_flag("--json", a->json,
                "print {recipe, deterministic, tokens, mean_abs_gap, max_abs_gap, q05_gap, "
                "routing_replay, no_replay_*_gap, routing_mismatch, ...}");
    c->add_flag("--dry-run", a->dry_run, "check the model and options, print what would run");
    add_device_option(*c, a->device);
    c->callback([a] { run_align(*a); });
  }
}

}  // namespace lockstep::cli
