// Self-contained SVG line plots for HTML reports: axes with "nice" ticks and labels, one colour
// per series, a thin light raw line and a thick EMA-smoothed line, a legend. Pure text output,
// well-formed XML, no scripts or external resources.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::diag {

// How a line is drawn: the run's colour tells runs apart, the style the keys of one plot.
enum class LineStyle : uint8_t { kSolid, kDashed, kDotted, kDashDot };
// The SVG stroke-dasharray of a style ("" for solid).
std::string_view dash_array(LineStyle style);

struct PlotSeries {
  std::string color;  // CSS colour, e.g. "#1f77b4"
  LineStyle style = LineStyle::kSolid;
  std::vector<std::pair<double, double>> points;  // (x, y), finite, in ascending x
};

struct LegendEntry {
  std::string label;
  std::string color;
  LineStyle style = LineStyle::kSolid;
};

struct PlotSpec {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;
  std::vector<LegendEntry> legend;
  double smoothing = 0.8;  // EMA factor (see ema())
  bool integer_x = true;   // x ticks on whole numbers (training steps)
};

// EMA of a series: s_0 = x_0, s_k = beta * s_{k-1} + (1 - beta) * x_k (beta in [0, 1); 0 = raw).
std::vector<double> ema(std::span<const double> x, double beta);

// Tick positions covering [lo, hi] with about `target` intervals of 1, 2 or 5 x 10^k (at least 1
// when integer); the first tick <= lo and the last >= hi, so they also give the axis range. A
// degenerate range (lo == hi) is widened by 10 % of |lo| (by 1 when lo is 0) on each side.
std::vector<double> nice_ticks(double lo, double hi, int target, bool integer);

// A tick label with just enough decimals for the tick spacing ("0.25", "1200", "1e-05").
std::string tick_label(double value, double spacing);

// Escapes & < > " ' for XML text and attributes.
std::string xml_escape(std::string_view text);

// A histogram over fixed categories, one outline ("step") line per series, so several runs
// overlay; y is the fraction of the series' total on a log10 axis from the decade below the
// smallest non-zero fraction (at least 1e-9) to 1. Empty bins drop the line to the axis.
struct HistogramSeries {
  std::string color;
  LineStyle style = LineStyle::kSolid;
  std::vector<double> fractions;  // one per category, in [0, 1]
};
struct HistogramSpec {
  std::string title, x_label;
  std::vector<std::string> categories;  // bin labels, drawn slanted under the axis
  std::vector<HistogramSeries> series;
  std::vector<LegendEntry> legend;
};
// Each series gives one <polyline class="hist">.
std::string render_svg_histogram(const HistogramSpec& spec);

// The <svg> element of one plot. Series with one point are drawn as a dot; series with none are
// skipped. Each series with two or more points gives two <polyline> elements, class "raw" and
// class "ema"; each one-point series one <circle class="point">.
std::string render_svg_plot(const PlotSpec& spec);

}  // namespace lockstep::diag
