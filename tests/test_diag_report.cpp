// Tests of the report building blocks: ticks, tick labels, EMA, XML escaping, SVG element counts,
// run summaries (NaN / null skipped, wall time), plot selection, and the comparison table.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "lockstep/diag/compare.h"
#include "lockstep/diag/mismatch.h"
#include "lockstep/diag/report.h"
#include "lockstep/diag/svg_plot.h"

using namespace lockstep::diag;

namespace {

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

RunData run_of(std::string name, std::vector<MetricsRow> rows) {
  RunData r;
  r.name = std::move(name);
  r.rows = std::move(rows);
  return r;
}

}  // namespace

TEST(DiagPlot, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 1, 5, false),
            (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  EXPECT_EQ(nice_ticks(1, 97, 6, true), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(nice_ticks(1, 3, 6, true), (std::vector<double>{1, 2, 3}));  // integer: step >= 1
  EXPECT_EQ(nice_ticks(0, 0, 5, false), (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
  const std::vector<double> t = nice_ticks(5, 5, 5, false);  // widened to [4.5, 5.5]
  EXPECT_LE(t.front(), 4.5);
  EXPECT_GE(t.back(), 5.5);
  const std::vector<double> n = nice_ticks(-0.013, -0.002, 5, false);
  EXPECT_LE(n.front(), -0.013);
  EXPECT_GE(n.back(), -0.002);
  EXPECT_THROW(nice_ticks(1, 0, 5, false), std::invalid_argument);
  EXPECT_THROW(nice_ticks(0, INFINITY, 5, false), std::invalid_argument);
}

TEST(DiagPlot, TickLabels) {
  EXPECT_EQ(tick_label(0.6000000000000001, 0.2), "0.6");
  EXPECT_EQ(tick_label(40, 20), "40");
  EXPECT_EQ(tick_label(-1e-17, 0.5), "0.0");
  EXPECT_EQ(tick_label(0.0025, 0.0025), "0.003");  // decimals of the spacing's magnitude
  EXPECT_EQ(tick_label(2e-5, 1e-5), "2e-05");
  EXPECT_EQ(tick_label(0.0, 5e-6), "0");  // not "0.000000" beside "5e-06"
  EXPECT_EQ(tick_label(3e6, 1e6), "3e+06");
}

TEST(DiagPlot, EmaAndEscape) {
  const std::vector<double> x = {1, 0, 0, 1};
  EXPECT_EQ(ema(x, 0.5), (std::vector<double>{1, 0.5, 0.25, 0.625}));
  EXPECT_EQ(ema(x, 0.0), x);
  EXPECT_THROW(ema(x, 1.0), std::invalid_argument);
  EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
}

TEST(DiagPlot, ElementsPerSeries) {
  PlotSpec spec;
  spec.title = "t <1>";
  spec.series.push_back({"#111111", LineStyle::kSolid, {{1, 1}, {2, 2}, {3, 1}}});
  spec.series.push_back({"#222222", LineStyle::kDashed, {{2, 0.5}}});
  spec.series.push_back({"#333333", LineStyle::kDotted, {}});
  spec.legend = {{"run a", "#111111", LineStyle::kSolid},
                 {"run <b>", "#222222", LineStyle::kDotted}};
  const std::string svg = render_svg_plot(spec);
  EXPECT_EQ(count(svg, "<polyline class=\"raw\""), 1u);
  EXPECT_EQ(count(svg, "<polyline class=\"ema\""), 1u);
  EXPECT_EQ(count(svg, "<circle class=\"point\""), 1u);
  EXPECT_NE(svg.find("run &lt;b&gt;"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray=\"2 3\""), std::string::npos);  // the dotted legend entry
  EXPECT_NE(svg.find("t &lt;1&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  // Every coordinate is finite and inside the 560-wide canvas.
  const std::regex pts(R"(points="([^"]*)\")");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), pts); it != std::sregex_iterator();
       ++it) {
    const std::string p = (*it)[1];
    EXPECT_EQ(p.find("nan"), std::string::npos);
    EXPECT_EQ(p.find("inf"), std::string::npos);
  }
  // No points at all: empty axes, no lines.
  PlotSpec empty;
  const std::string e = render_svg_plot(empty);
  EXPECT_EQ(count(e, "<polyline"), 0u);
}

TEST(DiagSummary, FinalBestAndSkippedValues) {
  const RunData r = run_of(
      "r1", {{{"step", 1},
              {"reward_mean", 0.1},
              {"eval_accuracy", 0.2},
              {"mean_abs_gap", 0.01},
              {"max_abs_gap", 2.0},
              {"q05_gap", -0.5},
              {"time_rollout_s", 1.5},
              {"time_train_s", 0.5}},
             {{"step", 2},
              {"reward_mean", nullptr},
              {"eval_accuracy", 0.6},
              {"mean_abs_gap", 0.03},
              {"max_abs_gap", 1.0},
              {"q05_gap", -0.9},
              {"time_rollout_s", 1.0}},
             {{"step", 3}, {"reward_mean", 0.3}, {"eval_accuracy", 0.4}, {"mean_abs_gap", "x"}}});
  const RunSummary s = summarize_run(r);
  EXPECT_EQ(s.last_step, 3);
  EXPECT_EQ(s.rows, 3);
  EXPECT_EQ(s.final_eval_accuracy, 0.4);
  EXPECT_EQ(s.best_eval_accuracy, 0.6);
  EXPECT_EQ(s.final_reward, 0.3);
  EXPECT_DOUBLE_EQ(*s.mean_abs_delta, 0.02);
  EXPECT_EQ(s.max_abs_delta, 2.0);
  EXPECT_EQ(s.q05_delta, -0.9);
  EXPECT_EQ(s.wall_time_s, 3.0);  // sum of stage times
  RunData e = r;
  e.rows.back()["elapsed_s"] = 10.0;
  EXPECT_EQ(summarize_run(e).wall_time_s, 10.0);  // elapsed_s wins
  const RunSummary none = summarize_run(run_of("empty", {}));
  EXPECT_FALSE(none.last_step || none.final_eval_accuracy || none.wall_time_s);
}

TEST(DiagReport, PlotsOnlyForKeysWithData) {
  const std::vector<RunData> runs = {run_of("a", {{{"step", 1},
                                                   {"reward_mean", 0.5},
                                                   {"time_zeta_s", 1},
                                                   {"time_sync_s", 2},
                                                   {"time_rollout_s", 3},
                                                   {"entropy", nullptr}}}),
                                     run_of("b", {{{"step", 1}, {"eval_accuracy", 0.5}}})};
  std::vector<std::string> keys;
  for (const ReportPlot& p : report_plots(runs)) keys.push_back(p.keys[0]);
  EXPECT_EQ(keys, (std::vector<std::string>{"reward_mean", "accuracy", "time_rollout_s",
                                            "time_sync_s", "time_zeta_s"}));
  const ReportResult res = render_report(runs);
  EXPECT_EQ(res.plots, 5);
  EXPECT_EQ(count(res.html, "<svg "), 5u);
  EXPECT_EQ(count(res.html, "<circle class=\"point\""), 5u);  // one-step runs: dots
  EXPECT_EQ(res.html.find("<script"), std::string::npos);
  EXPECT_EQ(res.html.find("http://"), res.html.find("http://www.w3.org/2000/svg"));
}

TEST(DiagReport, NamesRepeatedFoldersAndNotesTruncation) {
  std::vector<RunData> runs = {run_of("run", {{{"step", 1}, {"reward_mean", 1}}}),
                               run_of("run", {{{"step", 1}, {"reward_mean", 2}}})};
  runs[1].truncated_last_line = true;
  runs[1].recipe = "nvfp4_per_token";
  runs[1].guard = "triage";
  const ReportResult res = render_report(runs);
  EXPECT_NE(res.html.find("run #2 (nvfp4_per_token, guard triage)"), std::string::npos);
  ASSERT_EQ(res.notes.size(), 1u);
  EXPECT_NE(res.notes[0].find("run #2: metrics.jsonl ends with a partial line"), std::string::npos);
}

TEST(DiagCompare, MarkdownAndJson) {
  RunSummary a;
  a.name = "bf16|ref";
  a.recipe = "bf16";
  a.guard = "none";
  a.deterministic = true;
  a.final_eval_accuracy = 0.8125;
  a.best_eval_accuracy = 0.85;
  a.mean_abs_delta = 0.0;
  a.max_abs_delta = 0.0;
  a.q05_delta = 0.0;
  a.wall_time_s = 3725;
  RunSummary b;
  b.name = "nvfp4";
  b.recipe = "nvfp4_per_token";
  b.mean_abs_delta = 0.0123456;
  b.wall_time_s = 90;
  b.sampler_recipe = "w4a16_nvfp4";
  b.seed = 3;
  b.start_eval_accuracy = 0.5;
  const std::vector<RunSummary> runs = {a, b};
  EXPECT_EQ(
      compare_markdown(runs),
      "| run | recipe | sampler | guard | deterministic | seed | start eval acc | final eval "
      "acc | best eval acc | mean abs delta | max abs delta | q05 delta | wall time |\n"
      "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
      "|\n"
      "| bf16\\|ref | bf16 | = | none | yes | - | - | 81.2% | 85.0% | 0 | 0 | 0 | 62.1 min |\n"
      "| nvfp4 | nvfp4_per_token | w4a16_nvfp4 | - | - | 3 | 50.0% | - | - | 0.01235 | - | - "
      "| 90.0 s |\n");
  const Json j = compare_json(runs);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["final_eval_accuracy"], 0.8125);
  EXPECT_EQ(j[0]["deterministic"], true);
  EXPECT_TRUE(j[1]["guard"].is_null());
  EXPECT_TRUE(j[0]["sampler_recipe"].is_null());
  EXPECT_EQ(j[1]["sampler_recipe"], "w4a16_nvfp4");
  EXPECT_EQ(j[1]["seed"], 3);
  EXPECT_TRUE(j[1]["deterministic"].is_null());
  EXPECT_EQ(j[1]["wall_time_s"], 90.0);
  EXPECT_EQ(format_wall_time(600), "10.0 min");
  EXPECT_EQ(format_wall_time(9000), "2.50 h");
}

TEST(DiagCompare, GroupsGiveMeanAndSpreadOverSeeds) {
  EXPECT_EQ(spread_of(std::vector<double>{}).n, 0);
  const Spread one = spread_of(std::vector<double>{0.5});
  EXPECT_EQ(one.mean, 0.5);
  EXPECT_EQ(one.sd, 0.0);
  const Spread three = spread_of(std::vector<double>{0.5, 0.7, 0.9});
  EXPECT_DOUBLE_EQ(three.mean, 0.7);
  EXPECT_DOUBLE_EQ(three.sd, 0.2);  // sample sd: sqrt((0.04 + 0 + 0.04) / 2)
  std::vector<RunSummary> runs;
  for (int seed = 0; seed < 3; ++seed)
    for (const char* guard : {"none", "triage"}) {
      RunSummary r;
      r.name = fmt::format("{}-seed{}", guard, seed);
      r.recipe = "bf16";
      r.sampler_recipe = "nvfp4_per_token";
      r.guard = guard;
      r.deterministic = false;
      r.seed = uint64_t(seed);
      r.start_eval_accuracy_bf16 = 0.8;
      r.start_eval_accuracy = 0.7;
      r.final_eval_accuracy = 0.8 + 0.05 * seed;
      r.mean_abs_delta = 0.1;
      r.wall_time_s = 10;
      runs.push_back(r);
    }
  const std::vector<GroupSummary> g = compare_groups(runs);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].guard, "none");
  EXPECT_EQ(g[0].runs, (std::vector<std::string>{"none-seed0", "none-seed1", "none-seed2"}));
  EXPECT_EQ(g[0].seeds, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(g[0].final.mean, 0.85);
  EXPECT_NEAR(g[0].final.sd, 0.05, 1e-15);
  EXPECT_NEAR(g[0].rise_bf16.mean, 0.05, 1e-15);  // over the bf16 warm start
  EXPECT_NEAR(g[0].recovery.mean, 0.1, 1e-15);    // what the sampler's recipe lost at step 0
  const std::string md = compare_groups_markdown(g);
  EXPECT_NE(md.find("| bf16 | nvfp4_per_token | none | no | 3 | 80.0 ± 0.0% | 70.0 ± 0.0% | "
                    "85.0 ± 5.0% | +5.0 ± 5.0% | 0.1 ± 0 |"),
            std::string::npos)
      << md;
  const Json j = compare_groups_json(g);
  EXPECT_EQ(j[1]["guard"], "triage");
  EXPECT_EQ(j[1]["final_eval_accuracy"]["n"], 3);
  EXPECT_TRUE(j[1]["tis_clip_frac"].is_null());
}

TEST(DiagReport, MismatchPlotsAndTheDeltaHistogram) {
  MetricsRow r1 = {{"step", 1},
                   {"gap_share_neg_adv_neg", 0.2},
                   {"gap_share_pos_adv_pos", 0.1},
                   {"gap_segments_below_0_5", 3},
                   {"tis_clip_frac", 0.01},
                   {"triage_gated_segments", 2},
                   {"truncated_frac", 0.5}};
  std::vector<int64_t> h(size_t(kGapHistBins), 0);
  h[1] = 2;
  h[10] = 98;
  r1["gap_hist"] = h;
  MetricsRow r2 = r1;
  r2["step"] = 2;
  const std::vector<RunData> runs = {run_of("mixed", {r1, r2}), run_of("plain", {{{"step", 1}}})};
  EXPECT_EQ(run_gap_histogram(runs[0])[1], 4);
  EXPECT_EQ(run_gap_histogram(runs[0])[10], 196);
  EXPECT_TRUE(run_gap_histogram(runs[1]).empty());
  std::vector<std::string> titles;
  for (const ReportPlot& p : report_plots(runs)) titles.push_back(p.title);
  for (const char* want : {"Amplifying regions (|A|-weighted share of tokens)",
                           "64-token segments by mean delta", "TIS: tokens truncated at the cap",
                           "TRIAGE gate", "Responses that reached --max-new (scored wrong)"})
    EXPECT_NE(std::find(titles.begin(), titles.end(), want), titles.end()) << want;
  EXPECT_EQ(std::find(titles.begin(), titles.end(), "TRIAGE repair"), titles.end());  // no data
  const ReportResult res = render_report(runs);
  EXPECT_EQ(count(res.html, "<svg "), size_t(res.plots));
  EXPECT_EQ(count(res.html, "class=\"histogram\""), 1u);
  EXPECT_EQ(count(res.html, "<polyline class=\"hist\""), 1u);  // one run has a histogram
  EXPECT_NE(res.html.find("[-6, -1.5)"), std::string::npos);
  EXPECT_NE(res.html.find("A &lt; 0, delta &lt; 0"), std::string::npos);  // key labels
}
