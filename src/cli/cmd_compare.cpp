// `lockstep compare`: a matrix of short training runs (seeds x recipes x sampler recipes x guards,
// optionally one deterministic run per recipe pairing) from one warm start per seed, then the
// comparison tables (per configuration: mean and spread over seeds; per run) in summary.md and
// summary.json, and one report over all runs.
#include <fmt/format.h>

#include <memory>
#include <optional>

#include "commands.h"
#include "lockstep/diag/compare.h"
#include "lockstep/diag/report.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/rl/objectives.h"
#include "lockstep/rl/trainer.h"
#include "train_cli.h"

namespace lockstep::cli {
namespace fs = std::filesystem;
namespace {

struct CompareCmd {
  TrainArgs a;
  std::vector<std::string> recipes{"bf16", "nvfp4_per_token"};
  std::vector<std::string> sampler_recipes;  // empty: each run's sampler shares its recipe
  std::vector<std::string> guards{"none", "tis", "triage"};
  std::vector<uint64_t> seeds;  // empty: --seed alone
  bool deterministic_too = false;
  std::string out;
  CLI::App* cmd = nullptr;
};

struct PlannedRun {
  SelectedRecipe recipe;
  std::optional<Recipe> sampler_recipe;
  std::string guard;
  bool deterministic = false;
  uint64_t seed = 0;
  fs::path dir;
};

// Refuses a name given twice in a comma-separated list (two runs in one folder).
void refuse_duplicates(const std::vector<std::string>& names, std::string_view flag) {
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (names[i] == names[j])
        throw UsageError(
            fmt::format("{}: '{}' is given twice; name each one once", flag, names[i]));
}

void run_compare(CompareCmd& c) {
  TrainArgs& a = c.a;
  resolve_run_device(a, "--pretrain-");
  if (c.recipes.empty() || c.guards.empty()) throw UsageError("--recipes and --guards need a name");
  refuse_duplicates(c.recipes, "--recipes");
  refuse_duplicates(c.guards, "--guards");
  // Every input and output is checked before anything is written.
  std::vector<PlannedRun> plan;
  const fs::path out = c.out.empty() ? default_run_dir("runs", "compare") : fs::path(c.out);
  check_run_outputs(a, "--out", out);
  for (const std::string& g : c.guards) {
    try {
      rl::parse_guard(g);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("--guards: {}", e.what()));
    }
  }
  auto dir_name = [](std::string s) {
    for (char& ch : s)
      if (ch == '+') ch = '_';
    return s;
  };
  if (!c.seeds.empty() && c.cmd->get_option("--seed")->count() > 0)
    throw UsageError("give either --seed or --seeds, not both");
  const std::vector<uint64_t> seeds = c.seeds.empty() ? std::vector<uint64_t>{a.opt.seed} : c.seeds;
  for (size_t i = 0; i < seeds.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (seeds[i] == seeds[j]) throw UsageError(fmt::format("--seeds lists {} twice", seeds[i]));
  refuse_duplicates(c.sampler_recipes, "--sampler-recipes");
  for (uint64_t seed : seeds)
    for (const std::string& rn : c.recipes) {
      SelectionInputs in;
      in.recipe_name = rn;
      const SelectedRecipe sel = select_recipe(in);
      const std::vector<std::string> samplers =
          c.sampler_recipes.empty() ? std::vector<std::string>{""} : c.sampler_recipes;
      for (const std::string& sn : samplers) {
        const std::optional<Recipe> srec = resolve_sampler_recipe(sn, sel.recipe);
        const std::string pair = srec ? fmt::format("{}-sampler-{}", rn, srec->name) : rn;
        const std::string suffix = seeds.size() > 1 ? fmt::format("-seed{}", seed) : "";
        for (const std::string& g : c.guards)
          plan.push_back(
              {sel, srec, g, false, seed, out / dir_name(fmt::format("{}-{}{}", pair, g, suffix))});
        // Deterministic: with one shared contract learner == sampler bit for bit, so TIS weights
        // are exactly 1 and TRIAGE never gates or repairs: one run per pairing (with the first
        // guard) covers every guard; with a sampler recipe of its own it shows the gap that
        // quantizing differently leaves when every reduction order is shared.
        if (c.deterministic_too)
          plan.push_back(
              {sel, srec, c.guards.front(), true, seed,
               out / dir_name(fmt::format("{}-{}-det{}", pair, c.guards.front(), suffix))});
      }
    }
  auto options_of = [&](const PlannedRun& p) {
    rl::TrainOptions o = a.opt;
    o.guard = p.guard;
    o.deterministic = p.deterministic;
    o.seed = p.seed;
    o.sampler_recipe = p.sampler_recipe;
    return o;
  };
  for (const PlannedRun& p : plan) validate_train_options(options_of(p));
  // One model for every recipe: a checkpoint (bound to its recipe) is refused.
  rl::PolicySource source = open_source(a, rl::max_sequence_length(a.opt), false);
  if (a.opt.routing_replay) {
    try {
      model::require_moe_for_replay(source.weights.config, "--routing-replay");
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  if (a.dry_run) {
    std::string runs;
    for (const PlannedRun& p : plan) runs += (runs.empty() ? "" : ", ") + p.dir.string();
    print_dry_run(stdout, plan.front().recipe, command_line());
    fmt::print("would run: {} (one per seed), then {} runs of {} steps from {}: {}\n",
               describe_warm_start(source, a), plan.size(), a.opt.steps, source.where, runs);
    return;
  }

  fs::create_directories(out);
  // The warm start depends on the seed, not on the recipe (bf16, keyed without it): one per seed,
  // shared by every run of that seed.
  std::optional<uint64_t> warm_seed;
  rl::InitialPolicy ip;
  std::vector<fs::path> dirs;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedRun& p = plan[i];
    const rl::TrainOptions o = options_of(p);
    if (warm_seed != p.seed) {
      TrainArgs sa = a;
      sa.opt.seed = p.seed;
      // The first seed's source is the one opened above; a preset's random weights follow the
      // seed, so every later seed opens its own.
      ip = initial_policy(
          warm_seed ? open_source(sa, rl::max_sequence_length(sa.opt), false) : std::move(source),
          sa);
      warm_seed = p.seed;
    }
    fmt::print(stderr, "compare: run {}/{}: {} (recipe {}{}, guard {}{}, seed {})\n", i + 1,
               plan.size(), p.dir.string(), p.recipe.recipe.name,
               p.sampler_recipe ? ", sampler recipe " + p.sampler_recipe->name : "", p.guard,
               p.deterministic ? ", deterministic" : "", p.seed);
    RunMetaExtras meta;
    meta.argv = command_line();
    meta.extra = ip.meta;
    std::unique_ptr<rl::Trainer> t;
    try {
      t = rl::Trainer::create(p.dir, o, p.recipe, ip.weights, meta);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    const rl::TrainResult r = run_with_progress(*t, a.log_every);
    if (!r.finished) {
      fmt::print(stderr, "compare: interrupted in {}; finished runs are in {}\n", p.dir.string(),
                 out.string());
      std::exit(130);
    }
    dirs.push_back(p.dir);
  }
  std::vector<diag::RunSummary> summaries;
  for (const fs::path& d : dirs) summaries.push_back(diag::summarize_run(diag::load_run(d)));
  const std::vector<diag::GroupSummary> groups = diag::compare_groups(summaries);
  const std::string md = fmt::format(
      "Every run: sampler KV cache {}, learner K / V {}{}, {} steps of {} x {} samples, on {}.\n\n"
      "Per configuration ({} seed{}: mean ± sample sd over seeds; accuracies on the {} part):\n\n"
      "{}\nPer run:\n\n{}",
      a.opt.kv_cache, a.opt.learner_kv, a.opt.routing_replay ? ", routing replay" : "", a.opt.steps,
      a.opt.prompts, a.opt.group, a.opt.device.str(), seeds.size(), seeds.size() == 1 ? "" : "s",
      a.opt.eval_split, diag::compare_groups_markdown(groups), diag::compare_markdown(summaries));
  write_file_atomic((out / "summary.md").string(), md);
  const Json summary_json{{"groups", diag::compare_groups_json(groups)},
                          {"runs", diag::compare_json(summaries)}};
  write_file_atomic((out / "summary.json").string(), summary_json.dump(2) + "\n");
  diag::ReportOptions ro;
  ro.title = fmt::format("lockstep compare: {}", out.filename().string());
  diag::write_report(dirs, out / "report.html", ro);
  if (a.json) {
    Json j{{"out", out.string()},
           {"summary_md", (out / "summary.md").string()},
           {"report", (out / "report.html").string()},
           {"groups", diag::compare_groups_json(groups)},
           {"runs", diag::compare_json(summaries)}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("{}\nwrote {}, {} and {}\n", md, (out / "summary.md").string(),
             (out / "summary.json").string(), (out / "report.html").string());
}

}  // namespace

void register_compare_command(CLI::App& app) {
  auto c = std::make_shared<CompareCmd>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Run a matrix of training runs (every seed x recipe x sampler recipe x guard, plus with\n"
      "--deterministic-too one deterministic run per recipe pairing) one after another, from one\n"
      "warm start per seed, then write OUT/summary.md and summary.json (per configuration: the\n"
      "mean and spread over seeds of the bf16 / sampler start and final eval accuracy, the gap\n"
      "and TIS / TRIAGE activation; then per run) and OUT/report.html.\n"
      "Every train option applies to all runs.\n"
      "Examples:\n"
      "  lockstep compare --recipes bf16,nvfp4_per_token --guards none,tis,triage "
      "--deterministic-too --out runs/compare\n"
      "  lockstep compare --recipes bf16 --sampler-recipes nvfp4_per_token --guards "
      "none,tis,triage --seeds 0,1,2");
  c->cmd = cmd;
  cmd->add_option("--recipes", c->recipes, "built-in recipes, comma separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--sampler-recipes", c->sampler_recipes,
                  "the samplers' recipes (names or JSON files), comma separated; every learner "
                  "recipe runs behind each (default: the learner's own)")
      ->delimiter(',');
  cmd->add_option("--guards", c->guards, "guards (none, tis, triage, triage-gate), comma separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--seeds", c->seeds,
                  "seeds, comma separated: every configuration runs once per seed (its own warm "
                  "start), and the table gives mean and spread (default: --seed)")
      ->delimiter(',');
  cmd->add_flag("--deterministic-too", c->deterministic_too,
                "add one --deterministic run per recipe (its gap is exactly 0)");
  cmd->add_option("--out", c->out, "folder to create (default runs/DATE-TIME-compare)");
  add_train_options(*cmd, c->a);
  cmd->callback([c] { run_compare(*c); });
}

}  // namespace lockstep::cli
