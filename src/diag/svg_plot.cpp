// SVG line plots (include/lockstep/diag/svg_plot.h): layout constants, ticks, polylines, legend.
#include "lockstep/diag/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace lockstep::diag {
namespace {

// Layout in SVG user units (pixels at 100 % zoom).
constexpr double kWidth = 560, kLeft = 72, kRight = 20, kTop = 36, kPlotHeight = 220;
constexpr double kLegendTop = kTop + kPlotHeight + 48, kLegendRow = 18;

std::string num(double v) { return fmt::format("{:.2f}", v); }

std::string dash_attr(LineStyle st) {
  const std::string_view d = dash_array(st);
  return d.empty() ? std::string() : fmt::format(" stroke-dasharray=\"{}\"", d);
}

}  // namespace

std::string_view dash_array(LineStyle style) {
  switch (style) {
    case LineStyle::kSolid:
      return "";
    case LineStyle::kDashed:
      return "6 3";
    case LineStyle::kDotted:
      return "2 3";
    case LineStyle::kDashDot:
      return "8 3 2 3";
  }
  return "";
}

std::vector<double> ema(std::span<const double> x, double beta) {
  if (!(beta >= 0 && beta < 1))
    throw std::invalid_argument(fmt::format("EMA smoothing factor {} must be in [0, 1)", beta));
  std::vector<double> s(x.size());
  for (size_t k = 0; k < x.size(); ++k) s[k] = k == 0 ? x[0] : beta * s[k - 1] + (1 - beta) * x[k];
  return s;
}

std::vector<double> nice_ticks(double lo, double hi, int target, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi < lo)
    throw std::invalid_argument(fmt::format("nice_ticks: bad range [{}, {}]", lo, hi));
  if (hi == lo) {
    const double d = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= d;
    hi += d;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  double step = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
  if (integer) step = std::max(step, 1.0);
  const double first = std::floor(lo / step), last = std::ceil(hi / step);
  std::vector<double> ticks;
  for (double k = first; k <= last; k += 1) ticks.push_back(k * step);
  return ticks;
}

std::string tick_label(double v, double spacing) {
  if (std::fabs(v) < spacing * 1e-9) v = 0;  // -0 and rounding residue at the origin
  const double a = std::fabs(v);
  // Small or large spacings use exponent notation, whose zero is plain "0".
  if (a >= 1e6 || spacing < 1e-4) return fmt::format("{:.3g}", v);
  const int decimals = std::max(0, int(-std::floor(std::log10(spacing) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_svg_plot(const PlotSpec& spec) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const PlotSeries& s : spec.series)
    for (const auto& [x, y] : s.points) {
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
    }
  if (xmin > xmax) xmin = xmax = ymin = ymax = 0;  // no points: empty axes
  const std::vector<double> xt = nice_ticks(xmin, xmax, 6, spec.integer_x);
  const std::vector<double> yt = nice_ticks(ymin, ymax, 5, false);
  const double x0 = xt.front(), x1 = xt.back(), y0 = yt.front(), y1 = yt.back();
  const double pw = kWidth - kLeft - kRight;
  const auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  const auto py = [&](double y) { return kTop + kPlotHeight - (y - y0) / (y1 - y0) * kPlotHeight; };
  // Two legend columns of ~40 characters at 11 px, one when a label is longer.
  size_t longest = 0;
  for (const LegendEntry& e : spec.legend) longest = std::max(longest, e.label.size());
  const size_t columns = longest <= 40 ? 2 : 1;
  const size_t legend_rows = (spec.legend.size() + columns - 1) / columns + 1;  // + the note
  const double height = kLegendTop + double(legend_rows) * kLegendRow + 6;

  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\">\n",
      num(kWidth), num(height));
  o += fmt::format("<title>{}</title>\n", xml_escape(spec.title));
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n",
                   num(kWidth), num(height));
  o += fmt::format(
      "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">{}"
      "</text>\n",
      num(kWidth / 2), xml_escape(spec.title));
  // Grid, ticks and tick labels.
  const double xs = xt.size() > 1 ? xt[1] - xt[0] : 1, ys = yt.size() > 1 ? yt[1] - yt[0] : 1;
  o += "<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n";
  for (double t : yt)
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", num(kLeft), num(py(t)),
                     num(kLeft + pw), num(py(t)));
  for (double t : xt)
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", num(px(t)), num(kTop),
                     num(px(t)), num(kTop + kPlotHeight));
  o += "</g>\n<g class=\"axes\" font-size=\"11\" fill=\"#333333\">\n";
  for (double t : yt)
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(kLeft - 6),
                     num(py(t) + 4), xml_escape(tick_label(t, ys)));
  for (double t : xt)
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(px(t)),
                     num(kTop + kPlotHeight + 16), xml_escape(tick_label(t, xs)));
  o += "</g>\n";
  o += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\"/>\n",
      num(kLeft), num(kTop), num(pw), num(kPlotHeight));
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n",
                   num(kLeft + pw / 2), num(kTop + kPlotHeight + 34), xml_escape(spec.x_label));
  o += fmt::format(
      "<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" font-size=\"12\" "
      "transform=\"rotate(-90 14 {0})\">{1}</text>\n",
      num(kTop + kPlotHeight / 2), xml_escape(spec.y_label));
  // Series: raw first (under), then EMA.
  for (const PlotSeries& s : spec.series) {
    if (s.points.empty()) continue;
    const std::string dash = dash_attr(s.style);
    if (s.points.size() == 1) {
      o +=
          fmt::format("<circle class=\"point\" cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\"/>\n",
                      num(px(s.points[0].first)), num(py(s.points[0].second)), xml_escape(s.color));
      continue;
    }
    std::vector<double> ys_raw;
    for (const auto& p : s.points) ys_raw.push_back(p.second);
    const std::vector<double> sm = ema(ys_raw, spec.smoothing);
    std::string raw, smooth;
    for (size_t k = 0; k < s.points.size(); ++k) {
      raw += fmt::format("{}{},{}", k ? " " : "", num(px(s.points[k].first)), num(py(ys_raw[k])));
      smooth += fmt::format("{}{},{}", k ? " " : "", num(px(s.points[k].first)), num(py(sm[k])));
    }
    o += fmt::format(
        "<polyline class=\"raw\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1\" "
        "stroke-opacity=\"0.35\"{}/>\n",
        raw, xml_escape(s.color), dash);
    o += fmt::format(
        "<polyline class=\"ema\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        smooth, xml_escape(s.color), dash);
  }
  // Legend entries, then the line-style note.
  o += "<g class=\"legend\" font-size=\"11\" fill=\"#222222\">\n";
  const double col_w = pw / double(columns);
  for (size_t i = 0; i < spec.legend.size(); ++i) {
    const LegendEntry& e = spec.legend[i];
    const double lx = kLeft + double(i % columns) * col_w;
    const double ly = kLegendTop + double(i / columns) * kLegendRow;
    o += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"{}/>\n",
        num(lx), num(ly - 4), num(lx + 22), num(ly - 4), xml_escape(e.color), dash_attr(e.style));
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", num(lx + 28), num(ly),
                     xml_escape(e.label));
  }
  o += fmt::format(
      "<text x=\"{}\" y=\"{}\" fill=\"#666666\">thin light line: raw; thick line: EMA (beta "
      "{})</text>\n",
      num(kLeft), num(kLegendTop + double(legend_rows - 1) * kLegendRow), spec.smoothing);
  o += "</g>\n</svg>\n";
  return o;
}

std::string render_svg_histogram(const HistogramSpec& spec) {
  constexpr double kLabelSpace = 70;  // slanted bin labels under the axis
  const size_t bins = spec.categories.size();
  double lo = 1.0;
  for (const HistogramSeries& s : spec.series)
    for (double f : s.fractions)
      if (f > 0 && std::isfinite(f)) lo = std::min(lo, f);
  // One decade below the smallest non-zero fraction, so it stands clear of the empty bins.
  const double floor_decade = std::max(-9.0, std::floor(std::log10(lo)) - 1);
  const double pw = kWidth - kLeft - kRight;
  const auto px = [&](double b) { return kLeft + b / double(std::max<size_t>(bins, 1)) * pw; };
  const auto py = [&](double f) {
    const double l = f > 0 ? std::max(std::log10(f), floor_decade) : floor_decade;
    return kTop + kPlotHeight - (l - floor_decade) / -floor_decade * kPlotHeight;
  };
  size_t longest = 0;
  for (const LegendEntry& e : spec.legend) longest = std::max(longest, e.label.size());
  const size_t columns = longest <= 40 ? 2 : 1;
  const size_t legend_rows = (spec.legend.size() + columns - 1) / columns;
  const double legend_top = kLegendTop + kLabelSpace;
  const double height = legend_top + double(legend_rows) * kLegendRow + 6;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"histogram\" width=\"{0}\" "
      "height=\"{1}\" viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\">\n",
      num(kWidth), num(height));
  o += fmt::format("<title>{}</title>\n", xml_escape(spec.title));
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n",
                   num(kWidth), num(height));
  o += fmt::format(
      "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">{}"
      "</text>\n",
      num(kWidth / 2), xml_escape(spec.title));
  o += "<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n";
  for (double d = floor_decade; d <= 0; d += 1)
    o += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", num(kLeft),
                     num(py(std::pow(10.0, d))), num(kLeft + pw), num(py(std::pow(10.0, d))));
  o += "</g>\n<g class=\"axes\" font-size=\"11\" fill=\"#333333\">\n";
  for (double d = floor_decade; d <= 0; d += 1)
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(kLeft - 6),
                     num(py(std::pow(10.0, d)) + 4), d == 0 ? "1" : fmt::format("1e{}", int(d)));
  for (size_t b = 0; b < bins; ++b) {
    const double cx = px(double(b) + 0.5), cy = kTop + kPlotHeight + 10;
    o += fmt::format(
        "<text x=\"{0}\" y=\"{1}\" text-anchor=\"end\" font-size=\"9\" "
        "transform=\"rotate(-50 {0} {1})\">{2}</text>\n",
        num(cx), num(cy), xml_escape(spec.categories[b]));
  }
  o += "</g>\n";
  o += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\"/>\n",
      num(kLeft), num(kTop), num(pw), num(kPlotHeight));
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n",
                   num(kLeft + pw / 2), num(kTop + kPlotHeight + kLabelSpace + 8),
                   xml_escape(spec.x_label));
  o += fmt::format(
      "<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" font-size=\"12\" "
      "transform=\"rotate(-90 14 {0})\">fraction of tokens (log)</text>\n",
      num(kTop + kPlotHeight / 2));
  for (const HistogramSeries& s : spec.series) {
    if (s.fractions.size() != bins) continue;
    std::string pts = fmt::format("{},{}", num(px(0)), num(py(0)));
    for (size_t b = 0; b < bins; ++b) {
      const double y = py(s.fractions[b]);
      pts +=
          fmt::format(" {},{} {},{}", num(px(double(b))), num(y), num(px(double(b + 1))), num(y));
    }
    pts += fmt::format(" {},{}", num(px(double(bins))), num(py(0)));
    o += fmt::format(
        "<polyline class=\"hist\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        pts, xml_escape(s.color), dash_attr(s.style));
  }
  o += "<g class=\"legend\" font-size=\"11\" fill=\"#222222\">\n";
  const double col_w = pw / double(columns);
  for (size_t i = 0; i < spec.legend.size(); ++i) {
    const LegendEntry& e = spec.legend[i];
    const double lx = kLeft + double(i % columns) * col_w;
    const double ly = legend_top + double(i / columns) * kLegendRow;
    o += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"{}/>\n",
        num(lx), num(ly - 4), num(lx + 22), num(ly - 4), xml_escape(e.color), dash_attr(e.style));
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", num(lx + 28), num(ly),
                     xml_escape(e.label));
  }
  o += "</g>\n</svg>\n";
  return o;
}

}  // namespace lockstep::diag
