// `lockstep compare`: a matrix of short training runs (recipes x guards, optionally one
// deterministic run per recipe) from one shared warm start, then the comparison table
// (summary.md, summary.json) and one report over all runs.
#include <fmt/format.h>

#include <memory>

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
  std::vector<std::string> guards{"none", "tis", "triage"};
  bool deterministic_too = false;
  std::string out;
};

struct PlannedRun {
  SelectedRecipe recipe;
  std::string guard;
  bool deterministic = false;
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
  for (const std::string& rn : c.recipes) {
    SelectionInputs in;
    in.recipe_name = rn;
    const SelectedRecipe sel = select_recipe(in);
    for (const std::string& g : c.guards)
      plan.push_back({sel, g, false, out / dir_name(fmt::format("{}-{}", rn, g))});
    // Deterministic: learner == sampler bit for bit, so TIS weights are exactly 1 and TRIAGE
    // never gates or repairs: one run per recipe (with the first guard) covers every guard.
    if (c.deterministic_too)
      plan.push_back({sel, c.guards.front(), true,
                      out / dir_name(fmt::format("{}-{}-det", rn, c.guards.front()))});
  }
  for (const PlannedRun& p : plan) {
    rl::TrainOptions o = a.opt;
    o.guard = p.guard;
    o.deterministic = p.deterministic;
    validate_train_options(o);
  }
  // One model for every recipe: a checkpoint (bound to its recipe) is refused.
  rl::PolicySource source = open_source(a, rl::max_sequence_length(a.opt), false);
  if (a.dry_run) {
    std::string runs;
    for (const PlannedRun& p : plan) runs += (runs.empty() ? "" : ", ") + p.dir.string();
    print_dry_run(stdout, plan.front().recipe, command_line());
    fmt::print("would run: {}, then {} runs of {} steps from {}: {}\n",
               describe_warm_start(source, a), plan.size(), a.opt.steps, source.where, runs);
    return;
  }

  fs::create_directories(out);
  // The warm start is the same for every run (bf16, keyed without the recipe): made once.
  rl::InitialPolicy ip = initial_policy(std::move(source), a);
  std::vector<fs::path> dirs;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedRun& p = plan[i];
    rl::TrainOptions o = a.opt;
    o.guard = p.guard;
    o.deterministic = p.deterministic;
    fmt::print(stderr, "compare: run {}/{}: {} (recipe {}, guard {}{})\n", i + 1, plan.size(),
               p.dir.string(), p.recipe.recipe.name, p.guard,
               p.deterministic ? ", deterministic" : "");
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
  const std::string md = diag::compare_markdown(summaries);
  write_file_atomic((out / "summary.md").string(), md);
  write_file_atomic((out / "summary.json").string(), diag::compare_json(summaries).dump(2) + "\n");
  diag::ReportOptions ro;
  ro.title = fmt::format("lockstep compare: {}", out.filename().string());
  diag::write_report(dirs, out / "report.html", ro);
  if (a.json) {
    Json j{{"out", out.string()},
           {"summary_md", (out / "summary.md").string()},
           {"report", (out / "report.html").string()},
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
      "Run a matrix of training runs (every recipe x every guard, plus with --deterministic-too\n"
      "one deterministic run per recipe) one after another from one shared warm start, then\n"
      "write OUT/summary.md and summary.json (final / best eval accuracy, mean and max\n"
      "|learner - sampler log-prob|, its worst 5th percentile, wall time) and OUT/report.html.\n"
      "Every train option applies to all runs.\n"
      "Example: lockstep compare --recipes bf16,nvfp4_per_token --guards none,tis,triage "
      "--deterministic-too --out runs/compare");
  cmd->add_option("--recipes", c->recipes, "built-in recipes, comma separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--guards", c->guards, "guards (none, tis, triage, tis+triage), comma separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--deterministic-too", c->deterministic_too,
                "add one --deterministic run per recipe (its gap is exactly 0)");
  cmd->add_option("--out", c->out, "folder to create (default runs/DATE-TIME-compare)");
  add_train_options(*cmd, c->a);
  cmd->callback([c] { run_compare(*c); });
}

}  // namespace lockstep::cli
