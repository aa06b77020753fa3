// Tests of metrics.jsonl: writing (step first, snake_case keys, NaN as null, append vs truncate),
// reading with a truncated last line, malformed lines, and resume truncation to a step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "lockstep/diag/metrics.h"

using namespace lockstep::diag;
namespace fs = std::filesystem;

// Outside an anonymous namespace: the TEST_F classes derive from it and have external linkage.
class MetricsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lockstep_metrics_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = dir_ / "metrics.jsonl";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string text() const {
    std::ifstream f(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  void append_raw(const std::string& s) const {
    std::ofstream f(path_, std::ios::binary | std::ios::app);
    f << s;
  }
  void write_steps(int n) const {
    MetricsWriter w(path_);
    for (int s = 1; s <= n; ++s) w.append({{"step", s}, {"reward_mean", 0.5 * s}});
  }
  fs::path dir_, path_;
};

TEST_F(MetricsFileTest, WritesOneObjectPerLineStepFirst) {
  {
    MetricsWriter w(path_, {.fsync = true});
    w.append({{"reward_mean", 0.25}, {"step", 1}, {"entropy", NAN}});
    w.append({{"step", 2}, {"reward_mean", 0.5}, {"note", "a\nb"}});
  }
  EXPECT_EQ(text(),
            "{\"step\":1,\"reward_mean\":0.25,\"entropy\":null}\n"
            "{\"step\":2,\"reward_mean\":0.5,\"note\":\"a\\nb\"}\n");
  const MetricsFile f = read_metrics(path_);
  ASSERT_EQ(f.rows.size(), 2u);
  EXPECT_FALSE(f.truncated_last_line);
  EXPECT_EQ(f.rows[1]["note"], "a\nb");
  EXPECT_TRUE(f.rows[0]["entropy"].is_null());
}

TEST_F(MetricsFileTest, AppendsByDefaultTruncatesOnRequest) {
  write_steps(2);
  write_steps(1);
  EXPECT_EQ(read_metrics(path_).rows.size(), 3u);
  { MetricsWriter w(path_, {.truncate = true}); }
  EXPECT_EQ(text(), "");
}

TEST_F(MetricsFileTest, RejectsBadRows) {
  MetricsWriter w(path_);
  EXPECT_THROW(w.append({{"reward_mean", 1.0}}), std::invalid_argument);            // no step
  EXPECT_THROW(w.append({{"step", -1}}), std::invalid_argument);                    // negative
  EXPECT_THROW(w.append({{"step", 1.5}}), std::invalid_argument);                   // not integer
  EXPECT_THROW(w.append({{"step", 1}, {"rewardMean", 1}}), std::invalid_argument);  // camelCase
  EXPECT_THROW(w.append({{"step", 1}, {"2x", 1}}), std::invalid_argument);
  EXPECT_THROW(w.append(Json::array()), std::invalid_argument);
  EXPECT_EQ(text(), "");  // nothing half-written
  EXPECT_TRUE(is_snake_case("time_rollout_s"));
  EXPECT_FALSE(is_snake_case("Time"));
  EXPECT_FALSE(is_snake_case(""));
  EXPECT_THROW(MetricsWriter(dir_ / "missing" / "metrics.jsonl"), std::runtime_error);
}

TEST_F(MetricsFileTest, TruncatedLastLineIsReportedAndIgnored) {
  write_steps(3);
  append_raw("{\"step\":4,\"rew");
  const MetricsFile f = read_metrics(path_);
  EXPECT_EQ(f.rows.size(), 3u);
  EXPECT_TRUE(f.truncated_last_line);
  EXPECT_EQ(f.truncated_text, "{\"step\":4,\"rew");
  EXPECT_EQ(f.complete_bytes, text().size() - f.truncated_text.size());
  // A complete JSON text without its newline is still a partial write.
  fs::resize_file(path_, f.complete_bytes);
  append_raw("{\"step\":4}");
  EXPECT_TRUE(read_metrics(path_).truncated_last_line);
}

TEST_F(MetricsFileTest, NonFiniteLiteralsFromOtherWritersReadAsNull) {
  append_raw(
      "{\"step\": 1, \"a\": NaN, \"b\": -Infinity, \"c\": [Infinity], \"s\": \"NaN \\\" x\"}\n");
  const MetricsFile f = read_metrics(path_);
  ASSERT_EQ(f.rows.size(), 1u);
  EXPECT_TRUE(f.rows[0]["a"].is_null());
  EXPECT_TRUE(f.rows[0]["b"].is_null());
  EXPECT_TRUE(f.rows[0]["c"][0].is_null());
  EXPECT_EQ(f.rows[0]["s"], "NaN \" x");  // inside a string: untouched
}

TEST_F(MetricsFileTest, MalformedCompleteLineNamesFileAndLine) {
  write_steps(2);
  append_raw("not json\n");
  write_steps(1);
  try {
    read_metrics(path_);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:3: not a JSON object"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_metrics(dir_ / "nope.jsonl"), std::runtime_error);
}

TEST_F(MetricsFileTest, ResumeTruncatesToAStep) {
  write_steps(5);
  append_raw("{\"step\":6,");  // the killed run's partial line
  EXPECT_EQ(truncate_metrics(path_, 3), 3);
  const MetricsFile f = read_metrics(path_);
  ASSERT_EQ(f.rows.size(), 3u);
  EXPECT_EQ(f.rows.back()["step"], 3);
  EXPECT_FALSE(f.truncated_last_line);
  EXPECT_EQ(text().back(), '\n');
  // Resume appends after the kept prefix.
  MetricsWriter w(path_);
  w.append({{"step", 4}});
  EXPECT_EQ(read_metrics(path_).rows.size(), 4u);
  // A step beyond the end keeps everything but the partial line; 0 keeps nothing.
  append_raw("{\"st");
  EXPECT_EQ(truncate_metrics(path_, 100), 4);
  EXPECT_FALSE(read_metrics(path_).truncated_last_line);
  EXPECT_EQ(truncate_metrics(path_, 0), 0);
  EXPECT_EQ(text(), "");
}

TEST_F(MetricsFileTest, ResumeNeedsSteps) {
  append_raw("{\"reward_mean\":1}\n");
  try {
    truncate_metrics(path_, 3);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(":1: a metrics row needs an integer \"step\""),
              std::string::npos)
        << e.what();
  }
}
