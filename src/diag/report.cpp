// The HTML run report (include/lockstep/diag/report.h): picks the plots the runs have data for,
// draws them with svg_plot.h, and adds the summary table of run_summary.h.
#include "lockstep/diag/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "lockstep/diag/compare.h"
#include "lockstep/diag/mismatch.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/diag/svg_plot.h"

namespace lockstep::diag {
namespace {

// Tableau 10: distinct hues that stay distinguishable for common colour-vision deficiencies.
constexpr std::array<const char*, 10> kPalette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                  "#9467bd", "#8c564b", "#e377c2", "#17becf",
                                                  "#7f7f7f", "#bcbd22"};
const char* run_color(size_t i) { return kPalette[i % kPalette.size()]; }

// (step, value) of one key, finite values only, in ascending step order (stable).
std::vector<std::pair<double, double>> series_points(const RunData& run, const std::string& key) {
  std::vector<std::pair<double, double>> pts;
  for (const MetricsRow& row : run.rows) {
    const auto step = row.find("step");
    if (step == row.end() || !step->is_number_integer()) continue;
    if (const auto v = row_number(row, key)) pts.emplace_back(double(step->get<int64_t>()), *v);
  }
  std::stable_sort(pts.begin(), pts.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return pts;
}

bool has_data(std::span<const RunData> runs, const std::string& key) {
  for (const RunData& r : runs)
    for (const MetricsRow& row : r.rows)
      if (row_number(row, key)) return true;
  return false;
}

// Display names: folder names, with " #2", " #3" appended to repeats.
std::vector<std::string> display_names(std::span<const RunData> runs) {
  std::map<std::string, int> seen;
  std::vector<std::string> names;
  for (const RunData& r : runs) {
    const int n = ++seen[r.name];
    names.push_back(n == 1 ? r.name : fmt::format("{} #{}", r.name, n));
  }
  return names;
}

std::string run_label(const RunData& r, const std::string& name) {
  std::vector<std::string> parts;
  if (!r.recipe.empty())
    parts.push_back(r.sampler_recipe.empty()
                        ? r.recipe
                        : fmt::format("learner {}, sampler {}", r.recipe, r.sampler_recipe));
  if (!r.kv_cache.empty() && r.kv_cache != "bf16")
    parts.push_back("kv " + r.kv_cache + (r.learner_kv == r.kv_cache ? " (learner matches)" : ""));
  if (r.routing_replay) parts.push_back("routing replay");
  if (!r.guard.empty()) parts.push_back("guard " + r.guard);
  std::string joined;
  for (const std::string& p : parts) joined.append(joined.empty() ? "" : ", ").append(p);
  return parts.empty() ? name : fmt::format("{} ({})", name, joined);
}

std::string fmt_opt(const std::optional<double>& v, const char* spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : "-";
}

constexpr const char* kStyle = R"(body { font-family: sans-serif; margin: 24px; color: #222222; }
h1 { font-size: 22px; margin-bottom: 4px; }
p.meta, p.note { font-size: 13px; color: #555555; margin: 4px 0; }
p.note { color: #a04000; }
div.plots { display: flex; flex-wrap: wrap; gap: 12px; }
div.plots figure { margin: 0; border: 1px solid #dddddd; }
table { border-collapse: collapse; margin-top: 8px; font-size: 13px; }
th, td { border: 1px solid #cccccc; padding: 4px 8px; text-align: right; }
th { background: #f2f2f2; }
td.name, th.name { text-align: left; }
span.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
)";

LineStyle key_style(size_t k) {
  constexpr LineStyle kStyles[] = {LineStyle::kSolid, LineStyle::kDashed, LineStyle::kDotted,
                                   LineStyle::kDashDot};
  return kStyles[k % 4];
}

}  // namespace

std::vector<int64_t> run_gap_histogram(const RunData& run) {
  std::vector<int64_t> sum;
  for (const MetricsRow& row : run.rows) {
    const auto it = row.find("gap_hist");
    if (it == row.end() || !it->is_array() || it->size() != size_t(kGapHistBins)) continue;
    if (sum.empty()) sum.assign(size_t(kGapHistBins), 0);
    for (size_t b = 0; b < sum.size(); ++b)
      if ((*it)[b].is_number_integer()) sum[b] += (*it)[b].get<int64_t>();
  }
  return sum;
}

std::vector<ReportPlot> report_plots(std::span<const RunData> runs) {
  std::vector<ReportPlot> all = {
      {"Reward (batch mean)", "reward", {"reward_mean"}, {}},
      {"Accuracy (solid: train batch, dashed: eval)",
       "fraction correct",
       {"accuracy", "eval_accuracy"},
       {}},
      {"Entropy of the policy", "nats per token", {"entropy"}, {}},
      {"Mean |learner - sampler log-prob|", "mean |delta| (nats)", {"mean_abs_gap"}, {}},
      {"5th percentile of learner - sampler log-prob", "q05 delta (nats)", {"q05_gap"}, {}},
      {"Amplifying regions (|A|-weighted share of tokens)",
       "share of sum |A|",
       {"gap_share_neg_adv_neg", "gap_share_pos_adv_pos"},
       {"A < 0, delta < 0", "A > 0, delta > 0"}},
      {"Contracting regions (|A|-weighted share of tokens)",
       "share of sum |A|",
       {"gap_share_pos_adv_neg", "gap_share_neg_adv_pos"},
       {"A > 0, delta < 0", "A < 0, delta > 0"}},
      {"64-token segments by mean delta",
       "segments per step",
       {"gap_segments_below_0_5", "gap_segments_below_1_5", "gap_segments"},
       {"mean < -0.5", "mean < -1.5", "all segments"}},
      {"Tail tokens (delta < -6)", "tokens per step", {"gap_tokens_below_6"}, {}},
      {"TIS: tokens truncated at the cap", "fraction of tokens", {"tis_clip_frac"}, {}},
      {"TRIAGE gate",
       "segments per step",
       {"triage_gated_segments", "triage_tail_segments", "triage_gate_segments"},
       {"gated", "with a tail token", "negative-advantage segments"}},
      {"TRIAGE repair",
       "segments per step",
       {"triage_repair_active_segments", "triage_repair_segments"},
       {"repaired", "positive-advantage segments"}},
      {"Responses that reached --max-new (scored wrong)",
       "fraction of samples",
       {"truncated_frac"},
       {}}};
  std::set<std::string> stage_keys;
  for (const RunData& r : runs)
    for (const MetricsRow& row : r.rows)
      for (const auto& [k, v] : row.items())
        if (is_stage_time_key(k)) stage_keys.insert(k);
  std::vector<std::string> ordered;
  for (const char* k : {"time_rollout_s", "time_logprob_s", "time_train_s", "time_sync_s"})
    if (stage_keys.erase(k)) ordered.push_back(k);
  ordered.insert(ordered.end(), stage_keys.begin(), stage_keys.end());
  for (const std::string& k : ordered)
    all.push_back(
        {fmt::format("Stage time: {}", k.substr(5, k.size() - 7)), "seconds per step", {k}, {}});
  std::vector<ReportPlot> out;
  for (ReportPlot& p : all)
    if (std::any_of(p.keys.begin(), p.keys.end(), [&](const auto& k) { return has_data(runs, k); }))
      out.push_back(std::move(p));
  return out;
}

ReportResult render_report(std::span<const RunData> runs, const ReportOptions& opt) {
  ReportResult res;
  const std::vector<std::string> names = display_names(runs);
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n";
  h += fmt::format("<title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n",
                   xml_escape(opt.title), kStyle);
  h += fmt::format("<h1>{}</h1>\n", xml_escape(opt.title));
  std::vector<std::string> labels;
  std::string joined_labels;
  for (size_t i = 0; i < runs.size(); ++i) {
    labels.push_back(run_label(runs[i], names[i]));
    joined_labels.append(i ? "; " : "").append(labels.back());
  }
  h += fmt::format(
      "<p class=\"meta\">{} run{}: {}. x axis: training step. Thick lines: EMA with "
      "beta {} (s_k = beta s_(k-1) + (1 - beta) x_k); thin light lines: raw values; "
      "missing, NaN and infinite values are skipped.</p>\n",
      runs.size(), runs.size() == 1 ? "" : "s", xml_escape(joined_labels), opt.smoothing);
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].truncated_last_line)
      res.notes.push_back(
          fmt::format("{}: metrics.jsonl ends with a partial line (a killed run); "
                      "it was ignored",
                      names[i]));
  const std::vector<ReportPlot> plots = report_plots(runs);
  if (plots.empty()) res.notes.push_back("no run has a plottable metric");
  for (const std::string& n : res.notes)
    h += fmt::format("<p class=\"note\">{}</p>\n", xml_escape(n));

  h += "<div class=\"plots\">\n";
  for (const ReportPlot& p : plots) {
    PlotSpec spec;
    spec.title = p.title;
    spec.x_label = "step";
    spec.y_label = p.y_label;
    spec.smoothing = opt.smoothing;
    for (size_t i = 0; i < runs.size(); ++i) {
      bool any = false;
      for (size_t k = 0; k < p.keys.size(); ++k) {
        PlotSeries s{run_color(i), key_style(k), series_points(runs[i], p.keys[k])};
        any = any || !s.points.empty();
        spec.series.push_back(std::move(s));
      }
      if (any) spec.legend.push_back({labels[i], run_color(i), LineStyle::kSolid});
    }
    if (p.keys.size() > 1)
      for (size_t k = 0; k < p.keys.size(); ++k)
        if (has_data(runs, p.keys[k]))
          spec.legend.push_back(
              {k < p.labels.size() ? p.labels[k] : p.keys[k], "#555555", key_style(k)});
    h += "<figure>\n" + render_svg_plot(spec) + "</figure>\n";
    ++res.plots;
  }
  // The per-token delta histogram, one outline per run over all its steps.
  HistogramSpec hist;
  hist.title = "Per-token delta = learner - sampler log-prob, all steps";
  hist.x_label = "delta (nats); bins symmetric in |delta|";
  for (int b = 0; b < kGapHistBins; ++b) hist.categories.push_back(gap_hist_label(b));
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::vector<int64_t> counts = run_gap_histogram(runs[i]);
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    if (total == 0) continue;
    HistogramSeries s{run_color(i), LineStyle::kSolid, {}};
    for (int64_t c : counts) s.fractions.push_back(double(c) / double(total));
    hist.series.push_back(std::move(s));
    hist.legend.push_back(
        {fmt::format("{} ({} tokens)", labels[i], total), run_color(i), LineStyle::kSolid});
  }
  if (!hist.series.empty()) {
    h += "<figure>\n" + render_svg_histogram(hist) + "</figure>\n";
    ++res.plots;
  }
  h += "</div>\n";

  h += "<h2>Summary</h2>\n<table>\n<tr><th class=\"name\">run</th><th class=\"name\">recipe</th>"
       "<th class=\"name\">guard</th><th>steps</th><th>final eval acc</th><th>best eval acc</th>"
       "<th>final reward</th><th>mean |delta|</th><th>total time</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary s = summarize_run(runs[i]);
    h += fmt::format(
        "<tr><td class=\"name\"><span class=\"swatch\" style=\"background: {}\"></span>{}</td>"
        "<td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>\n",
        run_color(i), xml_escape(names[i]),
        xml_escape(s.recipe.empty()           ? "-"
                   : s.sampler_recipe.empty() ? s.recipe
                                              : s.recipe + " (sampler " + s.sampler_recipe + ")"),
        xml_escape(s.guard.empty() ? "-" : s.guard),
        s.last_step ? fmt::format("{}", *s.last_step) : "-",
        s.final_eval_accuracy ? fmt::format("{:.1f}%", *s.final_eval_accuracy * 100) : "-",
        s.best_eval_accuracy ? fmt::format("{:.1f}%", *s.best_eval_accuracy * 100) : "-",
        fmt_opt(s.final_reward, "{:.3f}"), fmt_opt(s.mean_abs_delta, "{:.4g}"),
        s.wall_time_s ? format_wall_time(*s.wall_time_s) : "-");
  }
  h += "</table>\n<p class=\"meta\">steps: the last logged step. mean |delta|: mean over steps of "
       "mean_abs_gap. total time: the last elapsed_s, else the sum of the stage times.</p>\n";
  h += "</body>\n</html>\n";
  res.html = std::move(h);
  return res;
}

ReportResult write_report(std::span<const std::filesystem::path> run_dirs,
                          const std::filesystem::path& out, const ReportOptions& opt) {
  std::vector<RunData> runs;
  for (const auto& d : run_dirs) runs.push_back(load_run(d));
  ReportResult res = render_report(runs, opt);
  write_file_atomic(out, res.html);
  return res;
}

}  // namespace lockstep::diag
