// Training progress on the terminal: on a tty a one-line bar redrawn in place (step/total, reward,
// accuracy, gap, ETA); otherwise (a log file, CI) plain lines every N steps. The stream and the
// tty flag are injected so tests see exactly what a user would.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace lockstep::diag {

struct ProgressUpdate {
  int64_t step = 0;                // completed steps, 1..total
  int64_t total = 0;               // planned steps (> 0)
  double elapsed_s = 0;            // wall time since the first step started
  std::optional<double> reward;    // mean reward of the step's batch
  std::optional<double> accuracy;  // fraction correct (eval when available, else train)
  std::optional<double> gap;       // mean |learner - sampler log-prob|
};

struct ProgressOptions {
  int64_t log_every = 10;  // non-tty: a line at step 1, every log_every steps, and the last step
  int bar_width = 20;      // tty: characters of the bar
};

class ProgressDisplay {
 public:
  ProgressDisplay(std::ostream& out, bool is_tty, ProgressOptions options = {});
  // For the CLI: std::cerr, tty = isatty(stderr).
  static ProgressDisplay for_stderr(ProgressOptions options = {});
  ~ProgressDisplay();
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;
  ProgressDisplay(ProgressDisplay&& other) noexcept;  // the moved-from display prints nothing

  // tty: "\r" + line + "\x1b[K" (clear the rest of the old line), flushed. Non-tty: line + "\n"
  // on the steps ProgressOptions::log_every selects.
  void update(const ProgressUpdate& u);
  // Ends the redrawn line with "\n" on a tty (once; the destructor calls it too).
  void finish();

  // The line without control characters, e.g.
  // "[########------------] 40/100 reward 0.531 acc 41.0% gap 0.0123 eta 1m23s"
  // (the bar only when bar_width > 0; fields without a value are left out; eta from the mean step
  // time so far).
  static std::string format_line(const ProgressUpdate& u, int bar_width);
  // "45s", "3m05s", "2h04m".
  static std::string format_duration(double seconds);

 private:
  std::ostream* out_;
  bool tty_;
  ProgressOptions options_;
  bool line_open_ = false;
};

}  // namespace lockstep::diag
