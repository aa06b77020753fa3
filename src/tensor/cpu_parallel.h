// The serial threshold shared by every OpenMP loop of the CPU engine (private to the library).
// The OpenMP `if` clause only changes how many threads run a loop, never which values it computes.
#pragma once

#include <cstdint>

namespace lockstep::detail {

// Below this many scalar operations a parallel loop runs on one thread.
inline constexpr int64_t kParallelMinWork = int64_t(1) << 15;

}  // namespace lockstep::detail
