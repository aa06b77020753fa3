// RUN_DIR/metrics.jsonl: one JSON object per training step (snake_case keys, "step" first), the
// file reports and resume read. The writer flushes every line (optionally fsyncs); the reader
// tolerates and reports a truncated last line (a killed run); resume cuts the file back to a step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/recipe/json.h"

namespace lockstep::diag {

using MetricsRow = Json;

// The file name inside a run folder.
inline constexpr std::string_view kMetricsFileName = "metrics.jsonl";

// Whether a key is snake_case: [a-z][a-z0-9_]*.
bool is_snake_case(std::string_view key);

struct MetricsWriterOptions {
  bool fsync = false;  // fsync after every line (slower; survives a machine crash, not just a kill)
  bool truncate = false;  // start a new file instead of appending to an existing one
};

// Appends rows to a metrics.jsonl file. Each row is one write() of the JSON text plus '\n', so a
// killed process leaves at most one partial last line. Non-finite numbers are written as null
// (JSON has no NaN); readers treat null as "no value".
class MetricsWriter {
 public:
  // path: the metrics.jsonl file (its folder must exist). Throws std::runtime_error naming it.
  explicit MetricsWriter(const std::filesystem::path& path, MetricsWriterOptions options = {});
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;

  // row must be an object with an integer "step" >= 0 and snake_case keys (std::invalid_argument
  // naming the key otherwise). Throws std::runtime_error naming the file when the write fails.
  void append(const MetricsRow& row);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  MetricsWriterOptions options_;
  int fd_ = -1;
};

struct MetricsFile {
  std::vector<MetricsRow> rows;      // every complete line, in file order
  bool truncated_last_line = false;  // the file ended with a partial line, which was ignored
  std::string truncated_text;        // that partial line (for the message)
  uint64_t complete_bytes = 0;       // length of the prefix made of complete lines
};

// Reads a metrics.jsonl file. A last line without its terminating '\n' is the partial write of a
// killed run: it is not parsed, and reported through truncated_last_line. Blank lines are skipped.
// Any complete line that is not a JSON object throws std::runtime_error naming file and line. The
// literals NaN, Infinity and -Infinity (written by Python's json module) are read as null.
MetricsFile read_metrics(const std::filesystem::path& path);

// Resume: cuts the file back to its longest prefix of complete lines whose "step" is <= max_step
// (it stops at the first line with a larger step, and drops a partial last line). Returns the
// number of rows kept. Throws std::runtime_error naming file and line for a row without an
// integer "step".
int64_t truncate_metrics(const std::filesystem::path& path, int64_t max_step);

}  // namespace lockstep::diag
