// The supervised warm start and its cache (include/lockstep/rl/warm_start.h).
#include "lockstep/rl/warm_start.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "dir_util.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/quant/qtensor_io.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/file_io.h"
#include "stopwatch.h"

namespace lockstep::rl {
namespace fs = std::filesystem;

namespace {

using detail::Clock;
using detail::seconds_since;

// Greedy accuracy of the masters' bf16 export on prompts 0 .. prompts - 1 of `split`.
EvalResult eval_policy(const model::ModelWeights& w, const Recipe& recipe, int64_t version,
                       const Task& task, const PretrainOptions& o, Split split, int64_t prompts) {
  model::SamplerConfig sc;
  sc.device = o.device;
  model::Sampler s(sc);
  s.load_policy(model::export_policy(w, recipe, version), version, recipe.name);
  return evaluate_greedy(s, task, o.seed, o.difficulty, prompts, o.eval_max_new,
                         /*max_batch=*/128, split);
}

}  // namespace

model::ModelWeights clone_weights(const model::ModelWeights& w) {
  model::ModelWeights c;
  c.config = w.config;
  for (const auto& [name, t] : w.tensors) c.tensors[name] = t.clone();
  return c;
}

void check_task_model(const model::ModelConfig& c, int64_t min_context, const std::string& where) {
  if (c.vocab_size != kVocabSize)
    throw std::invalid_argument(
        fmt::format("{}: vocab_size is {}; the RL tasks use the {}-token vocabulary (docs/rl.md)",
                    where, c.vocab_size, kVocabSize));
  if (c.max_position_embeddings < min_context)
    throw std::invalid_argument(fmt::format(
        "{}: max_position_embeddings {} is shorter than the longest prompt + response ({} tokens)",
        where, c.max_position_embeddings, min_context));
}

double pretrain_lr(const PretrainOptions& o, int64_t step) {
  if (!(o.lr >= 0.0) || o.warmup_steps < 0 || !(o.min_lr_ratio >= 0.0 && o.min_lr_ratio <= 1.0))
    throw std::invalid_argument(
        fmt::format("warm start: lr {} must be >= 0, warmup steps {} >= 0 and min lr ratio {} in "
                    "[0, 1]",
                    o.lr, o.warmup_steps, o.min_lr_ratio));
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const int64_t decay_steps = o.steps - o.warmup_steps;
  if (decay_steps <= 0) return o.lr;
  const double t = std::min(1.0, double(step - o.warmup_steps) / double(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine);
}

namespace {

void check_pretrain_options(const PretrainOptions& o) {
  if (o.min_difficulty > o.difficulty)
    throw std::invalid_argument(fmt::format("warm start: min difficulty {} above difficulty {}",
                                            o.min_difficulty, o.difficulty));
  if (o.steps < 0 || o.batch < 1)
    throw std::invalid_argument(
        fmt::format("warm start: steps {} must be >= 0 and batch {} >= 1", o.steps, o.batch));
  pretrain_lr(o, 0);  // checks the schedule
  if (!(o.target_accuracy >= 0.0 && o.target_accuracy <= 1.0))
    throw std::invalid_argument(
        fmt::format("warm start: target accuracy {} must be in [0, 1]", o.target_accuracy));
  if (o.target_accuracy > 0.0 && (o.target_every < 1 || o.target_prompts < 1))
    throw std::invalid_argument(
        fmt::format("warm start: with a target accuracy, target_every {} and target_prompts {} "
                    "must be >= 1",
                    o.target_every, o.target_prompts));
}

// The packed batch of step `step`: examples kPretrainIndexBase + step * batch + i of the train
// part, prompt + answer + <eos>, the answer and <eos> the targets.
PackedSequences pretrain_batch(const Task& task, const PretrainOptions& o, int64_t step) {
  std::vector<Example> ex;
  std::vector<std::vector<int32_t>> answers;
  for (int64_t i = 0; i < o.batch; ++i) {
    const uint64_t index = uint64_t(step * o.batch + i);
    const int lo = o.min_difficulty > 0 ? o.min_difficulty : o.difficulty;
    const int d = lo + int(index % uint64_t(o.difficulty - lo + 1));
    ex.push_back(task.make(o.seed, kPretrainIndexBase + index, d, Split::kTrain));
    answers.push_back(ex.back().answer);
    answers.back().push_back(kEos);
  }
  std::vector<SequenceView> seqs;
  for (size_t i = 0; i < ex.size(); ++i) seqs.push_back({ex[i].prompt, answers[i]});
  return pack_sequences(seqs);
}

}  // namespace

PretrainResult pretrain(const model::ModelWeights& init, const PretrainOptions& o,
                        const std::function<void(const PretrainProgress&)>& on_step) {
  const Task& task = find_task(o.task);
  check_pretrain_options(o);
  const Example probe = task.make(o.seed, kPretrainIndexBase, o.difficulty, Split::kTrain);
  check_task_model(init.config, int64_t(probe.prompt.size() + probe.answer.size()) + 1, "model");
  const Recipe recipe = builtin_recipe_or_throw(kPretrainRecipe, "warm start").recipe;
  model::LearnerConfig lc;
  lc.adamw.lr = pretrain_lr(o, 0);
  lc.adamw.weight_decay = o.weight_decay;
  lc.max_grad_norm = o.max_grad_norm;
  lc.mode = model::ExecMode::kFast;
  lc.seed = o.seed;
  lc.device = o.device;
  model::Learner learner(init, recipe, lc);

  const Clock::time_point t0 = Clock::now();
  PretrainResult res;
  res.before = eval_policy(learner.weights(), recipe, learner.version(), task, o, Split::kEval,
                           o.eval_prompts);
  for (int64_t step = 0; step < o.steps; ++step) {
    const PackedSequences p = pretrain_batch(task, o, step);
    const int64_t n = int64_t(p.tokens.size());
    const model::LearnerOutput out =
        learner.forward(Tensor::from_vector<int32_t>(p.tokens, {n}, DType::kI32), p.cu_seqlens,
                        Tensor::from_vector<int32_t>(p.targets, {n}, DType::kI32));
    // loss = mean over answer tokens of -logp: d loss / d logp = -1 / T on those rows.
    const std::span<const float> logp = out.logp.data<float>();  // host (LearnerOutput)
    std::vector<float> dlogp(size_t(n), 0.0f);
    const float g = -1.0f / float(p.rows.size());
    double loss = 0.0;
    for (int64_t r : p.rows) {
      dlogp[size_t(r)] = g;
      loss -= double(logp[size_t(r)]);
    }
    loss /= double(p.rows.size());
    learner.backward(Tensor::from_vector<float>(dlogp, {n}, DType::kF32), Tensor());
    const double lr = pretrain_lr(o, step);
    learner.set_lr(lr);
    const model::StepStats st = learner.step();
    res.final_loss = loss;
    res.steps_done = step + 1;
    PretrainProgress pp{step + 1, o.steps, loss, st.grad_norm, lr, seconds_since(t0), {}, {}};
    if (o.target_accuracy > 0.0 && (step + 1) % o.target_every == 0) {
      res.validation = eval_policy(learner.weights(), recipe, learner.version(), task, o,
                                   Split::kValidation, o.target_prompts);
      res.target_reached = res.validation->accuracy >= o.target_accuracy;
      pp.validation_accuracy = res.validation->accuracy;
    }
    if (on_step) {
      if (o.eval_every > 0 && (step + 1) % o.eval_every == 0)
        pp.eval_accuracy = eval_policy(learner.weights(), recipe, learner.version(), task, o,
                                       Split::kEval, o.eval_prompts)
                               .accuracy;
      on_step(pp);
    }
    if (res.target_reached) break;
  }
  res.after = eval_policy(learner.weights(), recipe, learner.version(), task, o, Split::kEval,
                          o.eval_prompts);
  for (const auto& [name, t] : learner.weights().tensors)
    res.weights.tensors[name] = t.to(Device::cpu()).clone();
  res.weights.config = learner.weights().config;
  res.seconds = seconds_since(t0);
  return res;
}

std::string warm_start_device(Device d) {
  if (d.is_cpu()) return "cpu";
  const DeviceReport r = query_devices();
  for (const GpuInfo& g : r.gpus)
    if (g.index == d.index)
      return fmt::format("cuda {} sm_{}{} ({} SMs)", g.name, g.cc_major, g.cc_minor, g.sm_count);
  return d.str();
}

Json warm_start_key(const model::ModelConfig& config, const std::string& init_source,
                    uint64_t init_seed, const PretrainOptions& o) {
  Json k;
  k["procedure"] = "lockstep.warm_start/4";
  // Another device sums in another order, so its warm start has other bits (and, near the loss
  // plateau, another outcome): each device kind has its own entry.
  k["device"] = warm_start_device(o.device);
  k["contract"] = kContractVersion;
  k["config"] = model::config_to_json(config);
  k["init_source"] = init_source;
  k["init_seed"] = init_seed;
  k["task"] = o.task;
  k["difficulty"] = o.difficulty;
  k["min_difficulty"] = o.min_difficulty;
  k["seed"] = o.seed;
  k["steps"] = o.steps;
  k["batch"] = o.batch;
  k["lr"] = o.lr;
  k["warmup_steps"] = o.warmup_steps;
  k["min_lr_ratio"] = o.min_lr_ratio;
  k["weight_decay"] = o.weight_decay;
  k["max_grad_norm"] = o.max_grad_norm;
  // The targeted stop decides how many steps run: its target and its evaluation are inputs.
  k["target_accuracy"] = o.target_accuracy;
  if (o.target_accuracy > 0.0) {
    k["target_every"] = o.target_every;
    k["target_prompts"] = o.target_prompts;
    k["target_max_new"] = o.eval_max_new;
  }
  k["recipe"] = to_json(builtin_recipe_or_throw(kPretrainRecipe, "warm start").recipe);
  return k;
}

std::string warm_start_hash(const Json& key) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char ch : key.dump()) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

void save_warm_start(const fs::path& dir, const model::ModelWeights& weights, const Json& info) {
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  fs::create_directories(parent);
  const fs::path tmp = detail::make_temp_dir(parent, dir.filename().string());
  try {
    model::save_model_dir(weights, tmp.string());
    write_file_atomic((tmp / "warm_start.json").string(), info.dump(2) + "\n");
    detail::fsync_dir_tree(tmp);
    detail::replace_dir(tmp, dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

namespace {
// warm_start.json of a cache entry, or null when it is missing or unreadable.
Json read_info(const fs::path& dir) {
  try {
    return parse_json(read_input_file((dir / "warm_start.json").string()));
  } catch (const std::exception&) {
    return nullptr;
  }
}

Json eval_json(const EvalResult& e) {
  return {{"accuracy", e.accuracy}, {"correct", e.correct}, {"prompts", e.prompts}};
}
}  // namespace

Json pretrain_result_json(const PretrainResult& r, const PretrainOptions& o) {
  Json j = {{"eval_before", eval_json(r.before)}, {"eval_after", eval_json(r.after)},
            {"eval_max_new", o.eval_max_new},     {"steps_done", r.steps_done},
            {"final_loss", r.final_loss},         {"seconds", r.seconds}};
  if (o.target_accuracy > 0.0 && o.steps > 0)  // steps 0: the weights as given, nothing to stop
    j["target"] = {{"accuracy", o.target_accuracy},
                   {"reached", r.target_reached},
                   {"validation", r.validation ? eval_json(*r.validation) : Json()}};
  return j;
}

CachedWarmStart find_cached_warm_start(const fs::path& cache_root, const model::ModelConfig& config,
                                       const std::string& init_source, uint64_t init_seed,
                                       const PretrainOptions& o) {
  const Json key = warm_start_key(config, init_source, init_seed, o);
  CachedWarmStart c;
  c.dir = cache_root / warm_start_hash(key);
  const Json info = read_info(c.dir);
  c.present = info.is_object() && info.value("key", Json()) == key;
  return c;
}

WarmStart cached_warm_start(const fs::path& cache_root, const model::ModelWeights& init,
                            const std::string& init_source, uint64_t init_seed,
                            const PretrainOptions& o,
                            const std::function<void(const PretrainProgress&)>& on_step) {
  const Json key = warm_start_key(init.config, init_source, init_seed, o);
  const std::string hash = warm_start_hash(key);
  WarmStart ws;
  ws.dir = cache_root / hash;
  const Json info = read_info(ws.dir);
  if (info.is_object() && info.value("key", Json()) == key) {
    try {
      ws.weights = model::load_model_dir(ws.dir.string());
      if (ws.weights.config == init.config) {
        ws.cached = true;
        ws.info = info;
        return ws;
      }
    } catch (const std::exception&) {
      // A damaged entry: trained again below and replaced.
    }
  }
  PretrainResult r = pretrain(init, o, on_step);
  ws.info = {{"key", key}, {"hash", hash}};
  ws.info.update(pretrain_result_json(r, o));
  // Another process may have stored the same entry meanwhile: its bits are the same.
  const Json now = read_info(ws.dir);
  if (!(now.is_object() && now.value("key", Json()) == key))
    save_warm_start(ws.dir, r.weights, ws.info);
  ws.weights = std::move(r.weights);
  return ws;
}

}  // namespace lockstep::rl
