// The end-to-end CPU benchmark of `lockstep quantize` (src/cli/bench_quantize_file.cpp): the
// whole command on a generated bf16 file, against memcpy bandwidth measured in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::cli {

constexpr double kFileBenchTarget = 0.5;     // input GB/s over memcpy GB/s
constexpr double kFileBenchRssTarget = 2.0;  // peak RSS over input bytes

struct FileBenchOptions {
  uint64_t bytes = 256ull << 20;  // input size (rounded down to whole 16 x 4096 bf16 slabs)
  int threads = 1;                // OMP_NUM_THREADS of the command, and memcpy's threads
  int runs = 3;                   // timed runs after one warm-up; the median is reported
  std::string dir;                // where the files go (default: the system temporary folder)
  std::string filter;             // run only the ops whose name contains this text
};

struct FileBenchRow {
  std::string name;
  double seconds = 0;       // median wall time of the command, process start to exit
  double input_bytes = 0;   // size of the input file
  double output_bytes = 0;  // size of the output file
  double gbps = 0;          // input bytes per second, 1e9
  double memcpy_gbps = 0;   // bytes copied per second by memcpy on the same threads, 1e9
  double ratio = 0;         // gbps / memcpy_gbps
  double peak_rss = 0;      // largest peak resident set of the timed runs, bytes
  double rss_ratio = 0;     // peak_rss / input_bytes
};

std::vector<FileBenchRow> bench_quantize_file(const FileBenchOptions& o);
std::string format_file_bench(const std::vector<FileBenchRow>& rows);

}  // namespace lockstep::cli
