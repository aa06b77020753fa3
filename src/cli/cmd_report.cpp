// `lockstep report RUN_DIR...`: one self-contained HTML file with per-step plots and a summary
// table of one or more training runs (include/lockstep/diag/report.h).
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "lockstep/diag/compare.h"
#include "lockstep/diag/report.h"
#include "lockstep/diag/run_meta.h"

namespace lockstep::cli {
namespace {

struct ReportArgs {
  std::vector<std::string> run_dirs;
  std::string out = "report.html";
  double smoothing = 0.8;
  std::string title = "lockstep report";
  bool json = false;
};

void run_report(const ReportArgs& a) {
  if (!(a.smoothing >= 0 && a.smoothing < 1))
    throw UsageError(fmt::format("--smoothing {} must be in [0, 1)", a.smoothing));
  check_output_paths({{"-o", a.out}});
  std::vector<PathArg> inputs;
  for (const std::string& d : a.run_dirs) inputs.push_back({"RUN_DIR", d});
  check_outputs_not_inputs({{"-o", a.out}}, inputs);
  // Every folder is read before anything is written: a bad one leaves no output file.
  std::vector<diag::RunData> runs;
  for (const std::string& d : a.run_dirs) {
    try {
      runs.push_back(diag::load_run(d));
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
  }
  diag::ReportOptions opt;
  opt.smoothing = a.smoothing;
  opt.title = a.title;
  const diag::ReportResult res = diag::render_report(runs, opt);
  write_file_atomic(a.out, res.html);
  for (const std::string& n : res.notes) fmt::print(stderr, "lockstep: note: {}\n", n);
  std::vector<diag::RunSummary> summaries;
  for (const diag::RunData& r : runs) summaries.push_back(diag::summarize_run(r));
  if (a.json) {
    Json j;
    j["output"] = a.out;
    j["plots"] = res.plots;
    j["notes"] = res.notes;
    j["runs"] = diag::compare_json(summaries);
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("wrote {} ({} run{}, {} plots)\n\n{}", a.out, runs.size(), runs.size() == 1 ? "" : "s",
             res.plots, diag::compare_markdown(summaries));
}

}  // namespace

void register_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Write one self-contained HTML report (inline SVG plots, no scripts) of one or more\n"
      "training runs: reward, accuracy (train and eval), entropy, mean |learner - sampler\n"
      "log-prob|, its 5th percentile and stage times per step, one colour per run, and a summary\n"
      "table; prints the comparison table. Each RUN_DIR needs a metrics.jsonl (exit 2 otherwise,\n"
      "nothing written); run_meta.json adds the recipe and guard to the labels.\n"
      "Example: lockstep report runs/bf16 runs/nvfp4 runs/nvfp4_triage -o report.html");
  cmd->add_option("run_dirs", a->run_dirs, "run folders (each with metrics.jsonl)")->required();
  cmd->add_option("-o,--output", a->out, "the HTML file to write")->capture_default_str();
  cmd->add_option("--smoothing", a->smoothing,
                  "EMA factor beta of the thick lines, in [0, 1) (0 = raw only)")
      ->capture_default_str();
  cmd->add_option("--title", a->title, "report title")->capture_default_str();
  cmd->add_flag("--json", a->json,
                "print {output, plots, notes, runs: [per-run summary]} instead of the table");
  cmd->callback([a] { run_report(*a); });
}

}  // namespace lockstep::cli
