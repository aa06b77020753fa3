// Markdown and JSON comparison tables of run summaries (include/lockstep/diag/compare.h).
#include "lockstep/diag/compare.h"

#include <fmt/format.h>

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
      "| run | recipe | guard | deterministic | final eval acc | best eval acc | mean abs delta "
      "| max abs delta | q05 delta | wall time |\n"
      "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const RunSummary& r : runs) {
    const std::string det = r.deterministic ? (*r.deterministic ? "yes" : "no") : "-";
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", cell(r.name),
                       cell(r.recipe), cell(r.guard), det, percent(r.final_eval_accuracy),
                       percent(r.best_eval_accuracy), sig4(r.mean_abs_delta), sig4(r.max_abs_delta),
                       sig4(r.q05_delta), r.wall_time_s ? format_wall_time(*r.wall_time_s) : "-");
  }
  return out;
}

Json compare_json(std::span<const RunSummary> runs) {
  Json arr = Json::array();
  for (const RunSummary& r : runs) {
    Json j;
    j["run"] = r.name;
    j["recipe"] = r.recipe.empty() ? Json(nullptr) : Json(r.recipe);
    j["guard"] = r.guard.empty() ? Json(nullptr) : Json(r.guard);
    j["deterministic"] = opt(r.deterministic);
    j["final_eval_accuracy"] = opt(r.final_eval_accuracy);
    j["best_eval_accuracy"] = opt(r.best_eval_accuracy);
    j["mean_abs_delta"] = opt(r.mean_abs_delta);
    j["max_abs_delta"] = opt(r.max_abs_delta);
    j["q05_delta"] = opt(r.q05_delta);
    j["wall_time_s"] = opt(r.wall_time_s);
    arr.push_back(std::move(j));
  }
  return arr;
}

}  // namespace lockstep::diag
