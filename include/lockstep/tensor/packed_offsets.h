// Packed layouts: R variable-length pieces (responses, sequences) stored back to back in T rows,
// piece i in rows [offsets[i], offsets[i + 1]). One check of that layout for every layer that
// takes one (the RL objectives, the mismatch statistics).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace lockstep {

// Checks a packed layout: offsets has responses + 1 entries, starts at 0, ends at tokens and never
// decreases. Throws std::invalid_argument starting with `caller` and naming the offending entry.
void check_packed_offsets(std::string_view caller, std::span<const int64_t> offsets, size_t tokens,
                          size_t responses);

}  // namespace lockstep
