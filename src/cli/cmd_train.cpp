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
  ParallelArgs par;
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

// ", 4 learner ranks (4 gradient slots)", ", sampler on cuda:2" and ", rollouts overlapped with
// training" where they apply.
std::string ranks_text(const rl::TrainOptions& o) {
  std::string out;
  if (o.learner_ranks > 1 || o.grad_slots > 1)
    out += fmt::format(", {} learner rank{} ({} gradient slot{})", o.learner_ranks,
                       o.learner_ranks > 1 ? "s" : "", o.grad_slots, o.grad_slots > 1 ? "s" : "");
  if (o.sampler_device) out += fmt::format(", sampler on {}", o.sampler_device->str());
  if (o.async_rollout) {
    out += ", rollouts overlapped with training (--async-rollout 1)";
    // On one GPU the background sampler and the learner take turns on it (docs/rl.md,
    // "Overlapped rollouts": slower per step than the synchronous loop there).
    if (o.device.is_cuda() && !o.sampler_device) out += " sharing the learner's GPU";
  }
  return out;
}

void run_resume(const TrainCmd& c) {
  // --resume takes every run option from RUN_DIR/run_meta.json.
  // --async-rollout is a run option: accepted only as the run's own value (Trainer::resume).
  static const std::set<std::string> allowed = {"--resume",        "--json", "--log-every",
                                                "--device",        "--gpus", "--learner-ranks",
                                                "--async-rollout", "--help"};
  for (const CLI::Option* op : c.cmd->get_options()) {
    if (op->count() == 0) continue;
    const std::string name = op->get_name();
    bool ok = false;
    for (const std::string& n : op->get_lnames()) ok = ok || allowed.count("--" + n);
    if (!ok)
      throw UsageError(fmt::format(
          "--resume continues a run with the options in its run_meta.json; drop {}", name));
  }
  // The device and the rank count may change: the run's bits do not depend on them.
  check_gpus(c.par, query_devices());
  rl::TrainOptions placed;
  placed.device = device_flag(c.a.device);
  apply_parallel(c.par, placed);
  rl::ResumePlacement where;
  where.device = placed.device;
  where.learner_ranks = placed.learner_ranks;
  where.sampler_device = placed.sampler_device;
  if (const CLI::Option* op = c.cmd->get_option_no_throw("--async-rollout"); op && op->count())
    where.async_rollout = c.par.async_rollout;
  std::unique_ptr<rl::Trainer> t;
  try {
    t = rl::Trainer::resume(c.resume, where);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  fmt::print(stderr, "lockstep train: resuming {} at step {} of {} on {}{}\n", c.resume, t->step(),
             t->options().steps, t->options().device.str(), ranks_text(t->options()));
  const rl::TrainResult r = run_with_progress(*t, c.a.log_every);
  print_result(*t, r, Json(nullptr), c.a.json);
  if (!r.finished) std::exit(130);
}

void run_train(TrainCmd& c) {
  if (!c.resume.empty()) return run_resume(c);
  check_gpus(c.par, query_devices());
  TrainArgs& a = c.a;
  resolve_run_device(a, "--pretrain-");
  apply_parallel(c.par, a.opt);
  // Every input and output is checked before anything is written (and before the warm start).
  validate_train_options(a.opt);
  a.recipe.read_environment();
  if (!a.recipe.recipe_name && !a.recipe.recipe_file && !a.recipe.env_recipe)
    a.recipe.recipe_name = "nvfp4_per_token";
  const SelectedRecipe sel = select_recipe(a.recipe);
  a.opt.sampler_recipe = resolve_sampler_recipe(a.sampler_recipe, sel.recipe);
  const std::string name = fmt::format(
      "{}-{}{}-{}{}{}", a.opt.task, sel.recipe.name,
      a.opt.sampler_recipe ? "-sampler-" + a.opt.sampler_recipe->name : std::string(), a.opt.guard,
      a.opt.deterministic ? "-det" : "", a.opt.routing_replay ? "-replay" : "");
  const fs::path dir = c.out.empty() ? default_run_dir("runs", name) : fs::path(c.out);
  check_run_outputs(a, "--out", dir);
  // The model source is read once: a checkpoint's config, recipe and weights come from one load.
  rl::PolicySource source = open_source(a, rl::max_sequence_length(a.opt), true);
  try {
    rl::check_source_recipe(source, sel.recipe);
    if (a.opt.routing_replay)
      model::require_moe_for_replay(source.weights.config, "--routing-replay");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const std::string plan = fmt::format(
      "{} (model {}, task {} difficulty {}, recipe {}{}, guard {}{}{}, {} steps of {} x {} "
      "samples, "
      "on {}{})",
      dir.string(), source.where, a.opt.task, a.opt.difficulty, sel.recipe.name,
      a.opt.sampler_recipe ? ", sampler recipe " + a.opt.sampler_recipe->name : "", a.opt.guard,
      a.opt.deterministic ? ", deterministic" : "", a.opt.routing_replay ? ", routing replay" : "",
      a.opt.steps, a.opt.prompts, a.opt.group, a.opt.device.str(), ranks_text(a.opt));
  if (dry_run(a.dry_run, sel,
              fmt::format("{}, then the RL run {}", describe_warm_start(source, a), plan)))
    return;

  fmt::print(stderr, "lockstep train: {}\n", plan);
  rl::InitialPolicy ip = initial_policy(std::move(source), a);
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
};

void run_pretrain(PretrainCmd& c) {
  TrainArgs& a = c.a;
  resolve_run_device(a, "--");
  validate_train_options(a.opt);
  check_output_folder("-o", c.out);
  try {
    rl::check_new_run_dir(c.out);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("-o: {}", e.what()));
  }
  check_outputs_not_inputs({{"-o", c.out, /*folder=*/true}}, {{"--model", a.model_dir}});
  rl::PolicySource source = open_source(a, rl::max_sequence_length(a.opt), true);
  SelectionInputs pretrain_recipe;
  pretrain_recipe.recipe_name = rl::kPretrainRecipe;
  const SelectedRecipe bf16 = select_recipe(pretrain_recipe);
  try {
    rl::check_source_recipe(source, bf16.recipe);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  rl::PretrainOptions po = pretrain_options(a);
  po.eval_every = c.eval_every;
  po.min_difficulty = c.min_difficulty;
  if (po.min_difficulty > po.difficulty)
    throw UsageError(fmt::format("--min-difficulty {} is above --difficulty {}", po.min_difficulty,
                                 po.difficulty));
  if (dry_run(a.dry_run, bf16,
              fmt::format("at most {} supervised steps of {} examples (task {}, difficulty "
                          "{}){} from {} on {}, written to {}",
                          po.steps, po.batch, po.task, po.difficulty, target_text(po), source.where,
                          po.device.str(), c.out)))
    return;
  const std::string init_source = source.init_source;
  const model::ModelWeights init = std::move(source.weights);
  diag::ProgressDisplay progress = diag::ProgressDisplay::for_stderr({a.log_every, 20});
  std::optional<double> acc;
  const rl::PretrainResult r = rl::pretrain(init, po, [&](const rl::PretrainProgress& p) {
    if (p.validation_accuracy) acc = p.validation_accuracy;
    if (p.eval_accuracy) acc = p.eval_accuracy;
    progress.update({p.step, p.total, p.elapsed_s, std::nullopt, acc, std::nullopt});
    if (!a.json) return;
    // --json: one JSON line per step on stderr (the loss curve).
    Json row = {{"step", p.step}, {"loss", p.loss}, {"grad_norm", p.grad_norm}, {"lr", p.lr}};
    if (p.validation_accuracy) row["validation_accuracy"] = *p.validation_accuracy;
    if (p.eval_accuracy) row["eval_accuracy"] = *p.eval_accuracy;
    fmt::print(stderr, "{}\n", row.dump());
  });
  progress.finish();
  const Json key = rl::warm_start_key(init.config, init_source, a.opt.seed, po);
  Json info = {{"key", key}, {"hash", rl::warm_start_hash(key)}};
  info.update(rl::pretrain_result_json(r, po));
  rl::save_warm_start(c.out, r.weights, info);
  if (a.json) {
    info["output"] = c.out;
    fmt::print("{}\n", info.dump());
    return;
  }
  if (const std::string w = warm_start_warning(info, "--"); !w.empty())
    fmt::print(stderr, "warning: {}\n", w);
  fmt::print(
      "held-out accuracy ({} prompts, greedy): before {:.1f}% -> after {:.1f}% ({}, loss "
      "{:.4f}, {:.1f} s)\nwrote {} (train from it: lockstep train --model {})\n",
      r.after.prompts, r.before.accuracy * 100.0, r.after.accuracy * 100.0,
      describe_warm_start_outcome(info), r.final_loss, r.seconds, c.out, shell_quote(c.out));
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
      "  lockstep train --async-rollout 1 --out runs/async\n"
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
  add_gpus_options(*cmd, c->par);
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
  p->a.cmd = pc;
  pc->add_option("-o,--output", p->out, "model directory to create")->required();
  pc->add_option("--task", p->a.opt.task, task_help())->capture_default_str();
  add_integer_option(*pc, "--difficulty", p->a.opt.difficulty, 0, 1000, "task difficulty");
  pc->add_option("--preset", p->a.preset,
                 fmt::format("built-in model config (random weights, --seed); on a GPU the "
                             "default is {}, with --lr {:g} and --eval-prompts {}",
                             GpuMainJob::kPreset, GpuMainJob::kWarmLr, GpuMainJob::kEvalPrompts))
      ->capture_default_str();
  pc->add_option("--model", p->a.model_dir, "start from this model directory instead");
  add_warm_start_options(*pc, p->a.warm, "--");
  add_unsigned_option(*pc, "--seed", p->a.opt.seed, UINT64_MAX,
                      "seed of the model init and the task examples");
  add_integer_option<int64_t>(*pc, "--eval-prompts", p->a.opt.eval_prompts, 0, 1'000'000,
                              "held-out prompts (greedy decoding)");
  add_integer_option(
      *pc, "--min-difficulty", p->min_difficulty, 0, 1000,
      "cycle the examples through difficulties min..difficulty (0: difficulty only)");
  add_integer_option<int64_t>(
      *pc, "--eval-every", p->eval_every, 0, 1'000'000'000,
      "also evaluate every N steps (shown in the progress; 0: only before and after)");
  add_integer_option<int64_t>(*pc, "--max-new", p->a.opt.max_new, 1, 1'000'000,
                              "tokens per held-out answer at most");
  add_integer_option<int64_t>(*pc, "--log-every", p->a.log_every, 1, 1'000'000'000,
                              "plain progress line every N steps");
  add_device_option(*pc, p->a.device);
  pc->add_flag("--json", p->a.json, "print a JSON summary");
  pc->add_flag("--dry-run", p->a.dry_run,
               "check every input and output, print what would run; write nothing");
  pc->callback([p] { run_pretrain(*p); });
}

}  // namespace lockstep::cli
