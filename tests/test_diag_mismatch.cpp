// Tests of the learner-sampler mismatch statistics: a hand-computed batch, the lower
// nearest-rank quantile, 64-token segment boundaries, masks, shares with exact matches, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lockstep/diag/mismatch.h"

using namespace lockstep::diag;

TEST(DiagMismatch, HandComputedBatch) {
  const std::vector<int64_t> off = {0, 4, 6};
  const std::vector<float> d = {-1.0f, 0.5f, -7.0f, 2.0f, -2.0f, -2.0f};
  const std::vector<uint8_t> m(6, 1);
  const std::vector<float> a = {1.0f, -0.5f};
  const MismatchStats s = mismatch_stats(off, d, m, a);
  EXPECT_EQ(s.tokens, 6);
  EXPECT_DOUBLE_EQ(s.mean_delta, -9.5 / 6);
  EXPECT_DOUBLE_EQ(s.mean_abs_delta, 14.5 / 6);
  EXPECT_EQ(s.max_abs_delta, 7.0);
  EXPECT_EQ(s.q05_delta, -7.0);  // rank ceil(0.05 * 6) = 1
  EXPECT_EQ(s.segments, 2);
  EXPECT_EQ(s.segments_below_0_5, 2);  // means -1.375 and -2
  EXPECT_EQ(s.segments_below_1_5, 1);
  EXPECT_EQ(s.tokens_below_6, 1);
  // |A| mass: 4 tokens x 1 + 2 tokens x 0.5 = 5.
  EXPECT_DOUBLE_EQ(s.share_pos_adv_neg_delta, 2.0 / 5);
  EXPECT_DOUBLE_EQ(s.share_pos_adv_pos_delta, 2.0 / 5);
  EXPECT_DOUBLE_EQ(s.share_neg_adv_neg_delta, 1.0 / 5);
  EXPECT_EQ(s.share_neg_adv_pos_delta, 0.0);
}

TEST(DiagMismatch, QuantileIsLowerNearestRank) {
  std::vector<double> v;
  for (int i = 20; i >= 1; --i) v.push_back(i);          // 20 .. 1, unsorted on purpose
  EXPECT_EQ(quantile_lower_nearest_rank(v, 0.05), 1.0);  // rank 1
  v.push_back(21);
  EXPECT_EQ(quantile_lower_nearest_rank(v, 0.05), 2.0);  // n = 21: rank ceil(1.05) = 2
  EXPECT_EQ(quantile_lower_nearest_rank(v, 0.0), 1.0);
  EXPECT_EQ(quantile_lower_nearest_rank(v, 1.0), 21.0);
  EXPECT_EQ(quantile_lower_nearest_rank(v, 0.5), 11.0);  // rank ceil(10.5) = 11
  EXPECT_TRUE(std::isnan(quantile_lower_nearest_rank({}, 0.05)));
  EXPECT_THROW(quantile_lower_nearest_rank(v, 1.5), std::invalid_argument);
}

TEST(DiagMismatch, SegmentsOf64TokensPerResponse) {
  // 65 tokens: 64 at 0 and one at -2 -> two segments, the second below -1.5.
  std::vector<float> d(65, 0.0f);
  d[64] = -2.0f;
  const std::vector<int64_t> off = {0, 65};
  const MismatchStats s =
      mismatch_stats(off, d, std::vector<uint8_t>(65, 1), std::vector<float>{1});
  EXPECT_EQ(s.segments, 2);
  EXPECT_EQ(s.segments_below_1_5, 1);
  // Exactly -0.5 and -1.5 are not below.
  const std::vector<float> half(64, -0.5f), one5(64, -1.5f);
  const std::vector<int64_t> o64 = {0, 64};
  const std::vector<uint8_t> m64(64, 1);
  EXPECT_EQ(mismatch_stats(o64, half, m64, std::vector<float>{1}).segments_below_0_5, 0);
  const MismatchStats t = mismatch_stats(o64, one5, m64, std::vector<float>{1});
  EXPECT_EQ(t.segments_below_0_5, 1);
  EXPECT_EQ(t.segments_below_1_5, 0);
  // -6 exactly is not below -6.
  const std::vector<float> six = {-6.0f, std::nextafter(-6.0f, -7.0f)};
  EXPECT_EQ(mismatch_stats(std::vector<int64_t>{0, 2}, six, std::vector<uint8_t>{1, 1},
                           std::vector<float>{1})
                .tokens_below_6,
            1);
}

TEST(DiagMismatch, MasksAndExactMatches) {
  // A masked token is invisible (even NaN); a delta of exactly 0 falls in no share.
  const std::vector<int64_t> off = {0, 3};
  const std::vector<float> d = {NAN, 0.0f, -1.0f};
  const std::vector<uint8_t> m = {0, 1, 1};
  const MismatchStats s = mismatch_stats(off, d, m, std::vector<float>{2.0f});
  EXPECT_EQ(s.tokens, 2);
  EXPECT_EQ(s.max_abs_delta, 1.0);
  EXPECT_DOUBLE_EQ(s.share_pos_adv_neg_delta, 0.5);
  EXPECT_EQ(s.share_pos_adv_pos_delta, 0.0);
  // A bit-identical batch: all shares 0, gaps 0.
  const MismatchStats z =
      mismatch_stats(off, std::vector<float>(3, 0.0f), m, std::vector<float>{2.0f});
  EXPECT_EQ(z.mean_abs_delta, 0.0);
  EXPECT_EQ(z.share_pos_adv_neg_delta + z.share_pos_adv_pos_delta + z.share_neg_adv_neg_delta +
                z.share_neg_adv_pos_delta,
            0.0);
  // No valid tokens: NaN statistics, written as null.
  const MismatchStats e = mismatch_stats(off, d, std::vector<uint8_t>(3, 0), std::vector<float>{1});
  EXPECT_TRUE(std::isnan(e.q05_delta));
  Json row;
  add_mismatch_metrics(e, row);
  EXPECT_TRUE(row["q05_gap"].is_null());
  EXPECT_EQ(row["gap_tokens"], 0);
}

TEST(DiagMismatch, ErrorsNameTheField) {
  const std::vector<int64_t> off = {0, 2};
  const std::vector<uint8_t> m = {1, 1};
  try {
    mismatch_stats(off, std::vector<float>{0.0f, INFINITY}, m, std::vector<float>{1});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("delta[1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mismatch_stats(off, std::vector<float>{0.0f}, m, std::vector<float>{1}),
               std::invalid_argument);
  EXPECT_THROW(mismatch_stats(std::vector<int64_t>{0, 3}, std::vector<float>(2, 0.f), m,
                              std::vector<float>{1}),
               std::invalid_argument);
  EXPECT_THROW(mismatch_stats(off, std::vector<float>(2, 0.f), std::vector<uint8_t>{1, 3},
                              std::vector<float>{1}),
               std::invalid_argument);
}

TEST(DiagMismatch, MetricsKeysAndRepeatability) {
  std::vector<float> d(300);
  std::vector<uint8_t> m(300);
  for (size_t i = 0; i < d.size(); ++i) {
    d[i] = std::sin(float(i)) * 3.0f - 0.5f;
    m[i] = i % 7 != 0;
  }
  const std::vector<int64_t> off = {0, 100, 130, 300};
  const std::vector<float> a = {0.5f, -1.0f, 0.0f};
  const MismatchStats s1 = mismatch_stats(off, d, m, a), s2 = mismatch_stats(off, d, m, a);
  Json row, row2;
  add_mismatch_metrics(s1, row);
  add_mismatch_metrics(s2, row2);
  EXPECT_EQ(row.dump(), row2.dump());  // doubles are written to round-trip exactly
  std::vector<std::string> keys;
  for (const auto& [k, v] : row.items()) keys.push_back(k);
  const std::vector<std::string> want = {"gap_tokens",
                                         "mean_gap",
                                         "mean_abs_gap",
                                         "max_abs_gap",
                                         "q05_gap",
                                         "gap_segments",
                                         "gap_segments_below_0_5",
                                         "gap_segments_below_1_5",
                                         "gap_tokens_below_6",
                                         "gap_share_pos_adv_neg",
                                         "gap_share_pos_adv_pos",
                                         "gap_share_neg_adv_neg",
                                         "gap_share_neg_adv_pos",
                                         "gap_hist"};
  EXPECT_EQ(keys, want);
  // The histogram holds every valid token once.
  int64_t total = 0;
  for (int64_t c : s1.histogram) total += c;
  EXPECT_EQ(total, s1.tokens);
  EXPECT_EQ(row["gap_hist"].size(), size_t(kGapHistBins));
  EXPECT_EQ(row["mean_abs_gap"].get<double>(), s1.mean_abs_delta);
}

TEST(DiagMismatch, HistogramBinsAtTheirEdges) {
  EXPECT_EQ(gap_hist_bin(0.0), 10);
  EXPECT_EQ(gap_hist_bin(-0.0), 10);
  EXPECT_EQ(gap_hist_bin(-1e-6), 9);  // |delta| in (0, 1e-6]
  EXPECT_EQ(gap_hist_bin(std::nextafter(-1e-6, -1.0)), 8);
  EXPECT_EQ(gap_hist_bin(1e-6), 11);
  EXPECT_EQ(gap_hist_bin(-6.0), 1);  // [-6, -1.5)
  EXPECT_EQ(gap_hist_bin(std::nextafter(-6.0, -10.0)), 0);
  EXPECT_EQ(gap_hist_bin(-1.5), 2);  // TRIAGE's thresholds are edges: -1.5 is not < -1.5
  EXPECT_EQ(gap_hist_bin(std::nextafter(-1.5, -10.0)), 1);
  EXPECT_EQ(gap_hist_bin(-0.5), 3);
  EXPECT_EQ(gap_hist_bin(6.0), 19);
  EXPECT_EQ(gap_hist_bin(1e30), 20);
  EXPECT_EQ(gap_hist_label(0), "(-inf, -6)");
  EXPECT_EQ(gap_hist_label(1), "[-6, -1.5)");
  EXPECT_EQ(gap_hist_label(9), "[-1e-06, 0)");
  EXPECT_EQ(gap_hist_label(10), "0");
  EXPECT_EQ(gap_hist_label(11), "(0, 1e-06]");
  EXPECT_EQ(gap_hist_label(19), "(1.5, 6]");
  EXPECT_EQ(gap_hist_label(20), "(6, inf)");
  EXPECT_THROW(gap_hist_label(21), std::out_of_range);
  // Masked tokens count nowhere.
  const std::vector<int64_t> off = {0, 4};
  const MismatchStats s =
      mismatch_stats(off, std::vector<float>{-7.0f, 0.0f, 0.25f, -100.0f},
                     std::vector<uint8_t>{1, 1, 1, 0}, std::vector<float>{1.0f});
  std::vector<int64_t> want(size_t(kGapHistBins), 0);
  want[0] = want[10] = want[17] = 1;  // 0.25 in (0.1, 0.5], bin 17
  EXPECT_EQ(s.histogram, want);
}
