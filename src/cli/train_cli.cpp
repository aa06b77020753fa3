// Shared pieces of train, pretrain and compare (train_cli.h): flags, output checks, the initial
// policy with its progress display, and the trainer's progress display.
#include "train_cli.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <ctime>

#include "commands.h"
#include "lockstep/diag/progress.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/rl/task.h"

namespace lockstep::cli {

std::string task_help() { return fmt::format("task ({})", fmt::join(rl::task_names(), ", ")); }

namespace fs = std::filesystem;

namespace {
constexpr int64_t kMaxCount = 1'000'000'000;  // the upper bound of count flags
}  // namespace

void add_train_options(CLI::App& cmd, TrainArgs& a) {
  rl::TrainOptions& o = a.opt;
  a.cmd = &cmd;
  cmd.add_option("--task", o.task, task_help())->capture_default_str();
  add_integer_option(cmd, "--difficulty", o.difficulty, 0, 1000,
                     "task difficulty (add: digits per operand)");
  cmd.add_option("--preset", a.preset,
                 fmt::format("built-in model config (random weights, then the warm start); on a "
                             "GPU the default is {}, with --lr {:g}, --pretrain-lr {:g}, "
                             "--eval-prompts {}, --checkpoint-every {}",
                             GpuMainJob::kPreset, GpuMainJob::kLr, GpuMainJob::kWarmLr,
                             GpuMainJob::kEvalPrompts, GpuMainJob::kCheckpointEvery))
      ->capture_default_str();
  cmd.add_option("--model", a.model_dir,
                 "start from this model directory (config.json + weights) or a run's checkpoint "
                 "folder instead of the preset's warm start");
  add_integer_option<int64_t>(cmd, "--steps", o.steps, 0, kMaxCount, "RL steps");
  cmd.add_flag("--deterministic", o.deterministic,
               "learner forward with the sampler's per-row functions (learner == sampler bits)");
  add_unsigned_option(cmd, "--seed", o.seed, UINT64_MAX,
                      "seed of the model init, prompts, sampling and stochastic rounding");
  add_integer_option<int64_t>(cmd, "--prompts", o.prompts, 1, 1'000'000, "prompts per step (P)");
  add_integer_option<int64_t>(cmd, "--group", o.group, 1, 1'000'000,
                              "samples per prompt (G, the GRPO group; at least 2)");
  add_integer_option<int64_t>(cmd, "--max-new", o.max_new, 1, 1'000'000,
                              "tokens per response at most");
  add_real_option(cmd, "--temperature", o.temperature, 0.0, 100.0, true, "sampling temperature");
  add_real_option(cmd, "--lr", o.lr, 0.0, 1.0, true, "AdamW learning rate");
  add_real_option(cmd, "--weight-decay", o.weight_decay, 0.0, 1.0, false, "AdamW weight decay");
  add_real_option(cmd, "--max-grad-norm", o.max_grad_norm, 0.0, 1e9, false,
                  "global gradient-norm clip (0: none)");
  add_integer_option<int64_t>(cmd, "--minibatches", o.minibatches, 1, 1'000'000,
                              "optimizer steps per batch (later ones see ratio != 1)");
  add_integer_option<int64_t>(
      cmd, "--grad-slots", o.grad_slots, 1, 1'000'000,
      "gradient slots M per minibatch: its responses cut into M fixed parts, one backward each, "
      "summed in a fixed pairwise tree (a power of two; with N learner ranks a multiple of N). "
      "The same M gives the same bits on 1, 2, 4, ... ranks; 1: one backward per minibatch");
  add_real_option(cmd, "--kl-coef", o.kl_coef, 0.0, 1e3, false,
                  "k3 KL to the initial policy (always logged)");
  add_real_option(cmd, "--tis-cap", o.tis_cap, 0.0, 1e6, true,
                  "TIS weights are clipped to [0, cap]");
  add_real_option(cmd, "--repair-margin", o.repair.margin, -1e3, 1e3, false,
                  "TRIAGE repair margin (nats)");
  add_real_option(cmd, "--repair-scale", o.repair.scale, 0.0, 1e3, true,
                  "TRIAGE repair pseudo-Huber scale (nats)");
  add_real_option(cmd, "--repair-weight", o.repair.weight, 0.0, 1e3, false, "TRIAGE repair weight");
  add_integer_option<int64_t>(cmd, "--repair-segment", o.repair.segment, 1, 1'000'000,
                              "TRIAGE repair segment length (tokens)");
  add_integer_option<int64_t>(cmd, "--gate-segment", o.gate.segment, 1, 1'000'000,
                              "TRIAGE gate segment length (tokens)");
  add_real_option(cmd, "--gate-mild-gap", o.gate.mild_gap, -1e3, 1e3, false,
                  "TRIAGE gate: segment mean delta below this gets the mild weight (nats)");
  add_real_option(cmd, "--gate-severe-gap", o.gate.severe_gap, -1e3, 1e3, false,
                  "TRIAGE gate: segment mean delta below this gets the severe weight (nats)");
  add_real_option(cmd, "--gate-tail-gap", o.gate.tail_gap, -1e3, 1e3, false,
                  "TRIAGE gate: tokens with delta below this are tail tokens (nats)");
  add_real_option(cmd, "--gate-mild-weight", o.gate.mild_weight, 0.0, 1.0, false,
                  "TRIAGE gate mild weight");
  add_real_option(cmd, "--gate-severe-weight", o.gate.severe_weight, 0.0, 1.0, false,
                  "TRIAGE gate severe weight");
  add_real_option(cmd, "--gate-tail1-weight", o.gate.tail1_weight, 0.0, 1.0, false,
                  "TRIAGE gate weight of a segment with one tail token");
  add_real_option(cmd, "--gate-tail2-weight", o.gate.tail2_weight, 0.0, 1.0, false,
                  "TRIAGE gate weight of a segment with two or more tail tokens");
  cmd.add_option("--kv-cache", o.kv_cache,
                 "the sampler's KV cache: bf16, or fp8 (E4M3 with per-head scales)")
      ->capture_default_str();
  cmd.add_option("--learner-kv", o.learner_kv,
                 "the learner's K / V rounding: bf16, or match (round like the sampler's cache, "
                 "so --kv-cache fp8 adds no gap)")
      ->capture_default_str();
  cmd.add_flag("--routing-replay", o.routing_replay,
               "the learner reuses the sampler's expert choices (MoE models)");
  cmd.add_option("--reward", o.reward,
                 "exact (1 for the exact answer, else 0 or the format bonus) or prefix (partial "
                 "credit: the share of the answer written correctly before the first error; "
                 "0 without <eos>)")
      ->capture_default_str();
  add_real_option(cmd, "--format-bonus", o.format_bonus, 0.0, 1.0, false,
                  "reward of a wrong but well-formed answer (0: exact match only)");
  add_integer_option<int64_t>(cmd, "--eval-every", o.eval_every, 1, kMaxCount,
                              "held-out evaluation every N steps");
  add_integer_option<int64_t>(cmd, "--eval-prompts", o.eval_prompts, 0, 1'000'000,
                              "held-out prompts (greedy decoding)");
  cmd.add_option("--eval-split", o.eval_split,
                 "heldout (the reported accuracy) or validation (for choosing defaults; never "
                 "tune on the held-out part)")
      ->capture_default_str();
  add_integer_option<int64_t>(cmd, "--checkpoint-every", o.checkpoint_every, 1, kMaxCount,
                              "checkpoint every N steps");
  add_integer_option<int64_t>(cmd, "--sampler-batch", o.sampler_batch, 1, 1'000'000,
                              "sequences the sampler decodes together");
  add_warm_start_options(cmd, a.warm, "--pretrain-");
  cmd.add_option("--cache-dir", a.cache_dir, "warm-start cache")->capture_default_str();
  add_device_option(cmd, a.device);
  add_integer_option<int64_t>(cmd, "--log-every", a.log_every, 1, kMaxCount,
                              "plain progress line every N steps (not a terminal)");
  cmd.add_flag("--json", a.json, "print a JSON summary on stdout at the end");
  cmd.add_flag("--dry-run", a.dry_run,
               "check every input and output, print what the run would do; write nothing");
}

void add_warm_start_options(CLI::App& cmd, rl::PretrainOptions& o, const std::string& prefix) {
  add_integer_option<int64_t>(
      cmd, prefix + "steps", o.steps, 0, kMaxCount,
      "warm-start steps at most (the targeted stop may end it sooner; 0: no warm start)");
  add_integer_option<int64_t>(cmd, prefix + "batch", o.batch, 1, 1'000'000,
                              "warm-start examples per step");
  add_real_option(cmd, prefix + "lr", o.lr, 0.0, 1.0, true,
                  "warm-start peak learning rate (AdamW)");
  add_integer_option<int64_t>(cmd, prefix + "warmup", o.warmup_steps, 0, kMaxCount,
                              "warm-start steps of linear lr warmup");
  add_real_option(cmd, prefix + "min-lr-ratio", o.min_lr_ratio, 0.0, 1.0, false,
                  "warm-start lr at the step cap as a fraction of the peak, by cosine decay after "
                  "the warmup (1: no decay)");
  add_real_option(cmd, prefix + "target", o.target_accuracy, 0.0, 1.0, false,
                  "stop the warm start once its validation accuracy reaches this (0: all steps)");
  add_integer_option<int64_t>(
      cmd, prefix + "target-every", o.target_every, 1, kMaxCount,
      "warm-start steps between validation evaluations (" + prefix + "target)");
  add_integer_option<int64_t>(cmd, prefix + "target-prompts", o.target_prompts, 1, 1'000'000,
                              "validation prompts of each warm-start evaluation");
}

void resolve_run_device(TrainArgs& a, const std::string& warm_prefix) {
  a.opt.device = device_flag(a.device);
  if (!a.opt.device.is_cuda() || !a.cmd) return;
  auto given = [&](const std::string& flag) {
    const CLI::Option* op = a.cmd->get_option_no_throw(flag);
    return op && op->count() > 0;
  };
  if (!a.model_dir.empty() || given("--preset")) return;
  a.preset = GpuMainJob::kPreset;
  // pretrain names its warm-start lr --lr and has no RL lr or checkpoints: the RL settings it
  // does not read are harmless there.
  if (!given("--lr")) a.opt.lr = GpuMainJob::kLr;
  if (!given(warm_prefix + "lr")) a.warm.lr = GpuMainJob::kWarmLr;
  if (!given("--eval-prompts")) a.opt.eval_prompts = GpuMainJob::kEvalPrompts;
  if (!given("--checkpoint-every")) a.opt.checkpoint_every = GpuMainJob::kCheckpointEvery;
}

void validate_train_options(const rl::TrainOptions& o) {
  try {
    o.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

rl::PretrainOptions pretrain_options(const TrainArgs& a) {
  rl::PretrainOptions p = a.warm;
  // The warm start runs on the run's device; its cache entry names the device kind
  // (rl::warm_start_device), since another summation order gives other bits.
  p.device = a.opt.device;
  p.task = a.opt.task;
  p.difficulty = a.opt.difficulty;
  p.seed = a.opt.seed;
  p.eval_prompts = a.opt.eval_prompts;
  p.eval_max_new = a.opt.max_new;
  return p;
}

bool uses_warm_start(const TrainArgs& a) { return a.model_dir.empty() && a.warm.steps > 0; }

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

namespace {

// Whether `inner` is `outer` or lies under it, comparing the paths as they will be once created
// (symbolic links in the existing part resolved).
bool path_within(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path i = fs::weakly_canonical(fs::absolute(inner), ec);
  const fs::path o = fs::weakly_canonical(fs::absolute(outer), ec);
  auto it = i.begin();
  for (const fs::path& part : o) {
    if (part.empty()) continue;
    if (it == i.end() || *it != part) return false;
    ++it;
  }
  return true;
}

}  // namespace

void check_run_outputs(const TrainArgs& a, std::string_view flag, const fs::path& out) {
  check_output_folder(flag, out.string());
  try {
    rl::check_new_run_dir(out);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  std::vector<PathArg> outputs{{std::string(flag), out.string(), /*folder=*/true}};
  if (uses_warm_start(a)) {
    check_output_folder("--cache-dir", a.cache_dir);
    if (path_within(a.cache_dir, out))
      throw UsageError(fmt::format(
          "--cache-dir {} lies inside the run folder {} ({}), which must be new or empty when the "
          "run starts: keep the cache outside it",
          a.cache_dir, out.string(), flag));
    outputs.push_back({"--cache-dir", a.cache_dir, true});
  }
  std::vector<PathArg> inputs{{"--model", a.model_dir}};
  if (a.recipe.recipe_file) inputs.push_back({"--recipe-file", *a.recipe.recipe_file});
  check_outputs_not_inputs(outputs, inputs);
}

rl::PolicySource open_source(const TrainArgs& a, int64_t min_context, bool allow_checkpoint) {
  const bool preset_given = a.cmd && a.cmd->get_option("--preset")->count() > 0;
  if (!a.model_dir.empty() && preset_given)
    throw UsageError("give either --model or --preset, not both");
  rl::PolicySourceOptions o;
  o.model_dir = a.model_dir;
  o.preset = a.preset;
  o.init_seed = a.opt.seed;
  o.allow_checkpoint = allow_checkpoint;
  try {
    return rl::open_policy_source(o, min_context);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

rl::WarmStartRequest warm_start_request(const TrainArgs& a) {
  return {pretrain_options(a), fs::path(a.cache_dir)};
}

std::string describe_warm_start(const rl::PolicySource& s, const TrainArgs& a) {
  const rl::WarmStartPlan p = rl::plan_warm_start(s, warm_start_request(a));
  if (!p.needed)
    return s.kind == rl::PolicySourceKind::kPreset ? "no warm start (--pretrain-steps 0)"
                                                   : "no warm start (--model)";
  if (p.cached) return fmt::format("the cached warm start in {}", p.dir.string());
  return fmt::format("a warm start of at most {} steps of {} examples{}, stored in {}",
                     a.warm.steps, a.warm.batch, target_text(a.warm), p.dir.string());
}

rl::InitialPolicy initial_policy(rl::PolicySource&& s, const TrainArgs& a) {
  const rl::PretrainOptions po = pretrain_options(a);
  diag::ProgressDisplay progress = diag::ProgressDisplay::for_stderr({a.log_every * 10, 20});
  bool announced = false;
  rl::InitialPolicy ip = rl::make_initial_policy(
      std::move(s), warm_start_request(a), [&](const rl::PretrainProgress& p) {
        if (!announced) {
          fmt::print(stderr,
                     "warm start: at most {} supervised steps of {} examples (task {}, difficulty "
                     "{}){}\n",
                     p.total, po.batch, po.task, po.difficulty, target_text(po));
          announced = true;
        }
        progress.update({p.step, p.total, p.elapsed_s, std::nullopt, std::nullopt, std::nullopt});
      });
  progress.finish();
  if (!ip.warm_start) return ip;
  const rl::WarmStart& ws = *ip.warm_start;
  const Json& info = ws.info;
  auto acc = [&](const char* k) {
    return info.contains(k) ? info[k].value("accuracy", 0.0) * 100.0 : 0.0;
  };
  fmt::print(stderr, "warm start: {} {} (held-out accuracy {:.1f}% -> {:.1f}%{}; {})\n",
             ws.cached ? "cached" : "stored in", ws.dir.string(), acc("eval_before"),
             acc("eval_after"),
             ws.cached ? "" : fmt::format(", {:.1f} s", info.value("seconds", 0.0)),
             describe_warm_start_outcome(info));
  if (const std::string w = warm_start_warning(info, "--pretrain-"); !w.empty())
    fmt::print(stderr, "warning: {}\n", w);
  return ip;
}

std::string target_text(const rl::PretrainOptions& o) {
  if (o.target_accuracy <= 0.0) return "";
  return fmt::format(" until {:.0f}% validation accuracy", o.target_accuracy * 100.0);
}

std::string describe_warm_start_outcome(const Json& info) {
  const int64_t steps = info.value("steps_done", int64_t(0));
  if (!info.contains("target") || !info["target"].is_object())
    return fmt::format("{} steps", steps);
  const Json& t = info["target"];
  const Json& v = t["validation"];
  const double target = t.value("accuracy", 0.0) * 100.0;
  if (!v.is_object()) return fmt::format("{} steps, no validation evaluation ran", steps);
  return fmt::format("{} steps, validation accuracy {:.1f}% {} the target {:.0f}%", steps,
                     v.value("accuracy", 0.0) * 100.0,
                     t.value("reached", false) ? "reached" : "below", target);
}

std::string warm_start_warning(const Json& info, const std::string& prefix) {
  if (!info.contains("target") || !info["target"].is_object()) return "";
  const Json& t = info["target"];
  if (t.value("reached", false)) return "";
  return fmt::format(
      "the warm start ended at its step cap ({} steps) below its validation target of {:.0f}%; "
      "RL starts from a weaker policy (raise {}steps or {}lr, or lower {}target)",
      info.value("steps_done", int64_t(0)), t.value("accuracy", 0.0) * 100.0, prefix, prefix,
      prefix);
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
