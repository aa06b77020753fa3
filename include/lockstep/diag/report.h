// The HTML report of one or more training runs (`lockstep report RUN_DIR...`): a single
// self-contained file (inline CSS and SVG, no scripts, no external resources) with per-step plots
// of reward, accuracy, entropy, the learner-sampler gap and stage times, and a summary table.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "lockstep/diag/run_summary.h"

namespace lockstep::diag {

struct ReportOptions {
  double smoothing = 0.8;  // EMA factor of the thick lines (svg_plot.h ema()); 0 = no smoothing
  std::string title = "lockstep report";
};

// What a plot shows: keys[0] solid, keys[1] (when present) dashed in the run's colour.
struct ReportPlot {
  std::string title, y_label;
  std::vector<std::string> keys;
};

// The plots for these runs, in order: reward_mean; accuracy with eval_accuracy; entropy;
// mean_abs_gap; q05_gap; one per stage-time key (time_rollout_s, time_logprob_s, time_train_s,
// time_sync_s first, then any other time_*_s alphabetically). A plot appears when at least one
// run has a finite value for one of its keys.
std::vector<ReportPlot> report_plots(std::span<const RunData> runs);

struct ReportResult {
  std::string html;
  int plots = 0;
  std::vector<std::string> notes;  // truncated metrics files, plots without data
};

// Renders the report. Points whose value is missing, null, NaN or infinite are skipped; rows are
// plotted in ascending step order; runs may have any lengths, including one step (drawn as a dot).
ReportResult render_report(std::span<const RunData> runs, const ReportOptions& options = {});

// Loads every folder first (so a bad folder fails before anything is written), renders, and
// writes `out` atomically. Throws like load_run.
ReportResult write_report(std::span<const std::filesystem::path> run_dirs,
                          const std::filesystem::path& out, const ReportOptions& options = {});

}  // namespace lockstep::diag
