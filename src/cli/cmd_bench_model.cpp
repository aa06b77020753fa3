// `lockstep bench model`: learner forward+backward tokens/s, AdamW step time, sampler decode
// tokens/s and policy export time per preset and recipe on the CPU or a GPU, saved-operand bytes
// per backward mode, and the ratio to a PyTorch fp32 eager baseline (bench/torch_baseline.py JSON).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "commands.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/recipe/json.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/storage.h"

namespace lockstep::cli {
namespace {

struct BenchModelArgs {
  std::vector<std::string> presets{"tiny-dense", "tiny-moe"};
  std::vector<std::string> recipes{"bf16", "nvfp4_per_token"};
  int64_t batch = 64, min_len = 12, max_len = 24, new_tokens = 16;
  int reps = 5;
  std::string baseline;
  std::string device = "auto";
  bool deterministic = false;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class F>
double median_seconds(int reps, F&& f) {
  f();  // warm-up (weight operands, caches, thread pool)
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int32_t rand_id(uint64_t i, int64_t vocab) {
  return int32_t(num::philox_element_word(42, 9, i) % uint32_t(vocab));
}

struct Row {
  std::string preset, recipe;
  double learner_tps = 0, step_ms = 0, decode_tps = 0, prefill_tps = 0, export_ms = 0,
         export_bf16_ms = 0;
  double base_learner = 0, base_decode = 0;
};

Json read_baseline(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("cannot read baseline file '{}'", path));
  Json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("baseline '{}' is not JSON: {}", path, e.what()));
  }
  if (j.is_object() && j.contains("results")) j = j["results"];
  if (j.is_object()) j = Json::array({j});
  if (!j.is_array()) throw UsageError(fmt::format("baseline '{}': want a list of results", path));
  return j;
}

void run_bench_model(const BenchModelArgs& a) {
  const Device dev = device_flag(a.device);
  const Json base = a.baseline.empty() ? Json::array() : read_baseline(a.baseline);
  std::vector<Row> rows;
  Json saved = Json::array();
  for (const std::string& pname : a.presets) {
    const model::ModelConfig cfg = model::preset(pname);
    const model::ModelWeights w = model::init_weights(cfg, 0);
    // Sequence b has min_len + (7 b mod (max_len - min_len + 1)) tokens: a fixed mix of lengths.
    std::vector<int64_t> lens;
    for (int64_t b = 0; b < a.batch; ++b)
      lens.push_back(a.min_len + (7 * b) % (a.max_len - a.min_len + 1));
    std::vector<int64_t> cu{0};
    for (int64_t b = 0; b < a.batch; ++b) cu.push_back(cu.back() + lens[size_t(b)]);
    const int64_t n = cu.back();
    std::vector<int32_t> ids(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      ids[size_t(i)] = rand_id(uint64_t(i), cfg.vocab_size);
      tg[size_t(i)] = rand_id(uint64_t(i + n), cfg.vocab_size);
    }
    const Tensor idt = Tensor::from_vector<int32_t>(ids, {n}, DType::kI32);
    const Tensor tgt = Tensor::from_vector<int32_t>(tg, {n}, DType::kI32);
    Tensor dlogp(DType::kF32, {n});
    for (int64_t i = 0; i < n; ++i) dlogp.ptr<float>()[i] = i % 3 == 0 ? 1.0f : -0.5f;
    for (const std::string& rname : a.recipes) {
      const Recipe& recipe = builtin_recipe_or_throw(rname, "--recipe").recipe;
      Row r{pname, rname};
      model::LearnerConfig lc;
      lc.mode = a.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
      lc.device = dev;
      model::Learner learner(w, recipe, lc);
      const double t_fb = median_seconds(a.reps, [&] {
        learner.forward(idt, cu, tgt);
        learner.backward(dlogp, Tensor());
        synchronize(dev);
      });
      r.learner_tps = double(n) / t_fb;
      r.step_ms = 1e3 * median_seconds(a.reps, [&] { learner.step(); });
      r.export_ms = 1e3 * median_seconds(a.reps, [&] {
                      model::export_policy(learner.weights(), recipe, learner.version());
                    });
      r.export_bf16_ms = 1e3 * median_seconds(a.reps, [&] {
                           model::export_policy(learner.weights(), recipe, learner.version(),
                                                {.force_bf16 = true});
                         });
      model::SamplerConfig sc;
      sc.max_new = a.new_tokens;
      sc.max_batch = a.batch;
      sc.device = dev;
      model::Sampler sampler(sc);
      sampler.load_policy(model::export_policy(learner.weights(), recipe, learner.version()),
                          learner.version(), recipe.name);
      std::vector<model::SampleRequest> reqs(static_cast<size_t>(a.batch));
      int64_t prompt_tokens = 0;
      for (int64_t b = 0; b < a.batch; ++b) {
        reqs[size_t(b)].stream = uint32_t(b);
        for (int64_t j = 0; j < lens[size_t(b)]; ++j)
          reqs[size_t(b)].prompt.push_back(rand_id(uint64_t(b * 1000 + j), cfg.vocab_size));
        prompt_tokens += lens[size_t(b)];
      }
      // Decode tokens/s excludes the prefill: (t(new tokens) - t(1 token)) over the tokens after
      // the first (no eos: every sequence generates exactly new_tokens).
      // Runs of new_tokens and of 1 token interleaved, the median of their differences (so a
      // change of machine load between the two series does not land in the difference).
      model::SamplerConfig one = sc;
      one.max_new = 1;
      sampler.generate(reqs);  // warm-up
      std::vector<double> diffs, ones;
      for (int i = 0; i < a.reps; ++i) {
        sampler.set_config(sc);
        auto t0 = std::chrono::steady_clock::now();
        sampler.generate(reqs);
        const double t_all = seconds_since(t0);
        sampler.set_config(one);
        t0 = std::chrono::steady_clock::now();
        sampler.generate(reqs);
        const double t_one = seconds_since(t0);
        diffs.push_back(t_all - t_one);
        ones.push_back(t_one);
      }
      std::sort(diffs.begin(), diffs.end());
      std::sort(ones.begin(), ones.end());
      const double t_one = ones[ones.size() / 2], t_dec = diffs[diffs.size() / 2];
      r.decode_tps = t_dec > 0 ? double(a.batch * (a.new_tokens - 1)) / t_dec : 0.0;
      r.prefill_tps = double(prompt_tokens) / t_one;
      for (const auto& b : base)
        if (b.value("preset", std::string()) == pname) {
          r.base_learner = b.value("learner_tokens_per_s", 0.0);
          r.base_decode = b.value("decode_tokens_per_s", 0.0);
        }
      rows.push_back(r);
    }
    // Saved-operand bytes of one forward per backward mode (nvfp4_per_token family).
    for (const char* rn :
         {"bf16", "nvfp4_per_token", "nvfp4_per_token_bf16_bwd", "nvfp4_per_token_dequant_bwd"}) {
      model::LearnerConfig slc;
      slc.device = dev;
      model::Learner l(w, builtin_recipe_or_throw(rn, "bench").recipe, slc);
      l.forward(idt, cu, tgt);
      saved.push_back(
          {{"preset", pname}, {"recipe", rn}, {"tokens", n}, {"saved_bytes", l.saved_bytes()}});
    }
  }
  if (a.json) {
    Json j;
    j["batch"] = a.batch;
    j["lengths"] = {a.min_len, a.max_len};
    j["new_tokens"] = a.new_tokens;
    j["threads"] = omp_get_max_threads();
    j["device"] = dev.str();
    j["mode"] = a.deterministic ? "deterministic" : "fast";
    j["results"] = Json::array();
    for (const Row& r : rows)
      j["results"].push_back(
          {{"preset", r.preset},
           {"recipe", r.recipe},
           {"learner_tokens_per_s", r.learner_tps},
           {"step_ms", r.step_ms},
           {"decode_tokens_per_s", r.decode_tps},
           {"prefill_tokens_per_s", r.prefill_tps},
           {"export_ms", r.export_ms},
           {"export_bf16_ms", r.export_bf16_ms},
           {"learner_ratio_to_torch", r.base_learner > 0 ? r.learner_tps / r.base_learner : 0.0},
           {"decode_ratio_to_torch", r.base_decode > 0 ? r.decode_tps / r.base_decode : 0.0}});
    j["saved_operands"] = saved;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "lockstep bench model ({}, {} threads, {} mode; {} sequences of {}-{} tokens; decode {} new "
      "tokens each, prefill excluded)\n",
      dev.str(), omp_get_max_threads(), a.deterministic ? "deterministic" : "fast", a.batch,
      a.min_len, a.max_len, a.new_tokens);
  fmt::print("{:<11} {:<17} {:>13} {:>8} {:>9} {:>12} {:>8} {:>10} {:>9}\n", "preset", "recipe",
             "learner tok/s", "x torch", "step ms", "decode tok/s", "x torch", "export ms",
             "bf16 ms");
  for (const Row& r : rows)
    fmt::print("{:<11} {:<17} {:>13.0f} {:>8} {:>9.2f} {:>12.0f} {:>8} {:>10.2f} {:>9.2f}\n",
               r.preset, r.recipe, r.learner_tps,
               r.base_learner > 0 ? fmt::format("{:.2f}", r.learner_tps / r.base_learner) : "-",
               r.step_ms, r.decode_tps,
               r.base_decode > 0 ? fmt::format("{:.2f}", r.decode_tps / r.base_decode) : "-",
               r.export_ms, r.export_bf16_ms);
  fmt::print("saved operands of one learner forward:\n");
  for (const auto& s : saved)
    fmt::print("  {:<11} {:<28} {:>10} bytes\n", s["preset"].get<std::string>(),
               s["recipe"].get<std::string>(), s["saved_bytes"].get<size_t>());
}

}  // namespace

void register_bench_model_command(CLI::App& bench) {
  auto a = std::make_shared<BenchModelArgs>();
  CLI::App* c = bench.add_subcommand(
      "model",
      "Learner fwd+bwd and sampler decode tokens/s per preset and recipe (--device)\n"
      "Example: lockstep bench model --baseline torch_baseline.json --json");
  c->add_option("--preset", a->presets, "presets to run (default tiny-dense tiny-moe)");
  c->add_option("--recipe", a->recipes, "recipes to run (default bf16 nvfp4_per_token)");
  add_integer_option<int64_t>(*c, "--batch", a->batch, 1, 1'000'000,
                              "sequences per learner batch and decode batch");
  add_integer_option<int64_t>(*c, "--min-len", a->min_len, 1, 1'000'000,
                              "shortest sequence / prompt");
  add_integer_option<int64_t>(*c, "--max-len", a->max_len, 1, 1'000'000,
                              "longest sequence / prompt");
  add_integer_option<int64_t>(*c, "--new-tokens", a->new_tokens, 1, 1'000'000,
                              "tokens generated per prompt");
  add_integer_option(*c, "--reps", a->reps, 1, 1'000'000, "timed repetitions (median)");
  c->add_option("--baseline", a->baseline,
                "PyTorch baseline JSON (bench/torch_baseline.py): preset, learner_tokens_per_s, "
                "decode_tokens_per_s");
  c->add_flag("--json", a->json, "print JSON");
  c->add_flag("--deterministic", a->deterministic,
              "time the deterministic mode (batch-invariant GEMMs, row-wise attention)");
  add_device_option(*c, a->device);
  c->callback([a] { run_bench_model(*a); });
}

}  // namespace lockstep::cli
