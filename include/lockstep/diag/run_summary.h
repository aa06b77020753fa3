// One training run as reports and comparison tables see it: the rows of RUN_DIR/metrics.jsonl,
// the recipe / guard / deterministic fields of RUN_DIR/run_meta.json, and the final summary
// (final and best eval accuracy, reward, gap statistics, wall time) computed from them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/diag/metrics.h"

namespace lockstep::diag {

struct RunData {
  std::string name;  // the run folder's name
  std::filesystem::path dir;
  std::string recipe;  // run_meta.json "recipe" (its "name" when an object); "" if absent
  std::string guard;   // run_meta.json "guard"; "" if absent
  std::optional<bool> deterministic;  // run_meta.json "deterministic"
  // run_meta.json "sampler_recipe" {"name", "kv_cache", "learner_kv"}: "" if absent (the sampler
  // shared the learner's recipe; the learner rounded K / V to bf16)
  std::string sampler_recipe, kv_cache, learner_kv;
  bool routing_replay = false;       // run_meta.json "options" routing_replay
  std::optional<uint64_t> seed;      // run_meta.json "options" "seed"
  std::vector<MetricsRow> rows;      // metrics.jsonl, complete lines in file order
  bool truncated_last_line = false;  // metrics.jsonl ended with a partial line (ignored)
};

// Reads RUN_DIR. Throws std::invalid_argument naming the folder when it has no metrics.jsonl;
// std::runtime_error for an unreadable or malformed file (naming file and line). run_meta.json is
// optional; when present but not valid JSON it throws naming it.
RunData load_run(const std::filesystem::path& dir);

// The finite number a row holds under key, if any (null, strings, NaN and inf give none).
std::optional<double> row_number(const MetricsRow& row, std::string_view key);

// Stage-time keys: time_<stage>_s (time_rollout_s, time_logprob_s, time_train_s, time_sync_s, ...).
bool is_stage_time_key(std::string_view key);

struct RunSummary {
  std::string name, recipe, guard;
  std::string sampler_recipe;  // "" when the sampler shared the learner's recipe
  std::optional<bool> deterministic;
  std::optional<uint64_t> seed;
  int64_t rows = 0;
  std::optional<int64_t> last_step;           // the largest "step"
  std::optional<double> final_eval_accuracy;  // last finite eval_accuracy
  std::optional<double> best_eval_accuracy;   // max finite eval_accuracy
  std::optional<double> start_eval_accuracy;  // eval_accuracy of step 0
  // eval_accuracy_bf16 of step 0 and of the last row that has it: the same policies read through
  // a bf16 export, so a rise over the bf16 warm start is told apart from recovering what the
  // sampler's quantization lost at the start.
  std::optional<double> start_eval_accuracy_bf16, final_eval_accuracy_bf16;
  std::optional<double> truncated_frac;      // mean over steps of truncated_frac
  std::optional<double> tis_clip_frac;       // mean over steps of tis_clip_frac (TIS applied)
  std::optional<double> gated_segment_frac;  // sum triage_gated_segments / sum gate segments
  std::optional<double> repair_active_frac;  // sum repair active segments / sum repair segments
  std::optional<double> final_accuracy;      // last finite accuracy (training batch)
  std::optional<double> final_reward;        // last finite reward_mean
  std::optional<double> mean_abs_delta;      // mean over steps of mean_abs_gap
  std::optional<double> max_abs_delta;       // max over steps of max_abs_gap
  std::optional<double> q05_delta;           // min over steps of q05_gap (the worst step)
  // Wall time: the last finite elapsed_s when rows carry it, else the sum over rows of every
  // stage time (keys time_*_s).
  std::optional<double> wall_time_s;
};

RunSummary summarize_run(const RunData& run);

}  // namespace lockstep::diag
