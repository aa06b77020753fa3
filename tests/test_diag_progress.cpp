// Tests of the progress display: the redrawn tty line (carriage return, clear-to-end, one final
// newline), the plain log lines every N steps, the line format and durations.
#include <gtest/gtest.h>

#include <sstream>

#include "lockstep/diag/progress.h"

using namespace lockstep::diag;

TEST(DiagProgress, LineFormat) {
  ProgressUpdate u{40, 100, 20.0, 0.5312, 0.41, 0.01234};
  EXPECT_EQ(ProgressDisplay::format_line(u, 10),
            "[####------] 40/100 reward 0.531 acc 41.0% gap 0.0123 eta 30s");
  u.reward.reset();
  u.gap.reset();
  EXPECT_EQ(ProgressDisplay::format_line(u, 0), "40/100 acc 41.0% eta 30s");
  u.step = 100;
  EXPECT_EQ(ProgressDisplay::format_line(u, 0), "100/100 acc 41.0% done in 20s");
  u.step = 0;
  EXPECT_EQ(ProgressDisplay::format_line(u, 4), "[----] 0/100 acc 41.0%");
}

TEST(DiagProgress, Durations) {
  EXPECT_EQ(ProgressDisplay::format_duration(44.6), "45s");
  EXPECT_EQ(ProgressDisplay::format_duration(185), "3m05s");
  EXPECT_EQ(ProgressDisplay::format_duration(7440), "2h04m");
  EXPECT_EQ(ProgressDisplay::format_duration(-1), "?");
}

TEST(DiagProgress, TtyRedrawsOneLine) {
  std::ostringstream out;
  {
    ProgressDisplay p(out, /*is_tty=*/true, {.log_every = 10, .bar_width = 4});
    p.update({1, 2, 1.0, 0.5, std::nullopt, std::nullopt});
    p.update({2, 2, 2.0, 1.0, std::nullopt, std::nullopt});
  }  // destructor ends the line
  EXPECT_EQ(out.str(),
            "\r[##--] 1/2 reward 0.500 eta 1s\x1b[K"
            "\r[####] 2/2 reward 1.000 done in 2s\x1b[K\n");
}

TEST(DiagProgress, NonTtyLogsEveryNSteps) {
  std::ostringstream out;
  ProgressDisplay p(out, /*is_tty=*/false, {.log_every = 10, .bar_width = 20});
  for (int64_t s = 1; s <= 25; ++s) p.update({s, 25, double(s), std::nullopt, std::nullopt, 0.5});
  p.finish();
  EXPECT_EQ(out.str(),
            "step 1/25 gap 0.5 eta 24s\n"
            "step 10/25 gap 0.5 eta 15s\n"
            "step 20/25 gap 0.5 eta 5s\n"
            "step 25/25 gap 0.5 done in 25s\n");
}
