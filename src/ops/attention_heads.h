// The compile-time head count of an attention_row call (private to ops/): a runtime NH in
// {1, 2, 4, 8} (attention_row_heads) turned into a template argument.
#pragma once

#include <stdexcept>
#include <type_traits>

namespace lockstep::ops {

template <class F>
decltype(auto) with_row_heads(int nh, F&& f) {
  switch (nh) {
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 1:
      return f(std::integral_constant<int, 1>{});
  }
  throw std::logic_error("attention: heads per row call must be 1, 2, 4 or 8");
}

}  // namespace lockstep::ops
