// Argument checks and the serial-threshold constant shared by the ops/ CPU kernels (private).
// Checks throw std::invalid_argument whose message names the tensor, its shape and the rule.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <utility>

namespace lockstep::ops::detail {

template <class... A>
void require(bool ok, fmt::format_string<A...> f, A&&... a) {
  if (!ok) throw std::invalid_argument(fmt::format(f, std::forward<A>(a)...));
}

// Below this many scalar operations a parallel loop runs on one thread. The OpenMP `if` clause
// only changes how many threads run the loop, never which values are computed.
inline constexpr int64_t kParallelMinWork = int64_t(1) << 15;

}  // namespace lockstep::ops::detail
