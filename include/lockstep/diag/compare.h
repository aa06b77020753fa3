// The comparison table of several runs' final summaries, in the shape low-precision RL reports
// use (recipe, guard, deterministic, final / best eval accuracy, gap statistics, wall time), as
// markdown for people and JSON for scripts. Only the writer: launching the runs is the caller's.
#pragma once

#include <span>
#include <string>

#include "lockstep/diag/run_summary.h"
#include "lockstep/recipe/json.h"

namespace lockstep::diag {

// A GitHub-flavoured markdown table, one row per run in the given order:
// | run | recipe | guard | deterministic | final eval acc | best eval acc | mean abs delta |
// max abs delta | q05 delta | wall time |. Missing values print as "-"; accuracies as percentages
// with one decimal, gaps with 4 significant digits, wall time as seconds / minutes / hours. Cell
// text has '|' escaped, so a run name cannot break the table.
std::string compare_markdown(std::span<const RunSummary> runs);

// The same rows as a JSON array of objects with the keys run, recipe, guard, deterministic,
// final_eval_accuracy, best_eval_accuracy, mean_abs_delta, max_abs_delta, q05_delta, wall_time_s
// (raw numbers, accuracies as fractions; null where missing).
Json compare_json(std::span<const RunSummary> runs);

// Formats seconds for tables: "12.3 s", "4.5 min", "1.25 h".
std::string format_wall_time(double seconds);

}  // namespace lockstep::diag
