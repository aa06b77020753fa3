// Markdown and JSON comparison tables of run summaries (include/lockstep/diag/compare.h).
#include "lockstep/diag/compare.h"

#include <fmt/format.h>

#include <cmath>

namespace lockstep::diag {
namespace {

std::string cell(const std::string& s) {
  if (s.empty()) return "-";
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n' || c == '\r')
      out += ' ';
    else
      out += c;
  }
  return out;
}

std::string percent(const std::optional<double>& v) {
  return v ? fmt::format("{:.1f}%", *v * 100.0) : "-";
}

std::string sig4(const std::optional<double>& v) { return v ? fmt::format("{:.4g}", *v) : "-"; }

template <class T>
Json opt(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

}  // namespace

std::string format_wall_time(double s) {
  if (s < 120) return fmt::format("{:.1f} s", s);
  if (s < 2 * 3600) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.2f} h", s / 3600);
}

std::string compare_markdown(std::span<const RunSummary> runs) {
  std::string out =
      "| run | recipe | sampler | guard | deterministic | seed | start eval acc | final eval acc "
      "| best eval acc | mean abs delta | max abs delta | q05 delta | wall time |\n"
      "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const RunSummary& r : runs) {
    const std::string det = r.deterministic ? (*r.deterministic ? "yes" : "no") : "-";
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                       cell(r.name), cell(r.recipe),
                       r.sampler_recipe.empty() ? "=" : cell(r.sampler_recipe), cell(r.guard), det,
                       r.seed ? fmt::format("{}", *r.seed) : "-", percent(r.start_eval_accuracy),
                       percent(r.final_eval_accuracy), percent(r.best_eval_accuracy),
                       sig4(r.mean_abs_delta), sig4(r.max_abs_delta), sig4(r.q05_delta),
                       r.wall_time_s ? format_wall_time(*r.wall_time_s) : "-");
  }
  return out;
}

Json compare_json(std::span<const RunSummary> runs) {
  Json arr = Json::array();
  for (const RunSummary& r : runs) {
    Json j;
    j["run"] = r.name;
    j["recipe"] = r.recipe.empty() ? Json(nullptr) : Json(r.recipe);
    j["sampler_recipe"] = r.sampler_recipe.empty() ? Json(nullptr) : Json(r.sampler_recipe);
    j["guard"] = r.guard.empty() ? Json(nullptr) : Json(r.guard);
    j["deterministic"] = opt(r.deterministic);
    j["seed"] = opt(r.seed);
    j["start_eval_accuracy"] = opt(r.start_eval_accuracy);
    j["start_eval_accuracy_bf16"] = opt(r.start_eval_accuracy_bf16);
    j["final_eval_accuracy"] = opt(r.final_eval_accuracy);
    j["final_eval_accuracy_bf16"] = opt(r.final_eval_accuracy_bf16);
    j["best_eval_accuracy"] = opt(r.best_eval_accuracy);
    j["mean_abs_delta"] = opt(r.mean_abs_delta);
    j["max_abs_delta"] = opt(r.max_abs_delta);
    j["q05_delta"] = opt(r.q05_delta);
    j["truncated_frac"] = opt(r.truncated_frac);
    j["tis_clip_frac"] = opt(r.tis_clip_frac);
    j["gated_segment_frac"] = opt(r.gated_segment_frac);
    j["repair_active_frac"] = opt(r.repair_active_frac);
    j["wall_time_s"] = opt(r.wall_time_s);
    arr.push_back(std::move(j));
  }
  return arr;
}

Spread spread_of(std::span<const double> v) {
  Spread s;
  s.n = int64_t(v.size());
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

std::vector<GroupSummary> compare_groups(std::span<const RunSummary> runs) {
  struct Acc {
    GroupSummary g;
    std::vector<double> start_bf16, start, final, rise, recovery, mad, maxd, trunc, tis, gated,
        repair, wall;
  };
  std::vector<Acc> acc;
  for (const RunSummary& r : runs) {
    Acc* a = nullptr;
    for (Acc& x : acc)
      if (x.g.recipe == r.recipe && x.g.sampler_recipe == r.sampler_recipe &&
          x.g.guard == r.guard && x.g.deterministic == r.deterministic)
        a = &x;
    if (!a) {
      acc.emplace_back();
      a = &acc.back();
      a->g.recipe = r.recipe;
      a->g.sampler_recipe = r.sampler_recipe;
      a->g.guard = r.guard;
      a->g.deterministic = r.deterministic;
    }
    a->g.runs.push_back(r.name);
    if (r.seed) a->g.seeds.push_back(*r.seed);
    const auto put = [](std::vector<double>& v, const std::optional<double>& x) {
      if (x) v.push_back(*x);
    };
    put(a->start_bf16, r.start_eval_accuracy_bf16);
    put(a->start, r.start_eval_accuracy);
    put(a->final, r.final_eval_accuracy);
    if (r.final_eval_accuracy && r.start_eval_accuracy_bf16)
      a->rise.push_back(*r.final_eval_accuracy - *r.start_eval_accuracy_bf16);
    if (r.start_eval_accuracy && r.start_eval_accuracy_bf16)
      a->recovery.push_back(*r.start_eval_accuracy_bf16 - *r.start_eval_accuracy);
    put(a->mad, r.mean_abs_delta);
    put(a->maxd, r.max_abs_delta);
    put(a->trunc, r.truncated_frac);
    put(a->tis, r.tis_clip_frac);
    put(a->gated, r.gated_segment_frac);
    put(a->repair, r.repair_active_frac);
    put(a->wall, r.wall_time_s);
  }
  std::vector<GroupSummary> out;
  for (Acc& a : acc) {
    a.g.start_bf16 = spread_of(a.start_bf16);
    a.g.start = spread_of(a.start);
    a.g.final = spread_of(a.final);
    a.g.rise_bf16 = spread_of(a.rise);
    a.g.recovery = spread_of(a.recovery);
    a.g.mean_abs_delta = spread_of(a.mad);
    a.g.max_abs_delta = spread_of(a.maxd);
    a.g.truncated = spread_of(a.trunc);
    a.g.tis_clip = spread_of(a.tis);
    a.g.gated = spread_of(a.gated);
    a.g.repair_active = spread_of(a.repair);
    a.g.wall_time_s = spread_of(a.wall);
    out.push_back(std::move(a.g));
  }
  return out;
}

namespace {

// "81.2 ± 1.3%" (percentages), "+4.0 ± 2.1" points, "0.01234 ± 0.0005" (4 significant digits).
std::string pct_spread(const Spread& s, bool sign = false) {
  if (s.n == 0) return "-";
  const std::string m =
      sign ? fmt::format("{:+.1f}", s.mean * 100) : fmt::format("{:.1f}", s.mean * 100);
  return s.n > 1 ? fmt::format("{} ± {:.1f}%", m, s.sd * 100) : m + "%";
}
std::string sig_spread(const Spread& s) {
  if (s.n == 0) return "-";
  if (s.n == 1) return fmt::format("{:.4g}", s.mean);
  // The mean has 4 significant digits; a spread below its last digit prints as 0 (equal values
  // whose mean carries a rounding residue).
  const double resolution = s.mean == 0 ? 0 : 5e-4 * std::fabs(s.mean);
  return s.sd <= resolution ? fmt::format("{:.4g} ± 0", s.mean)
                            : fmt::format("{:.4g} ± {:.2g}", s.mean, s.sd);
}
Json spread_json(const Spread& s) {
  if (s.n == 0) return nullptr;
  return {{"n", s.n}, {"mean", s.mean}, {"sd", s.sd}};
}

}  // namespace

std::string compare_groups_markdown(std::span<const GroupSummary> groups) {
  std::string out =
      "| recipe | sampler | guard | deterministic | seeds | bf16 start | start | final | rise "
      "over bf16 start | mean abs delta | max abs delta | truncated | TIS clipped | gated "
      "segments | repaired segments | wall time |\n"
      "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
      "---: | ---: | ---: |\n";
  for (const GroupSummary& g : groups) {
    const std::string det = g.deterministic ? (*g.deterministic ? "yes" : "no") : "-";
    const std::string wall = g.wall_time_s.n == 0 ? "-"
                             : g.wall_time_s.n > 1
                                 ? fmt::format("{} ± {}", format_wall_time(g.wall_time_s.mean),
                                               format_wall_time(g.wall_time_s.sd))
                                 : format_wall_time(g.wall_time_s.mean);
    out += fmt::format(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        cell(g.recipe), g.sampler_recipe.empty() ? "=" : cell(g.sampler_recipe), cell(g.guard), det,
        g.runs.size(), pct_spread(g.start_bf16), pct_spread(g.start), pct_spread(g.final),
        pct_spread(g.rise_bf16, /*sign=*/true), sig_spread(g.mean_abs_delta),
        sig_spread(g.max_abs_delta), pct_spread(g.truncated), pct_spread(g.tis_clip),
        pct_spread(g.gated), pct_spread(g.repair_active), wall);
  }
  return out;
}

Json compare_groups_json(std::span<const GroupSummary> groups) {
  Json arr = Json::array();
  for (const GroupSummary& g : groups) {
    Json j;
    j["recipe"] = g.recipe;
    j["sampler_recipe"] = g.sampler_recipe.empty() ? Json(nullptr) : Json(g.sampler_recipe);
    j["guard"] = g.guard;
    j["deterministic"] = opt(g.deterministic);
    j["runs"] = g.runs;
    j["seeds"] = g.seeds;
    j["start_eval_accuracy_bf16"] = spread_json(g.start_bf16);
    j["start_eval_accuracy"] = spread_json(g.start);
    j["final_eval_accuracy"] = spread_json(g.final);
    j["rise_over_bf16_start"] = spread_json(g.rise_bf16);
    j["start_quantization_loss"] = spread_json(g.recovery);
    j["mean_abs_delta"] = spread_json(g.mean_abs_delta);
    j["max_abs_delta"] = spread_json(g.max_abs_delta);
    j["truncated_frac"] = spread_json(g.truncated);
    j["tis_clip_frac"] = spread_json(g.tis_clip);
    j["gated_segment_frac"] = spread_json(g.gated);
    j["repair_active_frac"] = spread_json(g.repair_active);
    j["wall_time_s"] = spread_json(g.wall_time_s);
    arr.push_back(std::move(j));
  }
  return arr;
}

}  // namespace lockstep::diag
