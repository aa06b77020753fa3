// Loading a run folder and summarising its metrics (include/lockstep/diag/run_summary.h).
#include "lockstep/diag/run_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "lockstep/tensor/file_io.h"

namespace lockstep::diag {

std::optional<double> row_number(const MetricsRow& row, std::string_view key) {
  const auto it = row.find(key);
  if (it == row.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

bool is_stage_time_key(std::string_view k) {
  return k.size() > 7 && k.substr(0, 5) == "time_" && k.substr(k.size() - 2) == "_s";
}

namespace {

std::string folder_name(const std::filesystem::path& dir) {
  std::filesystem::path p = dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  if (name.empty() || name == ".")
    name = std::filesystem::absolute(dir).lexically_normal().filename().string();
  return name.empty() ? dir.string() : name;
}

void read_meta(const std::filesystem::path& file, RunData& run) {
  std::string text;
  try {
    text = read_input_file(file.string());  // regular files only: a FIFO or device is refused
  } catch (const InputPathError& e) {
    throw std::runtime_error(e.what());
  }
  Json meta;
  try {
    meta = parse_json(text);
  } catch (const Json::exception&) {
    meta = Json();  // not JSON: refused below
  }
  if (!meta.is_object())
    throw std::runtime_error(fmt::format("'{}' is not a JSON object", file.string()));
  if (const auto r = meta.find("recipe"); r != meta.end()) {
    if (r->is_string()) run.recipe = r->get<std::string>();
    if (r->is_object() && r->contains("name") && (*r)["name"].is_string())
      run.recipe = (*r)["name"].get<std::string>();
  }
  if (const auto g = meta.find("guard"); g != meta.end() && g->is_string())
    run.guard = g->get<std::string>();
  if (const auto d = meta.find("deterministic"); d != meta.end() && d->is_boolean())
    run.deterministic = d->get<bool>();
  if (const auto sr = meta.find("sampler_recipe"); sr != meta.end() && sr->is_object()) {
    if (sr->contains("name") && (*sr)["name"].is_string() && !(*sr).value("shared_contract", false))
      run.sampler_recipe = (*sr)["name"].get<std::string>();
    if (sr->contains("kv_cache") && (*sr)["kv_cache"].is_string())
      run.kv_cache = (*sr)["kv_cache"].get<std::string>();
    if (sr->contains("learner_kv") && (*sr)["learner_kv"].is_string())
      run.learner_kv = (*sr)["learner_kv"].get<std::string>();
  }
  if (const auto o = meta.find("options"); o != meta.end() && o->is_object()) {
    if (const auto sd = o->find("seed"); sd != o->end() && sd->is_number_unsigned())
      run.seed = sd->get<uint64_t>();
    if (const auto rr = o->find("routing_replay"); rr != o->end() && rr->is_boolean())
      run.routing_replay = rr->get<bool>();
  }
}

}  // namespace

RunData load_run(const std::filesystem::path& dir) {
  RunData run;
  run.dir = dir;
  run.name = folder_name(dir);
  const std::filesystem::path metrics = dir / kMetricsFileName;
  if (!std::filesystem::is_directory(dir))
    throw std::invalid_argument(fmt::format("run folder '{}' does not exist", dir.string()));
  if (!std::filesystem::is_regular_file(metrics))
    throw std::invalid_argument(fmt::format(
        "run folder '{}' has no {} (not a training run, or it has not logged a step yet)",
        dir.string(), kMetricsFileName));
  MetricsFile file = read_metrics(metrics);
  run.rows = std::move(file.rows);
  run.truncated_last_line = file.truncated_last_line;
  const std::filesystem::path meta = dir / "run_meta.json";
  if (std::filesystem::exists(meta)) read_meta(meta, run);
  return run;
}

RunSummary summarize_run(const RunData& run) {
  RunSummary s;
  s.name = run.name;
  s.recipe = run.recipe;
  s.guard = run.guard;
  s.sampler_recipe = run.sampler_recipe;
  s.deterministic = run.deterministic;
  s.seed = run.seed;
  s.rows = int64_t(run.rows.size());
  double gap_sum = 0, stage_sum = 0, trunc_sum = 0, tis_sum = 0;
  double gate_segs = 0, gated = 0, rep_segs = 0, rep_active = 0;
  int64_t gap_n = 0, trunc_n = 0, tis_n = 0;
  bool any_stage = false;
  std::optional<double> elapsed;
  for (const MetricsRow& row : run.rows) {
    if (const auto it = row.find("step"); it != row.end() && it->is_number_integer())
      s.last_step = std::max(s.last_step.value_or(it->get<int64_t>()), it->get<int64_t>());
    const auto step = row.find("step");
    const bool step0 = step != row.end() && step->is_number_integer() && step->get<int64_t>() == 0;
    if (auto v = row_number(row, "eval_accuracy_bf16")) {
      if (step0) s.start_eval_accuracy_bf16 = v;
      s.final_eval_accuracy_bf16 = v;
    }
    if (auto v = row_number(row, "truncated_frac")) {
      trunc_sum += *v;
      ++trunc_n;
    }
    if (auto v = row_number(row, "tis_clip_frac")) {
      tis_sum += *v;
      ++tis_n;
    }
    if (auto a = row_number(row, "triage_gate_segments"),
        b = row_number(row, "triage_gated_segments");
        a && b) {
      gate_segs += *a;
      gated += *b;
    }
    if (auto a = row_number(row, "triage_repair_segments"),
        b = row_number(row, "triage_repair_active_segments");
        a && b) {
      rep_segs += *a;
      rep_active += *b;
    }
    if (auto v = row_number(row, "eval_accuracy")) {
      if (step0) s.start_eval_accuracy = v;
      s.final_eval_accuracy = v;
      s.best_eval_accuracy = std::max(s.best_eval_accuracy.value_or(*v), *v);
    }
    if (auto v = row_number(row, "accuracy")) s.final_accuracy = v;
    if (auto v = row_number(row, "reward_mean")) s.final_reward = v;
    if (auto v = row_number(row, "mean_abs_gap")) {
      gap_sum += *v;
      ++gap_n;
    }
    if (auto v = row_number(row, "max_abs_gap"))
      s.max_abs_delta = std::max(s.max_abs_delta.value_or(*v), *v);
    if (auto v = row_number(row, "q05_gap")) s.q05_delta = std::min(s.q05_delta.value_or(*v), *v);
    if (auto v = row_number(row, "elapsed_s")) elapsed = v;
    for (const auto& [k, v] : row.items()) {
      if (is_stage_time_key(k))
        if (auto x = row_number(row, k)) {
          stage_sum += *x;
          any_stage = true;
        }
    }
  }
  if (gap_n > 0) s.mean_abs_delta = gap_sum / double(gap_n);
  if (trunc_n > 0) s.truncated_frac = trunc_sum / double(trunc_n);
  if (tis_n > 0) s.tis_clip_frac = tis_sum / double(tis_n);
  if (gate_segs > 0) s.gated_segment_frac = gated / gate_segs;
  if (rep_segs > 0) s.repair_active_frac = rep_active / rep_segs;
  if (elapsed)
    s.wall_time_s = elapsed;
  else if (any_stage)
    s.wall_time_s = stage_sum;
  return s;
}

}  // namespace lockstep::diag
