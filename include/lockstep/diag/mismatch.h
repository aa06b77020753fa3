// Learner-sampler mismatch statistics of one batch (docs/rl.md, "Mismatch diagnostics"): from the
// per-token gap delta = learner log-prob - sampler log-prob, the masks and the per-response
// advantages, the numbers a run logs every step to see drift before it shows in the reward.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "lockstep/recipe/json.h"

namespace lockstep::diag {

constexpr int kMismatchSegment = 64;  // segment length for the segment counts (TRIAGE's gate)

// The per-token delta histogram: fixed bins, symmetric in |delta| with the edges below (TRIAGE's
// -0.5, -1.5 and -6 among them), so histograms of different steps and runs add. Bin i:
//   i = 0 .. 9:   delta < 0 with |delta| in (edge[9 - i], edge[10 - i]] (edge[10] = +inf; bin 0
//                 is delta < -6, bin 9 is -1e-6 <= delta < 0; a bin's closed end is its
//                 larger |delta|: delta = -6 is in bin 1)
//   i = 10:       delta == 0 exactly
//   i = 11 .. 20: delta > 0, mirrored (bin 11 is 0 < delta <= 1e-6, bin 20 is delta > 6)
constexpr double kGapHistEdges[] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.5, 6.0};
constexpr int kGapHistBins = 21;
// The bin of one finite delta.
int gap_hist_bin(double delta);
// "(-inf, -6)", "[-6, -1.5)", ..., "0", ..., "(6, inf)": the bin's range for labels.
std::string gap_hist_label(int bin);

struct MismatchStats {
  int64_t tokens = 0;  // valid tokens (mask = 1)
  double mean_delta = std::numeric_limits<double>::quiet_NaN();
  double mean_abs_delta = std::numeric_limits<double>::quiet_NaN();
  double max_abs_delta = std::numeric_limits<double>::quiet_NaN();
  double q05_delta = std::numeric_limits<double>::quiet_NaN();  // lower nearest-rank 5th pct
  // 64-token segments by position within each response (every response, whatever its
  // advantage); means over the segment's valid tokens; segments without one are not counted.
  int64_t segments = 0;
  int64_t segments_below_0_5 = 0;  // mean delta < -0.5
  int64_t segments_below_1_5 = 0;  // mean delta < -1.5 (a subset of the above)
  int64_t tokens_below_6 = 0;      // valid tokens with delta < -6
  // Directional shares: sum of |A_i| over the valid tokens in a sign region divided by the sum of
  // |A_i| over all valid tokens. Tokens with delta == 0 or A == 0 fall in no region, so the four
  // shares sum to 1 minus the share of exactly matching tokens (0 in a bit-identical run); all
  // four are 0 when every |A| is 0.
  double share_pos_adv_neg_delta =
      0;  // A > 0, delta < 0: rewarded tokens the learner under-weights
  double share_pos_adv_pos_delta = 0;  // A > 0, delta > 0
  double share_neg_adv_neg_delta = 0;  // A < 0, delta < 0: what TRIAGE's gate targets
  double share_neg_adv_pos_delta = 0;  // A < 0, delta > 0
  std::vector<int64_t> histogram = std::vector<int64_t>(kGapHistBins, 0);  // valid tokens per bin
};

// offsets: [R + 1] (response i owns tokens [offsets[i], offsets[i + 1])); delta, mask: [T];
// advantages: [R]. Sums in double in ascending token order. Throws std::invalid_argument naming
// the field when sizes disagree, offsets are malformed, a mask value is not 0/1 or a valid
// token's delta is not finite.
MismatchStats mismatch_stats(std::span<const int64_t> offsets, std::span<const float> delta,
                             std::span<const uint8_t> mask, std::span<const float> advantages);

// The lower nearest-rank quantile: sort ascending, take the element of rank ceil(p * n) (1-based,
// at least 1). Always one of the values; NaN for an empty input. p in [0, 1].
double quantile_lower_nearest_rank(std::vector<double> values, double p);

// Adds the stats to a metrics row under the keys docs/rl.md lists (gap_tokens, mean_gap,
// mean_abs_gap, max_abs_gap, q05_gap, gap_segments, gap_segments_below_0_5,
// gap_segments_below_1_5, gap_tokens_below_6, gap_share_pos_adv_neg, gap_share_pos_adv_pos,
// gap_share_neg_adv_neg, gap_share_neg_adv_pos, and gap_hist: the histogram's counts as an array).
void add_mismatch_metrics(const MismatchStats& stats, Json& row);

}  // namespace lockstep::diag
