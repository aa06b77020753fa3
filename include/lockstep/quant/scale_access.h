// Scale and outer-domain addressing shared by the CPU reference and the CUDA kernels (host and
// device): the swizzled 128x4 layout of CONTRACT.md section 7, a block-scale view that reads and
// writes either layout, and the outer domain of a row (per tensor, per row, per group).
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"
#include "lockstep/quant/format.h"

namespace lockstep {

// Byte offset of compact scale (r, c) in the swizzled 128x4-tile layout whose padded scale
// matrix has `padded_cols` = roundup(scale_cols, 4) columns.
LOCKSTEP_HD constexpr int64_t swizzled_offset(int64_t r, int64_t c, int64_t padded_cols) {
  return ((r / 128 * (padded_cols / 4) + c / 4) * 32 + r % 32) * 16 + (r % 128) / 32 * 4 + c % 4;
}
LOCKSTEP_HD constexpr int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The block scales of one copy: compact row-major [rows, cols] or swizzled (padded to
// roundup(rows, 128) x roundup(cols, 4)).
struct ScaleView {
  uint8_t* p = nullptr;
  int64_t cols = 0;         // scale columns of the logical (compact) grid
  int64_t padded_cols = 0;  // roundup(cols, 4)
  bool swizzled = false;
  LOCKSTEP_HD int64_t offset(int64_t r, int64_t c) const {
    return swizzled ? swizzled_offset(r, c, padded_cols) : r * cols + c;
  }
  LOCKSTEP_HD uint8_t load(int64_t r, int64_t c) const { return p[offset(r, c)]; }
  LOCKSTEP_HD void store(int64_t r, int64_t c, uint8_t code) const { p[offset(r, c)] = code; }
};
inline ScaleView scale_view(uint8_t* p, int64_t cols, bool swizzled) {
  return ScaleView{p, cols, round_up(cols, 4), swizzled};
}

// The group holding row r of a grouped buffer: the last g < groups with offsets[g] <= r (empty
// groups are skipped); 0 when there are no groups.
LOCKSTEP_HD inline int64_t group_of_row(const int64_t* offsets, int64_t groups, int64_t r) {
  int64_t lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The outer domain of row r of a rowwise copy: per row r, per group its group, otherwise 0.
LOCKSTEP_HD inline int64_t rowwise_domain(Scaling s, const int64_t* offsets, int64_t groups,
                                          int64_t r) {
  if (s == Scaling::kPerRow) return r;
  if (s == Scaling::kPerGroup) return group_of_row(offsets, groups, r);
  return 0;
}

}  // namespace lockstep
