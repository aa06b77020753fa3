// Shared pieces of train, pretrain and compare (train_cli.h).
#include "train_cli.h"

#include <fmt/format.h>

#include <csignal>
#include <ctime>

#include "commands.h"
#include "lockstep/diag/progress.h"
#include "lockstep/model/learner.h"
#include "lockstep/recipe/registry.h"

namespace lockstep::cli {
namespace fs = std::filesystem;

void add_train_options(CLI::App& cmd, TrainArgs& a) {
  rl::TrainOptions& o = a.opt;
  cmd.add_option("--task", o.task, "task (add, sort, reverse, count)")->capture_default_str();
  cmd.add_option("--difficulty", o.difficulty, "task difficulty (add: digits per operand)")
      ->capture_default_str();
  cmd.add_option("--preset", a.preset,
                 "built-in model config (random weights, then the warm start)")
      ->capture_default_str();
  cmd.add_option("--model", a.model_dir,
                 "start from this model directory (config.json + weights) or a run's checkpoint "
                 "folder instead of the preset's warm start");
  cmd.add_option("--steps", o.steps, "RL steps")->capture_default_str();
  cmd.add_flag("--deterministic", o.deterministic,
               "learner forward with the sampler's per-row functions (learner == sampler bits)");
  add_unsigned_option(cmd, "--seed", o.seed, UINT64_MAX,
                      "seed of the model init, prompts, sampling and stochastic rounding");
  cmd.add_option("--prompts", o.prompts, "prompts per step (P)")->capture_default_str();
  cmd.add_option("--group", o.group, "samples per prompt (G, the GRPO group)")
      ->capture_default_str();
  cmd.add_option("--max-new", o.max_new, "tokens per response at most")->capture_default_str();
  cmd.add_option("--temperature", o.temperature, "sampling temperature")->capture_default_str();
  cmd.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  cmd.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str();
  cmd.add_option("--max-grad-norm", o.max_grad_norm, "global gradient-norm clip (0: none)")
      ->capture_default_str();
  cmd.add_option("--minibatches", o.minibatches,
                 "optimizer steps per batch (later ones see ratio != 1)")
      ->capture_default_str();
  cmd.add_option("--kl-coef", o.kl_coef, "k3 KL to the initial policy (always logged)")
      ->capture_default_str();
  cmd.add_option("--tis-cap", o.tis_cap, "TIS weights are clipped to [0, cap]")
      ->capture_default_str();
  cmd.add_option("--repair-margin", o.repair.margin, "TRIAGE repair margin (nats)")
      ->capture_default_str();
  cmd.add_option("--repair-scale", o.repair.scale, "TRIAGE repair pseudo-Huber scale (nats)")
      ->capture_default_str();
  cmd.add_option("--repair-weight", o.repair.weight, "TRIAGE repair weight")->capture_default_str();
  cmd.add_option("--repair-segment", o.repair.segment, "TRIAGE repair segment length (tokens)")
      ->capture_default_str();
  cmd.add_option("--gate-segment", o.gate.segment, "TRIAGE gate segment length (tokens)")
      ->capture_default_str();
  cmd.add_option("--gate-mild-gap", o.gate.mild_gap,
                 "TRIAGE gate: segment mean delta below this gets the mild weight (nats)")
      ->capture_default_str();
  cmd.add_option("--gate-severe-gap", o.gate.severe_gap,
                 "TRIAGE gate: segment mean delta below this gets the severe weight (nats)")
      ->capture_default_str();
  cmd.add_option("--gate-tail-gap", o.gate.tail_gap,
                 "TRIAGE gate: tokens with delta below this are tail tokens (nats)")
      ->capture_default_str();
  cmd.add_option("--gate-mild-weight", o.gate.mild_weight, "TRIAGE gate mild weight")
      ->capture_default_str();
  cmd.add_option("--gate-severe-weight", o.gate.severe_weight, "TRIAGE gate severe weight")
      ->capture_default_str();
  cmd.add_option("--gate-tail1-weight", o.gate.tail1_weight,
                 "TRIAGE gate weight of a segment with one tail token")
      ->capture_default_str();
  cmd.add_option("--gate-tail2-weight", o.gate.tail2_weight,
                 "TRIAGE gate weight of a segment with two or more tail tokens")
      ->capture_default_str();
  cmd.add_option("--kv-cache", o.kv_cache,
                 "the sampler's KV cache: bf16, or fp8 (E4M3 with per-head scales)")
      ->capture_default_str();
  cmd.add_flag("--routing-replay", o.routing_replay,
               "the learner reuses the sampler's expert choices (MoE models)");
  cmd.add_option("--reward", o.reward,
                 "exact (1 for the exact answer, else 0 or the format bonus) or prefix (partial "
                 "credit: the share of the answer written correctly before the first error; "
                 "0 without <eos>)")
      ->capture_default_str();
  cmd.add_option("--format-bonus", o.format_bonus,
                 "reward of a wrong but well-formed answer (0: exact match only)")
      ->capture_default_str();
  cmd.add_option("--eval-every", o.eval_every, "held-out evaluation every N steps")
      ->capture_default_str();
  cmd.add_option("--eval-prompts", o.eval_prompts, "held-out prompts (greedy decoding)")
      ->capture_default_str();
  cmd.add_option("--eval-split", o.eval_split,
                 "heldout (the reported accuracy) or validation (for choosing defaults; never "
                 "tune on the held-out part)")
      ->capture_default_str();
  cmd.add_option("--checkpoint-every", o.checkpoint_every, "checkpoint every N steps")
      ->capture_default_str();
  cmd.add_option("--sampler-batch", o.sampler_batch, "sequences the sampler decodes together")
      ->capture_default_str();
  cmd.add_option("--pretrain-steps", a.pretrain_steps,
                 "warm-start steps (supervised, cached; 0: RL from the random weights)")
      ->capture_default_str();
  cmd.add_option("--pretrain-batch", a.pretrain_batch, "warm-start examples per step")
      ->capture_default_str();
  cmd.add_option("--pretrain-lr", a.pretrain_lr, "warm-start learning rate")->capture_default_str();
  cmd.add_option("--cache-dir", a.cache_dir, "warm-start cache")->capture_default_str();
  cmd.add_option("--log-every", a.log_every, "plain progress line every N steps (not a terminal)")
      ->capture_default_str();
  cmd.add_flag("--json", a.json, "print a JSON summary on stdout at the end");
}

rl::PretrainOptions pretrain_options(const TrainArgs& a) {
  rl::PretrainOptions p;
  p.task = a.opt.task;
  p.difficulty = a.opt.difficulty;
  p.seed = a.opt.seed;
  p.steps = a.pretrain_steps;
  p.batch = a.pretrain_batch;
  p.lr = a.pretrain_lr;
  p.eval_prompts = a.opt.eval_prompts;
  p.eval_max_new = a.opt.max_new;
  return p;
}

std::optional<Recipe> resolve_sampler_recipe(const std::string& arg, const Recipe& learner) {
  if (arg.empty()) return std::nullopt;
  Recipe r;
  try {
    std::error_code ec;
    const bool file = arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".json") == 0;
    r = file || fs::is_regular_file(arg, ec)
            ? load_recipe_file(arg)
            : builtin_recipe_or_throw(arg, "--sampler-recipe").recipe;
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("--sampler-recipe {}: {}", arg, e.what()));
  }
  if (to_json(r) == to_json(learner)) return std::nullopt;
  return r;
}

bool is_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "learner.json", ec);
}

namespace {

model::ModelConfig source_config(const TrainArgs& a) {
  try {
    if (a.model_dir.empty()) return model::preset(a.preset);
    if (is_checkpoint_dir(a.model_dir)) {
      // The config is inside learner.json; loading the checkpoint checks it.
      return model::Learner::load_checkpoint(a.model_dir)->weights().config;
    }
    return model::load_config((fs::path(a.model_dir) / model::kConfigFile).string());
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

void check_model_source(const TrainArgs& a, bool preset_given) {
  if (!a.model_dir.empty() && preset_given)
    throw UsageError("give either --model or --preset, not both");
  const model::ModelConfig c = source_config(a);
  try {
    rl::check_task_model(c, rl::max_sequence_length(a.opt),
                         a.model_dir.empty() ? "preset " + a.preset : a.model_dir);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

InitialPolicy initial_policy(const TrainArgs& a, const Recipe& recipe, bool preset_given) {
  check_model_source(a, preset_given);
  InitialPolicy ip;
  if (!a.model_dir.empty()) {
    if (is_checkpoint_dir(a.model_dir)) {
      const std::unique_ptr<model::Learner> l = model::Learner::load_checkpoint(a.model_dir);
      if (to_json(l->recipe()) != to_json(recipe))
        throw UsageError(fmt::format(
            "--model {}: the checkpoint was trained with recipe '{}', this run uses '{}' (pass "
            "--recipe {}, or start from a model directory)",
            a.model_dir, l->recipe().name, recipe.name, l->recipe().name));
      ip.weights = rl::clone_weights(l->weights());
      ip.meta["model"] = {{"source", "checkpoint"}, {"path", a.model_dir}};
    } else {
      try {
        ip.weights = model::load_model_dir(a.model_dir);
      } catch (const std::exception& e) {
        throw UsageError(e.what());
      }
      ip.meta["model"] = {{"source", "model_dir"}, {"path", a.model_dir}};
    }
    return ip;
  }
  const model::ModelWeights init = model::init_weights(model::preset(a.preset), a.opt.seed);
  ip.meta["model"] = {{"source", "preset"}, {"preset", a.preset}, {"init_seed", a.opt.seed}};
  if (a.pretrain_steps <= 0) {
    ip.weights = init;
    ip.meta["warm_start"] = nullptr;
    return ip;
  }
  const rl::PretrainOptions po = pretrain_options(a);
  diag::ProgressDisplay progress = diag::ProgressDisplay::for_stderr({a.log_every * 10, 20});
  bool announced = false;
  rl::WarmStart ws = rl::cached_warm_start(
      a.cache_dir, init, "preset:" + a.preset, a.opt.seed, po, [&](const rl::PretrainProgress& p) {
        if (!announced) {
          fmt::print(stderr,
                     "warm start: {} supervised steps of {} examples (task {}, difficulty {})\n",
                     p.total, po.batch, po.task, po.difficulty);
          announced = true;
        }
        progress.update({p.step, p.total, p.elapsed_s, std::nullopt, std::nullopt, std::nullopt});
      });
  progress.finish();
  const Json info = Json::parse(ws.info.dump());
  auto acc = [&](const char* k) {
    return info.contains(k) ? info[k].value("accuracy", 0.0) * 100.0 : 0.0;
  };
  fmt::print(stderr, "warm start: {} {} (held-out accuracy {:.1f}% -> {:.1f}%{})\n",
             ws.cached ? "cached" : "stored in", ws.dir.string(), acc("eval_before"),
             acc("eval_after"),
             ws.cached ? "" : fmt::format(", {:.1f} s", info.value("seconds", 0.0)));
  ip.meta["warm_start"] = {{"cached", ws.cached}, {"dir", ws.dir.string()},
                           {"steps", po.steps},   {"batch", po.batch},
                           {"lr", po.lr},         {"recipe", rl::kPretrainRecipe},
                           {"info", info}};
  ip.weights = std::move(ws.weights);
  return ip;
}

namespace {
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_sigint(int) {
  g_stop = 1;
  std::signal(SIGINT, SIG_DFL);  // a second SIGINT ends the process at once
}
}  // namespace

rl::TrainResult run_with_progress(rl::Trainer& t, int64_t log_every) {
  diag::ProgressDisplay progress = diag::ProgressDisplay::for_stderr({log_every, 20});
  std::optional<double> eval_acc;
  rl::TrainCallbacks cb;
  const int64_t total = t.options().steps;
  cb.on_row = [&](const diag::MetricsRow& row) {
    auto num = [&](const char* k) -> std::optional<double> {
      return row.contains(k) && row[k].is_number() ? std::optional<double>(row[k].get<double>())
                                                   : std::nullopt;
    };
    if (auto e = num("eval_accuracy")) eval_acc = e;
    const int64_t step = row["step"].get<int64_t>();
    if (step < 1) return;
    progress.update({step, total, num("elapsed_s").value_or(0.0), num("reward_mean"),
                     eval_acc ? eval_acc : num("accuracy"), num("mean_abs_gap")});
  };
  cb.stop_requested = [] { return g_stop != 0; };
  g_stop = 0;
  struct sigaction sa {
  }, old{};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  rl::TrainResult r;
  try {
    r = t.run(cb);
  } catch (...) {
    sigaction(SIGINT, &old, nullptr);
    throw;
  }
  sigaction(SIGINT, &old, nullptr);
  progress.finish();
  return r;
}

fs::path default_run_dir(const fs::path& parent, const std::string& name) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  const std::string base = std::string(stamp) + "-" + name;
  fs::path p = parent / base;
  std::error_code ec;
  for (int i = 2; fs::exists(p, ec); ++i) p = parent / fmt::format("{}-{}", base, i);
  return p;
}

}  // namespace lockstep::cli
