// Argument checks and the serial-threshold constant shared by the ops/ CPU kernels (private).
// Checks throw std::invalid_argument whose message names the tensor, its shape and the rule.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <utility>

#include "../tensor/cpu_parallel.h"

namespace lockstep::ops::detail {

template <class... A>
void require(bool ok, fmt::format_string<A...> f, A&&... a) {
  if (!ok) throw std::invalid_argument(fmt::format(f, std::forward<A>(a)...));
}

using lockstep::detail::kParallelMinWork;

}  // namespace lockstep::ops::detail
