// The comparison table of several runs' final summaries, in the shape low-precision RL reports
// use (recipe, guard, deterministic, final / best eval accuracy, gap statistics, wall time), as
// markdown for people and JSON for scripts. Only the writer: launching the runs is the caller's.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "lockstep/diag/run_summary.h"
#include "lockstep/recipe/json.h"

namespace lockstep::diag {

// A GitHub-flavoured markdown table, one row per run in the given order:
// | run | recipe | sampler | guard | deterministic | seed | start eval acc | final eval acc |
// best eval acc | mean abs delta | max abs delta | q05 delta | wall time |. sampler is the
// sampler's recipe, "=" when it shared the learner's. Missing values print as "-"; accuracies as
// percentages with one decimal, gaps with 4 significant digits, wall time as seconds / minutes /
// hours. Cell text has '|' escaped, so a run name cannot break the table.
std::string compare_markdown(std::span<const RunSummary> runs);

// The same rows as a JSON array of objects with the keys run, recipe, sampler_recipe (null when
// shared), guard, deterministic, seed, start_eval_accuracy, start_eval_accuracy_bf16,
// final_eval_accuracy, final_eval_accuracy_bf16, best_eval_accuracy, mean_abs_delta,
// max_abs_delta, q05_delta, truncated_frac, tis_clip_frac, gated_segment_frac,
// repair_active_frac, wall_time_s (raw numbers, accuracies as fractions; null where missing).
Json compare_json(std::span<const RunSummary> runs);

// Mean and spread of one quantity over the runs of a group (the seeds of one configuration):
// n runs that have it, their mean and the sample standard deviation (divide by n - 1; 0 for n = 1).
struct Spread {
  int64_t n = 0;
  double mean = 0, sd = 0;
};
Spread spread_of(std::span<const double> values);

// The runs of one configuration (recipe, sampler recipe, guard, deterministic) over seeds.
struct GroupSummary {
  std::string recipe, sampler_recipe, guard;
  std::optional<bool> deterministic;
  std::vector<std::string> runs;  // run names, in order
  std::vector<uint64_t> seeds;    // the seeds the runs carry
  // start_bf16: the warm start read through bf16 (step 0, eval_accuracy_bf16); start: through the
  // sampler's recipe; final: the last evaluation; rise_bf16 = final - start_bf16 (the rise over
  // the bf16 warm start, the headline number); recovery = start_bf16 - start (what the sampler's
  // quantization lost at the start, which a run may win back).
  Spread start_bf16, start, final, rise_bf16, recovery;
  Spread mean_abs_delta, max_abs_delta, truncated, tis_clip, gated, repair_active, wall_time_s;
};
// Groups in order of first appearance.
std::vector<GroupSummary> compare_groups(std::span<const RunSummary> runs);
// | recipe | sampler | guard | deterministic | seeds | bf16 start | start | final | rise over
// bf16 start | mean abs delta | max abs delta | truncated | TIS clipped | gated segments |
// repaired segments | wall time |, each cell "mean ± sd" (sd over seeds, n - 1; the mean alone
// for one seed).
std::string compare_groups_markdown(std::span<const GroupSummary> groups);
Json compare_groups_json(std::span<const GroupSummary> groups);

// Formats seconds for tables: "12.3 s", "4.5 min", "1.25 h".
std::string format_wall_time(double seconds);

}  // namespace lockstep::diag
