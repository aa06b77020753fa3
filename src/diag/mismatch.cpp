// Mismatch statistics (include/lockstep/diag/mismatch.h): one pass over the valid tokens in
// ascending order, a sort for the quantile; deterministic for a given input.
#include "lockstep/diag/mismatch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "lockstep/tensor/packed_offsets.h"

namespace lockstep::diag {

int gap_hist_bin(double d) {
  if (d == 0) return 10;
  const double a = std::fabs(d);
  int k = 0;  // edges below |d|: |d| in (edge[k - 1], edge[k]]
  while (k < 9 && a > kGapHistEdges[k]) ++k;
  return d < 0 ? 9 - k : 11 + k;
}

std::string gap_hist_label(int bin) {
  if (bin < 0 || bin >= kGapHistBins)
    throw std::out_of_range(
        fmt::format("gap histogram bin {} is outside [0, {})", bin, kGapHistBins));
  if (bin == 10) return "0";
  const int k = bin < 10 ? 9 - bin : bin - 11;  // |delta| in (edge[k - 1], edge[k]]
  const auto e = [](int i) { return fmt::format("{:g}", kGapHistEdges[i]); };
  if (bin < 10) {
    if (k == 9) return fmt::format("(-inf, -{})", e(8));
    return fmt::format("[-{}, {})", e(k), k == 0 ? "0" : "-" + e(k - 1));
  }
  if (k == 9) return fmt::format("({}, inf)", e(8));
  return fmt::format("({}, {}]", k == 0 ? "0" : e(k - 1), e(k));
}

double quantile_lower_nearest_rank(std::vector<double> values, double p) {
  if (!(p >= 0 && p <= 1))
    throw std::invalid_argument(fmt::format("quantile: p = {} must be in [0, 1]", p));
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double n = double(values.size());
  const size_t rank = std::max<size_t>(1, size_t(std::ceil(p * n)));
  return values[std::min(rank, values.size()) - 1];
}

MismatchStats mismatch_stats(std::span<const int64_t> offsets, std::span<const float> delta,
                             std::span<const uint8_t> mask, std::span<const float> advantages) {
  const size_t T = delta.size(), R = advantages.size();
  if (mask.size() != T)
    throw std::invalid_argument(
        fmt::format("mismatch_stats: delta has {} tokens but mask has {}", T, mask.size()));
  check_packed_offsets("mismatch_stats", offsets, T, R);
  MismatchStats s;
  std::vector<double> valid;
  double sum = 0, sum_abs = 0, max_abs = 0;
  double w_all = 0, w_pn = 0, w_pp = 0, w_nn = 0, w_np = 0;
  for (size_t i = 0; i < R; ++i) {
    const double a = advantages[i];
    if (!std::isfinite(a))
      throw std::invalid_argument(
          fmt::format("mismatch_stats: advantages[{}] = {} is not finite", i, a));
    for (int64_t seg = offsets[i]; seg < offsets[i + 1]; seg += kMismatchSegment) {
      const int64_t end = std::min<int64_t>(seg + kMismatchSegment, offsets[i + 1]);
      double seg_sum = 0;
      int64_t seg_n = 0;
      for (int64_t tt = seg; tt < end; ++tt) {
        const size_t t = size_t(tt);
        if (mask[t] > 1)
          throw std::invalid_argument(
              fmt::format("mismatch_stats: mask[{}] = {} must be 0 or 1", t, int(mask[t])));
        if (!mask[t]) continue;
        const double d = delta[t];
        if (!std::isfinite(d))
          throw std::invalid_argument(
              fmt::format("mismatch_stats: delta[{}] = {} is not finite on a valid token", t, d));
        valid.push_back(d);
        sum += d;
        sum_abs += std::fabs(d);
        max_abs = std::max(max_abs, std::fabs(d));
        s.tokens_below_6 += d < -6.0;
        ++s.histogram[size_t(gap_hist_bin(d))];
        seg_sum += d;
        ++seg_n;
        const double wa = std::fabs(a);
        w_all += wa;
        if (a > 0 && d < 0) w_pn += wa;
        if (a > 0 && d > 0) w_pp += wa;
        if (a < 0 && d < 0) w_nn += wa;
        if (a < 0 && d > 0) w_np += wa;
      }
      if (seg_n == 0) continue;
      const double mu = seg_sum / double(seg_n);
      ++s.segments;
      s.segments_below_0_5 += mu < -0.5;
      s.segments_below_1_5 += mu < -1.5;
    }
  }
  s.tokens = int64_t(valid.size());
  if (s.tokens > 0) {
    s.mean_delta = sum / double(s.tokens);
    s.mean_abs_delta = sum_abs / double(s.tokens);
    s.max_abs_delta = max_abs;
    s.q05_delta = quantile_lower_nearest_rank(std::move(valid), 0.05);
  }
  if (w_all > 0) {
    s.share_pos_adv_neg_delta = w_pn / w_all;
    s.share_pos_adv_pos_delta = w_pp / w_all;
    s.share_neg_adv_neg_delta = w_nn / w_all;
    s.share_neg_adv_pos_delta = w_np / w_all;
  }
  return s;
}

void add_mismatch_metrics(const MismatchStats& s, Json& row) {
  const auto num = [](double v) { return std::isfinite(v) ? Json(v) : nullptr; };
  row["gap_tokens"] = s.tokens;
  row["mean_gap"] = num(s.mean_delta);
  row["mean_abs_gap"] = num(s.mean_abs_delta);
  row["max_abs_gap"] = num(s.max_abs_delta);
  row["q05_gap"] = num(s.q05_delta);
  row["gap_segments"] = s.segments;
  row["gap_segments_below_0_5"] = s.segments_below_0_5;
  row["gap_segments_below_1_5"] = s.segments_below_1_5;
  row["gap_tokens_below_6"] = s.tokens_below_6;
  row["gap_share_pos_adv_neg"] = s.share_pos_adv_neg_delta;
  row["gap_share_pos_adv_pos"] = s.share_pos_adv_pos_delta;
  row["gap_share_neg_adv_neg"] = s.share_neg_adv_neg_delta;
  row["gap_share_neg_adv_pos"] = s.share_neg_adv_pos_delta;
  row["gap_hist"] = s.histogram;
}

}  // namespace lockstep::diag
