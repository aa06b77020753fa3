// The HTML report of one or more training runs (`lockstep report RUN_DIR...`): a single
// self-contained file (inline CSS and SVG, no scripts, no external resources) with per-step plots
// of reward, accuracy, entropy, the learner-sampler gap and stage times, and a summary table.
#pragma once

#include <cstdint>
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

// What a plot shows: keys[i] in the run's colour with line style i (solid, dashed, dotted,
// dash-dot); labels[i] names key i in the legend (the key itself when absent).
struct ReportPlot {
  std::string title, y_label;
  std::vector<std::string> keys;
  std::vector<std::string> labels;
};

// The plots for these runs, in order: reward_mean; accuracy with eval_accuracy; entropy;
// mean_abs_gap; q05_gap; the |A|-weighted directional shares (amplifying regions: A < 0 with
// delta < 0, A > 0 with delta > 0; contracting regions: the other two); 64-token segments with a
// mean delta below -0.5 / -1.5 and all segments; tokens with delta < -6; TIS truncation
// (tis_clip_frac); the TRIAGE gate (gated / tail / all segments); the TRIAGE repair (active /
// all segments); responses that reached --max-new (truncated_frac); one per stage-time key
// (time_rollout_s, time_logprob_s, time_train_s, time_sync_s first, then any other time_*_s
// alphabetically). A plot appears when at least one run has a finite value for one of its keys.
std::vector<ReportPlot> report_plots(std::span<const RunData> runs);

// Sum over a run's rows of the per-token delta histogram (metrics key gap_hist, bins of
// diag/mismatch.h); empty when no row has one.
std::vector<int64_t> run_gap_histogram(const RunData& run);

struct ReportResult {
  std::string html;
  int plots = 0;                   // line plots and the delta histogram
  std::vector<std::string> notes;  // truncated metrics files, plots without data
};

// Renders the report: the plots, the per-token delta histogram of every run with gap_hist rows
// (each run's whole-run histogram as a fraction of its tokens), the summary table. Points whose
// value is missing, null, NaN or infinite are skipped; rows are plotted in ascending step order;
// runs may have any lengths, including one step (drawn as a dot).
ReportResult render_report(std::span<const RunData> runs, const ReportOptions& options = {});

// Loads every folder first (so a bad folder fails before anything is written), renders, and
// writes `out` atomically. Throws like load_run.
ReportResult write_report(std::span<const std::filesystem::path> run_dirs,
                          const std::filesystem::path& out, const ReportOptions& options = {});

}  // namespace lockstep::diag
