// `lockstep train` (the main job: warm start, GRPO with TIS / TRIAGE, report) and `lockstep
// pretrain` (the supervised warm start alone, written as a model directory).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <set>

#include "commands.h"
#include "lockstep/diag/progress.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/rl/trainer.h"
#include "lockstep/rl/warm_start.h"
#include "train_cli.h"

namespace lockstep::cli {
namespace fs = std::filesystem;
namespace {

struct TrainCmd {
  TrainArgs a;
  std::string out, resume;
  CLI::App* cmd = nullptr;
};

std::string percent(const std::optional<double>& v) {
  return v ? fmt::format("{:.1f}%", *v * 100.0) : std::string("-");
}

void print_result(const rl::Trainer& t, const rl::TrainResult& r, const Json& warm, bool json) {
  const rl::TrainOptions& o = t.options();
  if (json) {
    Json j;
    j["run_dir"] = t.run_dir().string();
    j["report"] = r.report.string();
    j["steps_done"] = r.steps_done;
    j["finished"] = r.finished;
    j["start_eval_accuracy"] = r.start_eval_accuracy ? Json(*r.start_eval_accuracy) : Json(nullptr);
    j["end_eval_accuracy"] = r.end_eval_accuracy ? Json(*r.end_eval_accuracy) : Json(nullptr);
    j["start_eval_accuracy_bf16"] =
        r.start_eval_accuracy_bf16 ? Json(*r.start_eval_accuracy_bf16) : Json(nullptr);
    j["end_eval_accuracy_bf16"] =
        r.end_eval_accuracy_bf16 ? Json(*r.end_eval_accuracy_bf16) : Json(nullptr);
    j["elapsed_s"] = r.elapsed_s;
    j["warm_start"] = warm;
    fmt::print("{}\n", j.dump());
    return;
  }
  std::string rise;
  if (r.start_eval_accuracy && r.end_eval_accuracy)
    rise =
        fmt::format(" ({:+.1f} points)", (*r.end_eval_accuracy - *r.start_eval_accuracy) * 100.0);
  fmt::print("held-out accuracy ({} prompts, greedy): start {} -> end {}{}\n", o.eval_prompts,
             percent(r.start_eval_accuracy), percent(r.end_eval_accuracy), rise);
  // Through a quantized sampler, the same policies read in bf16: the rise over the bf16 warm
  // start, and what quantizing it lost at the start.
  const Recipe& srec = o.sampler_recipe ? *o.sampler_recipe : t.recipe();
  if ((srec.name != "bf16" || o.kv_cache != "bf16") && r.start_eval_accuracy_bf16 &&
      r.end_eval_accuracy_bf16)
    fmt::print("read through bf16: start {} -> end {} ({:+.1f} points over the bf16 start)\n",
               percent(r.start_eval_accuracy_bf16), percent(r.end_eval_accuracy_bf16),
               (*r.end_eval_accuracy - *r.start_eval_accuracy_bf16) * 100.0);
  fmt::print("steps {}/{}, {:.1f} s; report: {}\n", r.steps_done, o.steps, r.elapsed_s,
             r.report.string());
  if (!r.finished)
    fmt::print("stopped at step {}; continue with: lockstep train --resume {}\n", r.steps_done,
               shell_quote(t.run_dir().string()));
}

void run_resume(const TrainCmd& c) {
  // --resume takes every run option from RUN_DIR/run_meta.json.
  static const std::set<std::string> allowed = {"--resume", "--json", "--log-every", "--help"};
  for (const CLI::Option* op : c.cmd->get_options()) {
    if (op->count() == 0) continue;
    const std::string name = op->get_name();
    bool ok = false;
    for (const std::string& n : op->get_lnames()) ok = ok || allowed.count("--" + n);
    if (!ok)
      throw UsageError(fmt::format(
          "--resume continues a run with the options in its run_meta.json; drop {}", name));
  }
  std::unique_ptr<rl::Trainer> t;
  try {
    t = rl::Trainer::resume(c.resume);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  fmt::print(stderr, "lockstep train: resuming {} at step {} of {}\n", c.resume, t->step(),
             t->options().steps);
  const rl::TrainResult r = run_with_progress(*t, c.a.log_every);
  print_result(*t, r, Json(nullptr), c.a.json);
  if (!r.finished) std::exit(130);
}

void run_train(TrainCmd& c) {
  if (!c.resume.empty()) return run_resume(c);
  TrainArgs& a = c.a;
  // Every input is checked before anything is written (and before the warm start).
  try {
    a.opt.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  a.recipe.read_environment();
  if (!a.recipe.recipe_name && !a.recipe.recipe_file && !a.recipe.env_recipe)
    a.recipe.recipe_name = "nvfp4_per_token";
  const SelectedRecipe sel = select_recipe(a.recipe);
  a.opt.sampler_recipe = resolve_sampler_recipe(a.sampler_recipe, sel.recipe);
  const bool preset_given = c.cmd->get_option("--preset")->count() > 0;
  check_model_source(a, preset_given);
  const std::string name =
      fmt::format("{}-{}{}-{}{}", a.opt.task, sel.recipe.name,
                  a.opt.sampler_recipe ? "-sampler-" + a.opt.sampler_recipe->name : std::string(),
                  a.opt.guard, a.opt.deterministic ? "-det" : "");
  const fs::path dir = c.out.empty() ? default_run_dir("runs", name) : fs::path(c.out);
  try {
    rl::check_new_run_dir(dir);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }

  fmt::print(stderr,
             "lockstep train: {} (model {}, task {} difficulty {}, recipe {}{}, guard {}{}, {} "
             "steps of {} x {} samples)\n",
             dir.string(), a.model_dir.empty() ? a.preset : a.model_dir, a.opt.task,
             a.opt.difficulty, sel.recipe.name,
             a.opt.sampler_recipe ? ", sampler recipe " + a.opt.sampler_recipe->name : "",
             a.opt.guard, a.opt.deterministic ? ", deterministic" : "", a.opt.steps, a.opt.prompts,
             a.opt.group);
  InitialPolicy ip = initial_policy(a, sel.recipe, preset_given);
  RunMetaExtras meta;
  meta.argv = command_line();
  meta.extra = ip.meta;
  std::unique_ptr<rl::Trainer> t;
  try {
    t = rl::Trainer::create(dir, a.opt, sel, ip.weights, meta);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const rl::TrainResult r = run_with_progress(*t, a.log_every);
  print_result(*t, r, ip.meta.value("warm_start", Json()), a.json);
  if (!r.finished) std::exit(130);
}

// ---- pretrain ----------------------------------------------------------------------------------

struct PretrainCmd {
  TrainArgs a;
  std::string out;
  int64_t eval_every = 0;
  int min_difficulty = 0;
  CLI::App* cmd = nullptr;
};

void run_pretrain(PretrainCmd& c) {
  TrainArgs& a = c.a;
  try {
    a.opt.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const bool preset_given = c.cmd->get_option("--preset")->count() > 0;
  check_model_source(a, preset_given);
  try {
    rl::check_new_run_dir(c.out);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (a.pretrain_steps < 0) throw UsageError("--steps must be >= 0");
  model::ModelWeights init;
  std::string source;
  if (!a.model_dir.empty()) {
    InitialPolicy ip =
        initial_policy(a, builtin_recipe_or_throw(rl::kPretrainRecipe, "").recipe, preset_given);
    init = std::move(ip.weights);
    source = "model_dir:" + a.model_dir;
  } else {
    init = model::init_weights(model::preset(a.preset), a.opt.seed);
    source = "preset:" + a.preset;
  }
  rl::PretrainOptions po = pretrain_options(a);
  po.eval_every = c.eval_every;
  po.min_difficulty = c.min_difficulty;
  diag::ProgressDisplay progress = diag::ProgressDisplay::for_stderr({a.log_every, 20});
  std::optional<double> acc;
  const rl::PretrainResult r = rl::pretrain(init, po, [&](const rl::PretrainProgress& p) {
    if (p.eval_accuracy) acc = p.eval_accuracy;
    progress.update({p.step, p.total, p.elapsed_s, std::nullopt, acc, std::nullopt});
    if (p.eval_accuracy && a.json)
      fmt::print(stderr, "step {} loss {:.4f} eval_accuracy {:.4f}\n", p.step, p.loss,
                 *p.eval_accuracy);
  });
  progress.finish();
  auto eval_json = [](const rl::EvalResult& e) {
    return Json{{"accuracy", e.accuracy}, {"correct", e.correct}, {"prompts", e.prompts}};
  };
  const nlohmann::json key = rl::warm_start_key(init.config, source, a.opt.seed, po);
  Json info = {{"key", Json::parse(key.dump())},
               {"hash", rl::warm_start_hash(key)},
               {"eval_before", eval_json(r.before)},
               {"eval_after", eval_json(r.after)},
               {"eval_max_new", po.eval_max_new},
               {"final_loss", r.final_loss},
               {"seconds", r.seconds}};
  rl::save_warm_start(c.out, r.weights, Json::parse(info.dump()));
  if (a.json) {
    info["output"] = c.out;
    fmt::print("{}\n", info.dump());
    return;
  }
  fmt::print(
      "held-out accuracy ({} prompts, greedy): before {:.1f}% -> after {:.1f}% ({} steps, loss "
      "{:.4f}, {:.1f} s)\nwrote {} (train from it: lockstep train --model {})\n",
      r.after.prompts, r.before.accuracy * 100.0, r.after.accuracy * 100.0, po.steps, r.final_loss,
      r.seconds, c.out, shell_quote(c.out));
}

}  // namespace

void register_train_commands(CLI::App& app) {
  auto c = std::make_shared<TrainCmd>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "The main job: a low-precision GRPO run on a verifiable task. Without --model it first\n"
      "runs (or reuses from --cache-dir) a short supervised warm start of the preset, then RL:\n"
      "rollouts with the sampler at policy version v, learner log-probs, GRPO with the guard\n"
      "(none, tis, triage, triage-gate), AdamW, the converter exports version v + 1 to the "
      "sampler.\n"
      "Writes RUN_DIR/metrics.jsonl (one row per step), run_meta.json, checkpoint/ and\n"
      "report.html; prints the start and end held-out accuracy. A killed run continues\n"
      "bit-identically with --resume RUN_DIR.\n"
      "Examples:\n"
      "  lockstep train\n"
      "  lockstep train --recipe bf16 --guard none --out runs/bf16\n"
      "  lockstep train --guard triage --deterministic --steps 20 --out runs/det\n"
      "  lockstep train --recipe bf16 --sampler-recipe nvfp4_per_token --guard triage\n"
      "  lockstep train --resume runs/det");
  c->cmd = cmd;
  cmd->add_option("--out", c->out,
                  "run folder to create (default runs/DATE-TIME-TASK-RECIPE-GUARD)");
  cmd->add_option("--resume", c->resume, "continue this run folder from its last checkpoint");
  cmd->add_option("--recipe", c->a.recipe.recipe_name,
                  "precision recipe (default nvfp4_per_token; `lockstep recipes` lists them)");
  cmd->add_option("--recipe-file", c->a.recipe.recipe_file, "recipe JSON file instead of --recipe");
  cmd->add_option("--sampler-recipe", c->a.sampler_recipe,
                  "the sampler's recipe (name or JSON file) when it differs from the learner's "
                  "--recipe, e.g. a bf16 learner behind an NVFP4 rollout (default: --recipe)");
  cmd->add_option("--guard", c->a.opt.guard,
                  "none, tis, triage (TIS + gate + repair) or triage-gate (the gate alone)")
      ->capture_default_str();
  add_train_options(*cmd, c->a);
  cmd->callback([c] { run_train(*c); });

  auto p = std::make_shared<PretrainCmd>();
  CLI::App* pc = app.add_subcommand(
      "pretrain",
      "Supervised warm start alone: teacher forcing on task examples (loss = mean -log p of the\n"
      "answer tokens and <eos>, AdamW, bf16 recipe) so that RL starts from a policy with\n"
      "non-zero reward. Prints the held-out accuracy before and after and writes a model\n"
      "directory (config.json, model.safetensors, warm_start.json) for `train --model`.\n"
      "(`lockstep train` does this itself and caches it.)\n"
      "Example: lockstep pretrain --task add --difficulty 3 --steps 200 -o models/add3");
  p->cmd = pc;
  pc->add_option("-o,--output", p->out, "model directory to create")->required();
  pc->add_option("--task", p->a.opt.task, "task (add, sort, reverse, count)")
      ->capture_default_str();
  pc->add_option("--difficulty", p->a.opt.difficulty, "task difficulty")->capture_default_str();
  pc->add_option("--preset", p->a.preset, "built-in model config (random weights, --seed)")
      ->capture_default_str();
  pc->add_option("--model", p->a.model_dir, "start from this model directory instead");
  pc->add_option("--steps", p->a.pretrain_steps, "supervised steps")->capture_default_str();
  pc->add_option("--batch", p->a.pretrain_batch, "examples per step")->capture_default_str();
  pc->add_option("--lr", p->a.pretrain_lr, "AdamW learning rate")->capture_default_str();
  add_unsigned_option(*pc, "--seed", p->a.opt.seed, UINT64_MAX,
                      "seed of the model init and the task examples");
  pc->add_option("--eval-prompts", p->a.opt.eval_prompts, "held-out prompts (greedy decoding)")
      ->capture_default_str();
  pc->add_option("--min-difficulty", p->min_difficulty,
                 "cycle the examples through difficulties min..difficulty (0: difficulty only)")
      ->capture_default_str();
  pc->add_option("--eval-every", p->eval_every,
                 "also evaluate every N steps (shown in the progress; 0: only before and after)")
      ->capture_default_str();
  pc->add_option("--max-new", p->a.opt.max_new, "tokens per held-out answer at most")
      ->capture_default_str();
  pc->add_option("--log-every", p->a.log_every, "plain progress line every N steps")
      ->capture_default_str();
  pc->add_flag("--json", p->a.json, "print a JSON summary");
  pc->callback([p] { run_pretrain(*p); });
}

}  // namespace lockstep::cli
