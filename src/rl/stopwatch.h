// Wall-clock stage timing of the trainer and the warm start (steady clock, seconds as double):
// one definition, so the two files can share a unity-build translation unit.
#pragma once

#include <chrono>

namespace lockstep::rl::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace lockstep::rl::detail
