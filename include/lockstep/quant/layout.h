// Scale layouts (CONTRACT.md section 7) and grouped (MoE) buffer padding (section 8).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/quant/scale_access.h"  // swizzled_offset, round_up

namespace lockstep {

// compact: row-major [rows, cols] -> swizzled, [roundup(rows,128) * roundup(cols,4)] bytes,
// padding bytes zero.
std::vector<uint8_t> swizzle_scales(std::span<const uint8_t> compact, int64_t rows, int64_t cols);
// Inverse: drops the padding.
std::vector<uint8_t> unswizzle_scales(std::span<const uint8_t> swizzled, int64_t rows,
                                      int64_t cols);

// A grouped buffer whose groups were padded with zero rows to a multiple of `multiple` rows.
struct PaddedGroups {
  std::vector<float> values;            // [padded_offsets.back(), cols]
  std::vector<int64_t> offsets;         // padded group offsets, groups+1 entries
  std::vector<int64_t> source_offsets;  // the offsets before padding
};

// Validate offsets (non-decreasing, start 0, end rows) and pad each group with zero rows.
PaddedGroups pad_groups(std::span<const float> values, int64_t cols,
                        std::span<const int64_t> offsets, int64_t multiple);
// Throws QuantError unless offsets start at 0, never decrease and end at `rows`.
void check_group_offsets(std::span<const int64_t> offsets, int64_t rows);

}  // namespace lockstep
