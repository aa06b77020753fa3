// The packed-layout check of lockstep/tensor/packed_offsets.h.
#include "lockstep/tensor/packed_offsets.h"

#include <fmt/format.h>

#include <stdexcept>

namespace lockstep {

void check_packed_offsets(std::string_view caller, std::span<const int64_t> offsets, size_t tokens,
                          size_t responses) {
  if (offsets.size() != responses + 1 || offsets.front() != 0 || offsets.back() != int64_t(tokens))
    throw std::invalid_argument(
        fmt::format("{}: offsets must have R + 1 = {} entries from 0 to T = {} (got {} entries)",
                    caller, responses + 1, tokens, offsets.size()));
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    if (offsets[i + 1] < offsets[i])
      throw std::invalid_argument(fmt::format("{}: offsets[{}] = {} < offsets[{}] = {}", caller,
                                              i + 1, offsets[i + 1], i, offsets[i]));
}

}  // namespace lockstep
