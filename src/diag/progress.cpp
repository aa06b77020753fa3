// Progress bar / progress log lines (include/lockstep/diag/progress.h).
#include "lockstep/diag/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>

namespace lockstep::diag {

ProgressDisplay::ProgressDisplay(std::ostream& out, bool is_tty, ProgressOptions options)
    : out_(&out), tty_(is_tty), options_(options) {
  options_.log_every = std::max<int64_t>(1, options_.log_every);
}

ProgressDisplay::ProgressDisplay(ProgressDisplay&& o) noexcept
    : out_(o.out_),
      tty_(o.tty_),
      options_(o.options_),
      line_open_(std::exchange(o.line_open_, false)) {}

ProgressDisplay ProgressDisplay::for_stderr(ProgressOptions options) {
  return ProgressDisplay(std::cerr, ::isatty(STDERR_FILENO) == 1, options);
}

ProgressDisplay::~ProgressDisplay() {
  try {
    finish();
  } catch (...) {
  }
}

std::string ProgressDisplay::format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
}

std::string ProgressDisplay::format_line(const ProgressUpdate& u, int bar_width) {
  std::string line;
  if (bar_width > 0 && u.total > 0) {
    const double frac = std::clamp(double(u.step) / double(u.total), 0.0, 1.0);
    const int filled = int(frac * bar_width);
    line = "[" + std::string(size_t(filled), '#') + std::string(size_t(bar_width - filled), '-') +
           "] ";
  }
  line += fmt::format("{}/{}", u.step, u.total);
  if (u.reward) line += fmt::format(" reward {:.3f}", *u.reward);
  if (u.accuracy) line += fmt::format(" acc {:.1f}%", *u.accuracy * 100.0);
  if (u.gap) line += fmt::format(" gap {:.3g}", *u.gap);
  if (u.step > 0 && u.step < u.total)
    line += " eta " + format_duration(u.elapsed_s / double(u.step) * double(u.total - u.step));
  else if (u.step >= u.total)
    line += " done in " + format_duration(u.elapsed_s);
  return line;
}

void ProgressDisplay::update(const ProgressUpdate& u) {
  if (tty_) {
    *out_ << '\r' << format_line(u, options_.bar_width) << "\x1b[K" << std::flush;
    line_open_ = true;
    return;
  }
  if (u.step == 1 || u.step % options_.log_every == 0 || u.step == u.total)
    *out_ << "step " << format_line(u, 0) << '\n' << std::flush;
}

void ProgressDisplay::finish() {
  if (line_open_) {
    *out_ << '\n' << std::flush;
    line_open_ = false;
  }
}

}  // namespace lockstep::diag
