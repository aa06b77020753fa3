// Scale swizzling (CONTRACT.md section 7) and grouped-buffer padding (section 8).
#include "lockstep/quant/layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "lockstep/quant/quantize.h"

namespace lockstep {

std::vector<uint8_t> swizzle_scales(std::span<const uint8_t> compact, int64_t rows, int64_t cols) {
  if (int64_t(compact.size()) != rows * cols)
    throw QuantError(fmt::format("swizzle: {} scale bytes for a [{}, {}] scale matrix",
                                 compact.size(), rows, cols));
  const int64_t pr = round_up(rows, 128), pc = round_up(cols, 4);
  std::vector<uint8_t> out(size_t(pr * pc), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(swizzled_offset(r, c, pc))] = compact[size_t(r * cols + c)];
  return out;
}

std::vector<uint8_t> unswizzle_scales(std::span<const uint8_t> swizzled, int64_t rows,
                                      int64_t cols) {
  const int64_t pr = round_up(rows, 128), pc = round_up(cols, 4);
  if (int64_t(swizzled.size()) != pr * pc)
    throw QuantError(fmt::format(
        "unswizzle: {} bytes, expected {} for a [{}, {}] scale matrix padded to [{}, {}]",
        swizzled.size(), pr * pc, rows, cols, pr, pc));
  std::vector<uint8_t> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(r * cols + c)] = swizzled[size_t(swizzled_offset(r, c, pc))];
  return out;
}

void check_group_offsets(std::span<const int64_t> offsets, int64_t rows) {
  if (offsets.size() < 2)
    throw QuantError(
        fmt::format("group offsets need at least 2 entries (one group), got {}", offsets.size()));
  if (offsets.front() != 0)
    throw QuantError(fmt::format("group offsets must start at 0, got {}", offsets.front()));
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    if (offsets[g + 1] < offsets[g])
      throw QuantError(fmt::format("group offsets decrease at group {}: {} > {}", g, offsets[g],
                                   offsets[g + 1]));
  if (offsets.back() != rows)
    throw QuantError(
        fmt::format("group offsets end at {} but the buffer has {} rows", offsets.back(), rows));
}

PaddedGroups pad_groups(std::span<const float> values, int64_t cols,
                        std::span<const int64_t> offsets, int64_t multiple) {
  if (multiple <= 0)
    throw QuantError(fmt::format("group padding multiple must be positive, got {}", multiple));
  if (cols < 0 || (cols == 0 ? !values.empty() : int64_t(values.size()) % cols != 0))
    throw QuantError(fmt::format("{} values do not form rows of {} columns", values.size(), cols));
  const int64_t rows = cols == 0 ? 0 : int64_t(values.size()) / cols;
  check_group_offsets(offsets, rows);
  PaddedGroups p;
  p.source_offsets.assign(offsets.begin(), offsets.end());
  p.offsets.push_back(0);
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    p.offsets.push_back(p.offsets.back() + round_up(offsets[g + 1] - offsets[g], multiple));
  p.values.assign(size_t(p.offsets.back() * cols), 0.0f);
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    std::copy(values.begin() + offsets[g] * cols, values.begin() + offsets[g + 1] * cols,
              p.values.begin() + p.offsets[g] * cols);
  return p;
}

}  // namespace lockstep
