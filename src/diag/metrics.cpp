// metrics.jsonl writer, tolerant reader and resume truncation (include/lockstep/diag/metrics.h).
#include "lockstep/diag/metrics.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "lockstep/tensor/file_io.h"

namespace lockstep::diag {

bool is_snake_case(std::string_view key) {
  if (key.empty() || key[0] < 'a' || key[0] > 'z') return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

MetricsWriter::MetricsWriter(const std::filesystem::path& path, MetricsWriterOptions options)
    : path_(path), options_(options) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.truncate ? O_TRUNC : O_APPEND);
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0)
    throw std::runtime_error(
        fmt::format("cannot open '{}' for appending: {}", path.string(), std::strerror(errno)));
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

MetricsWriter::MetricsWriter(MetricsWriter&& o) noexcept
    : path_(std::move(o.path_)), options_(o.options_), fd_(o.fd_) {
  o.fd_ = -1;
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    options_ = o.options_;
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void MetricsWriter::append(const MetricsRow& row) {
  if (!row.is_object())
    throw std::invalid_argument(
        fmt::format("metrics row for '{}' must be a JSON object", path_.string()));
  if (!row.contains("step") || !row["step"].is_number_integer() || row["step"].get<int64_t>() < 0)
    throw std::invalid_argument(fmt::format(
        "metrics row for '{}' needs an integer \"step\" >= 0: {}", path_.string(), row.dump()));
  MetricsRow ordered;
  ordered["step"] = row["step"];
  for (const auto& [k, v] : row.items()) {
    if (!is_snake_case(k))
      throw std::invalid_argument(fmt::format(
          "metrics key \"{}\" for '{}' is not snake_case ([a-z][a-z0-9_]*)", k, path_.string()));
    if (k != "step") ordered[k] = v;
  }
  // Invalid UTF-8 in strings is replaced rather than thrown on: a metrics line must not abort.
  const std::string line = ordered.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(
          fmt::format("cannot write to '{}': {}", path_.string(), std::strerror(errno)));
    }
    done += size_t(n);
  }
  if (options_.fsync && ::fsync(fd_) != 0)
    throw std::runtime_error(
        fmt::format("cannot fsync '{}': {}", path_.string(), std::strerror(errno)));
}

namespace {

std::string read_all(const std::filesystem::path& path) {
  try {
    return read_input_file(path.string());  // regular files only: a FIFO or device is refused
  } catch (const InputPathError& e) {
    throw std::runtime_error(e.what());
  }
}

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Parses one line. Writers other than MetricsWriter (Python's json module by default) emit the
// non-JSON literals NaN, Infinity and -Infinity; outside strings they are read as null, which is
// what MetricsWriter writes for them. Returns a discarded value for malformed text.
MetricsRow parse_line(std::string_view line) {
  std::string text;
  text.reserve(line.size());
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      text += c;
      if (c == '\\' && i + 1 < line.size())
        text += line[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (std::string_view lit : {"NaN", "Infinity", "-Infinity"})
      if (line.substr(i, lit.size()) == lit) {
        text += "null";
        i += lit.size() - 1;
        replaced = true;
        break;
      }
    if (!replaced) text += c;
  }
  return MetricsRow::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

MetricsFile read_metrics(const std::filesystem::path& path) {
  const std::string text = read_all(path);
  MetricsFile out;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    ++line_no;
    if (nl == std::string::npos) {
      const std::string_view rest = std::string_view(text).substr(pos);
      if (!blank(rest)) {
        out.truncated_last_line = true;
        out.truncated_text = std::string(rest);
      }
      break;
    }
    const std::string_view line = std::string_view(text).substr(pos, nl - pos);
    pos = nl + 1;
    out.complete_bytes = pos;
    if (blank(line)) continue;
    MetricsRow row = parse_line(line);
    if (!row.is_object())
      throw std::runtime_error(fmt::format("{}:{}: not a JSON object: {}", path.string(), line_no,
                                           std::string(line.substr(0, 200))));
    out.rows.push_back(std::move(row));
  }
  return out;
}

int64_t truncate_metrics(const std::filesystem::path& path, int64_t max_step) {
  const std::string text = read_all(path);
  size_t pos = 0, keep = 0;
  int64_t line_no = 0, kept = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // partial last line: dropped
    ++line_no;
    const std::string_view line = std::string_view(text).substr(pos, nl - pos);
    if (!blank(line)) {
      const MetricsRow row = parse_line(line);
      if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer())
        throw std::runtime_error(
            fmt::format("{}:{}: a metrics row needs an integer \"step\"", path.string(), line_no));
      if (row["step"].get<int64_t>() > max_step) break;
      ++kept;
    }
    pos = nl + 1;
    keep = pos;
  }
  if (keep != text.size()) std::filesystem::resize_file(path, keep);
  return kept;
}

}  // namespace lockstep::diag
