// `lockstep bench model`: learner forward+backward tokens/s, AdamW step time, sampler decode
// tokens/s and policy export time per preset and recipe on the CPU or a GPU, saved-operand bytes
// per backward mode, and the ratio to a PyTorch fp32 eager baseline (bench/torch_baseline.py JSON).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "commands.h"
#include "gemm_bench.h"
#include "lockstep/model/decoder.h"
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
  std::vector<int64_t> decode_batches;  // empty: {batch}
  int64_t prompt_len = 0;               // decode prompts; 0: the learner's lengths
  std::vector<std::string> parts{"learner", "export", "decode", "saved"};
  int reps = 5;
  std::string baseline;
  std::string device = "auto";
  bool deterministic = false;
  bool no_graphs = false;
  bool no_overlap = false;
  bool graph_nodes = false;
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

struct DecodeRow {
  int64_t batch = 0;
  double tps = 0, step_ms = 0, prefill_tps = 0, base = 0;
  double replay_ms = 0;  // the recorded step replayed back to back (0: no graph)
  int64_t graph_replays = 0;
  std::string graphs_off;
  GraphNodes nodes;  // the recorded decode step's graph (zero when steps run call by call)
};

struct Row {
  std::string preset, recipe;
  double learner_tps = 0, learner_tflops = 0, step_ms = 0, export_ms = 0, export_bf16_ms = 0;
  double base_learner = 0;
  double step1_bytes = 0;  // weight bytes a batch-1 decode step reads (experts: top-k of E)
  std::vector<DecodeRow> decode;
};

// Matmul FLOPs of one learner forward + backward over packed sequences of `lens` tokens: 6 per
// active weight per token (routed experts: top-k of them; the router, the shared expert and the
// lm_head included) and 12 hq D per (query, key) pair of causal attention (QK^T and PV, forward
// once, backward twice).
double learner_flops(const model::ModelConfig& c, std::span<const int64_t> lens) {
  const double H = double(c.hidden_size), D = double(c.head_dim);
  const double q = double(c.num_attention_heads) * D, kv = double(c.num_key_value_heads) * D;
  double active = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    active += H * (q + 2 * kv) + q * H;  // qkv, o_proj
    if (c.layer_is_moe(l)) {
      active += H * double(c.num_experts) +
                3.0 * H * double(c.moe_intermediate_size) * double(c.num_experts_per_tok);
      if (c.shared_expert_intermediate_size > 0)
        active += 3.0 * H * double(c.shared_expert_intermediate_size) + H;
    } else {
      active += 3.0 * H * double(c.intermediate_size);
    }
  }
  active += H * double(c.vocab_size);  // lm_head
  double tokens = 0, pairs = 0;
  for (const int64_t L : lens) {
    tokens += double(L);
    pairs += double(L) * double(L + 1) / 2;
  }
  return 6.0 * active * tokens + 12.0 * q * double(c.num_hidden_layers) * pairs;
}

// Weight bytes one decode step of a single sequence reads: every operand, the routed experts' at
// top-k / E of their size (the embedding row and the norms are negligible and left out).
double step1_weight_bytes(const model::ModelConfig& c, const model::PolicyVersion& p) {
  double bytes = 0;
  for (const model::LinearSite& site : model::linear_sites(c)) {
    const std::string key = site.cls == ModuleClass::kLmHead ? "lm_head" : site.name;
    const auto it = p.operands.find(key);
    if (it == p.operands.end()) continue;
    const double share =
        site.groups > 1 ? double(c.num_experts_per_tok) / double(site.groups) : 1.0;
    bytes += double(it->second.nbytes()) * share;
  }
  return bytes;
}

// Decode tokens/s of `reqs` through `sampler` (configured with max_new = new_tokens): runs of
// new_tokens and of 1 token interleaved, the median of their differences, so the prefill and the
// first token are excluded and a change of machine load between the series does not land in the
// difference (no eos: every sequence generates exactly new_tokens).
DecodeRow decode_rate(model::Sampler& sampler, const model::SamplerConfig& sc,
                      std::span<const model::SampleRequest> reqs, int64_t prompt_tokens, int reps) {
  model::SamplerConfig one = sc;
  one.max_new = 1;
  sampler.set_config(sc);
  const int64_t captures0 = sampler.stats().graph_captures;
  sampler.generate(reqs);  // warm-up (and the decode graphs of this batch)
  const int64_t replays0 = sampler.stats().graph_replays;
  // The nodes of the step this warm-up recorded (none when it recorded nothing).
  const GraphNodes nodes =
      sampler.stats().graph_captures > captures0 ? sampler.stats().graph_nodes : GraphNodes{};
  std::vector<double> diffs, ones;
  for (int i = 0; i < reps; ++i) {
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
  DecodeRow d;
  d.batch = int64_t(reqs.size());
  const double steps = double(sc.max_new - 1);
  d.tps = t_dec > 0 ? double(d.batch) * steps / t_dec : 0.0;
  d.step_ms = steps > 0 ? 1e3 * t_dec / steps : 0.0;
  d.prefill_tps = double(prompt_tokens) / t_one;
  d.graph_replays = sampler.stats().graph_replays - replays0;
  d.replay_ms = 1e3 * sampler.replayed_step_seconds(d.batch, 50);
  d.graphs_off = sampler.stats().graphs_off;
  d.nodes = nodes;
  return d;
}

Json read_baseline(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("cannot read baseline file '{}'", path));
  Json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("baseline '{}' is not JSON: {}", path, e.what()));
  }
  if (j.is_object() && j.value("schema", std::string()) == "lockstep.hf_gpu_baseline/1") {
    // bench/hf_gpu_baseline.py: the best learner rate, and one row per decode batch.
    Json rows = Json::array();
    double learner = 0;
    for (const Json& l : j.value("learner", Json::array()))
      learner = std::max(learner, l.value("tokens_per_s", 0.0));
    rows.push_back({{"preset", j.value("preset", "")}, {"learner_tokens_per_s", learner}});
    for (const Json& d : j.value("decode", Json::array()))
      rows.push_back({{"preset", j.value("preset", "")},
                      {"decode_batch", d.value("batch", int64_t(0))},
                      {"decode_tokens_per_s", d.value("tokens_per_s", 0.0)}});
    return rows;
  }
  if (j.is_object() && j.contains("results")) j = j["results"];
  if (j.is_object()) j = Json::array({j});
  if (!j.is_array()) throw UsageError(fmt::format("baseline '{}': want a list of results", path));
  return j;
}

void run_bench_model(const BenchModelArgs& a) {
  const Device dev = device_flag(a.device);
  for (const std::string& p : a.parts)
    if (p != "learner" && p != "export" && p != "decode" && p != "saved")
      throw UsageError(
          fmt::format("--parts: '{}' is not one of learner, export, decode, saved", p));
  auto want = [&](std::string_view p) {
    return std::find(a.parts.begin(), a.parts.end(), p) != a.parts.end();
  };
  const Json base = a.baseline.empty() ? Json::array() : read_baseline(a.baseline);
  bench::DeviceRates rates;
#if defined(LOCKSTEP_HAVE_CUDA)
  if (dev.is_cuda()) rates = bench::measure_device_rates();
#endif
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
      Row r;
      r.preset = pname;
      r.recipe = rname;
      model::LearnerConfig lc;
      lc.mode = a.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
      lc.device = dev;
      const auto t_row = std::chrono::steady_clock::now();
      auto progress = [&](const char* what) {
        fmt::print(stderr, "bench model {} {}: {} ({:.1f} s)\n", pname, rname, what,
                   seconds_since(t_row));
      };
      model::Learner learner(w, recipe, lc);
      if (want("learner")) {
        const double t_fb = median_seconds(a.reps, [&] {
          learner.forward(idt, cu, tgt);
          learner.backward(dlogp, Tensor());
          synchronize(dev);
        });
        r.learner_tps = double(n) / t_fb;
        r.learner_tflops = learner_flops(cfg, lens) / t_fb * 1e-12;
        r.step_ms = 1e3 * median_seconds(a.reps, [&] { learner.step(); });
        progress("learner timed");
      }
      if (want("export")) {
        r.export_ms = 1e3 * median_seconds(a.reps, [&] {
                        model::export_policy(learner.weights(), recipe, learner.version());
                      });
        r.export_bf16_ms = 1e3 * median_seconds(a.reps, [&] {
                             model::export_policy(learner.weights(), recipe, learner.version(),
                                                  {.force_bf16 = true});
                           });
        progress("export timed");
      }
      // The sampler's policy is the learner's current version (after the timed steps).
      model::PolicyVersion policy =
          model::export_policy(learner.weights(), recipe, learner.version());
      r.step1_bytes = step1_weight_bytes(cfg, policy);
      model::SamplerConfig sc;
      sc.max_new = a.new_tokens;
      sc.device = dev;
      sc.cuda_graphs = !a.no_graphs;
      sc.overlap_steps = !a.no_overlap;
      sc.mode = lc.mode;
      model::Sampler sampler(sc);
      sampler.load_policy(std::move(policy), learner.version(), recipe.name);
      std::vector<int64_t> decode_batches = a.decode_batches;
      if (decode_batches.empty()) decode_batches.push_back(a.batch);
      if (!want("decode")) decode_batches.clear();
      for (const int64_t db : decode_batches) {
        std::vector<model::SampleRequest> reqs(static_cast<size_t>(db));
        int64_t prompt_tokens = 0;
        for (int64_t b = 0; b < db; ++b) {
          const int64_t len =
              a.prompt_len > 0 ? a.prompt_len : a.min_len + (7 * b) % (a.max_len - a.min_len + 1);
          reqs[size_t(b)].stream = uint32_t(b);
          for (int64_t j = 0; j < len; ++j)
            reqs[size_t(b)].prompt.push_back(rand_id(uint64_t(b * 1000 + j), cfg.vocab_size));
          prompt_tokens += len;
        }
        sc.max_batch = db;
        DecodeRow d = decode_rate(sampler, sc, reqs, prompt_tokens, a.reps);
        for (const auto& b : base)
          if (b.value("preset", std::string()) == pname && b.value("decode_batch", a.batch) == db)
            d.base = b.value("decode_tokens_per_s", 0.0);
        r.decode.push_back(d);
        progress(fmt::format("decode batch {} timed", db).c_str());
      }
      for (const auto& b : base)
        if (b.value("preset", std::string()) == pname && b.contains("learner_tokens_per_s"))
          r.base_learner = b.value("learner_tokens_per_s", 0.0);
      rows.push_back(r);
    }
    // Saved-operand bytes of one forward per backward mode (nvfp4_per_token family).
    if (want("saved"))
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
  const double copy_gbps = rates.copy_gbps, peak = rates.bf16_tflops;
  // The batch-1 step against the time to read its weights once at the measured copy bandwidth.
  auto read_ms = [&](const Row& r) {
    return copy_gbps > 0 ? r.step1_bytes / copy_gbps * 1e-6 : 0.0;
  };
  auto step1_ratio = [&](const Row& r) {
    for (const DecodeRow& d : r.decode)
      if (d.batch == 1 && read_ms(r) > 0) return d.step_ms / read_ms(r);
    return 0.0;
  };
  auto ratio = [](double x, double base) { return base > 0 ? x / base : 0.0; };
  if (a.json) {
    Json j;
    j["batch"] = a.batch;
    j["lengths"] = {a.min_len, a.max_len};
    j["new_tokens"] = a.new_tokens;
    j["threads"] = omp_get_max_threads();
    j["device"] = dev.str();
    j["mode"] = a.deterministic ? "deterministic" : "fast";
    j["cuda_graphs"] = !a.no_graphs;
    j["overlap_steps"] = !a.no_overlap;
    j["copy_gbps"] = copy_gbps;
    j["bf16_tflops"] = peak;
    j["results"] = Json::array();
    for (const Row& r : rows) {
      Json dec = Json::array();
      for (const DecodeRow& d : r.decode)
        dec.push_back({{"batch", d.batch},
                       {"tokens_per_s", d.tps},
                       {"step_ms", d.step_ms},
                       {"replayed_step_ms", d.replay_ms},
                       {"prefill_tokens_per_s", d.prefill_tps},
                       {"ratio_to_torch", ratio(d.tps, d.base)},
                       {"graph_replays", d.graph_replays},
                       {"graph_nodes",
                        {{"total", d.nodes.total()},
                         {"kernels", d.nodes.kernels},
                         {"copies", d.nodes.copies},
                         {"memsets", d.nodes.memsets},
                         {"allocs", d.nodes.allocs},
                         {"other", d.nodes.other},
                         {"by_kernel", d.nodes.by_kernel}}},
                       {"graphs_off", d.graphs_off}});
      j["results"].push_back({{"preset", r.preset},
                              {"recipe", r.recipe},
                              {"learner_tokens_per_s", r.learner_tps},
                              {"learner_tflops", r.learner_tflops},
                              {"mfu", ratio(r.learner_tflops, peak)},
                              {"learner_ratio_to_torch", ratio(r.learner_tps, r.base_learner)},
                              {"step_ms", r.step_ms},
                              {"export_ms", r.export_ms},
                              {"export_bf16_ms", r.export_bf16_ms},
                              {"step1_weight_bytes", r.step1_bytes},
                              {"step1_read_ms", read_ms(r)},
                              {"step1_ratio_to_read", step1_ratio(r)},
                              {"decode", dec}});
    }
    j["saved_operands"] = saved;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(
      "lockstep bench model ({}, {} threads, {} mode; learner: {} sequences of {}-{} tokens; "
      "decode "
      "{} new tokens each, prefill excluded, CUDA graphs {}, steps overlapped {})\n",
      dev.str(), omp_get_max_threads(), a.deterministic ? "deterministic" : "fast", a.batch,
      a.min_len, a.max_len, a.new_tokens, a.no_graphs || !dev.is_cuda() ? "off" : "on",
      a.no_graphs || a.no_overlap || !dev.is_cuda() ? "no" : "yes");
  if (peak > 0)
    fmt::print("measured now: copy {:.0f} GB/s, cuBLAS bf16 {:.0f} TFLOP/s (MFU's denominator)\n",
               copy_gbps, peak);
  const bool learner_table = want("learner") || want("export");
  if (learner_table)
    fmt::print("{:<16} {:<17} {:>13} {:>8} {:>8} {:>6} {:>9} {:>10} {:>9}\n", "preset", "recipe",
               "learner tok/s", "x torch", "TFLOP/s", "MFU", "step ms", "export ms", "bf16 ms");
  for (const Row& r : rows)
    if (learner_table)
      fmt::print("{:<16} {:<17} {:>13.0f} {:>8} {:>8.1f} {:>6} {:>9.2f} {:>10.2f} {:>9.2f}\n",
                 r.preset, r.recipe, r.learner_tps,
                 r.base_learner > 0 ? fmt::format("{:.2f}", r.learner_tps / r.base_learner) : "-",
                 r.learner_tflops,
                 peak > 0 ? fmt::format("{:.1f}%", 100.0 * r.learner_tflops / peak) : "-",
                 r.step_ms, r.export_ms, r.export_bf16_ms);
  fmt::print("{:<16} {:<17} {:>6} {:>12} {:>9} {:>9} {:>8} {:>9} {:>6}\n", "preset", "recipe",
             "batch", "decode tok/s", "step ms", "replay ms", "x torch", "replays", "nodes");
  for (const Row& r : rows)
    for (const DecodeRow& d : r.decode)
      fmt::print("{:<16} {:<17} {:>6} {:>12.0f} {:>9.3f} {:>9} {:>8} {:>9} {:>6}\n", r.preset,
                 r.recipe, d.batch, d.tps, d.step_ms,
                 d.replay_ms > 0 ? fmt::format("{:.3f}", d.replay_ms) : "-",
                 d.base > 0 ? fmt::format("{:.2f}", d.tps / d.base) : "-", d.graph_replays,
                 d.nodes.total());
  if (want("decode") && dev.is_cuda())
    fmt::print(
        "replay ms: the recorded decode step replayed 50 times back to back (device time, no host "
        "work between steps); step ms adds the host's part of each step\n");
  if (a.graph_nodes)
    for (const Row& r : rows)
      for (const DecodeRow& d : r.decode) {
        if (d.nodes.total() == 0) continue;
        fmt::print(
            "{} {} batch {}: {} graph nodes ({} kernels, {} copies, {} memsets, {} allocs, {} "
            "other)\n",
            r.preset, r.recipe, d.batch, d.nodes.total(), d.nodes.kernels, d.nodes.copies,
            d.nodes.memsets, d.nodes.allocs, d.nodes.other);
        std::vector<std::pair<int64_t, std::string>> by;
        for (const auto& [name, n] : d.nodes.by_kernel) by.emplace_back(-n, name);
        std::sort(by.begin(), by.end());
        for (const auto& [n, name] : by) fmt::print("  {:>5}  {}\n", -n, name);
      }
  for (const Row& r : rows)
    if (step1_ratio(r) > 0)
      fmt::print(
          "{} {}: a batch-1 step reads {:.1f} MB of weights, {:.3f} ms at copy bandwidth; "
          "the step takes {:.2f}x that\n",
          r.preset, r.recipe, r.step1_bytes * 1e-6, read_ms(r), step1_ratio(r));
  for (const Row& r : rows)
    for (const DecodeRow& d : r.decode)
      if (!d.graphs_off.empty())
        fmt::print("{} {} batch {}: decode steps ran without graphs: {}\n", r.preset, r.recipe,
                   d.batch, d.graphs_off);
  fmt::print("saved operands of one learner forward:\n");
  for (const auto& sv : saved)
    fmt::print("  {:<16} {:<28} {:>10} bytes\n", sv["preset"].get<std::string>(),
               sv["recipe"].get<std::string>(), sv["saved_bytes"].get<size_t>());
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
  c->add_option("--decode-batch", a->decode_batches,
                "decode batch sizes to time (default: --batch)")
      ->check(CLI::Range(int64_t(1), int64_t(1'000'000)));
  add_integer_option<int64_t>(*c, "--prompt-len", a->prompt_len, 0, 1'000'000,
                              "decode prompt tokens (default 0: the learner's sequence lengths)");
  c->add_option("--parts", a->parts,
                "what to time: any of learner export decode saved (default all)");
  add_integer_option(*c, "--reps", a->reps, 1, 1'000'000, "timed repetitions (median)");
  c->add_option("--baseline", a->baseline,
                "PyTorch baseline JSON (bench/torch_baseline.py): preset, learner_tokens_per_s, "
                "decode_tokens_per_s");
  c->add_flag("--json", a->json, "print JSON");
  c->add_flag("--deterministic", a->deterministic,
              "time the deterministic mode (batch-invariant GEMMs, row-wise attention)");
  c->add_flag("--no-cuda-graphs", a->no_graphs,
              "run every decode step call by call (the CUDA-graph replay's baseline)");
  c->add_flag("--no-overlap", a->no_overlap,
              "read each decode step's tokens before queuing the next (the overlap's baseline)");
  c->add_flag("--graph-nodes", a->graph_nodes,
              "list each recorded decode step's graph nodes by kernel (the table counts them)");
  add_device_option(*c, a->device);
  c->callback([a] { run_bench_model(*a); });
}

}  // namespace lockstep::cli
