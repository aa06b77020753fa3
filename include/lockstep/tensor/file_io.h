// Atomic file output shared by every writer (safetensors files, run_meta.json): the target is
// checked before any work, bytes go to a temporary file beside it that is flushed and renamed over
// it, and temporaries are removed on error and when SIGINT, SIGTERM or SIGHUP ends the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lockstep {

// An output path that cannot be a target: empty, an existing directory, device node, FIFO or
// socket (lockstep never replaces those), a dangling symbolic link, or a folder that does not
// exist or is not writable. The message names the path and the rule; the CLI exits 2.
class OutputPathError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Writing failed after the target was accepted: disk full, quota, file size limit, I/O error.
// Not the caller's input; the CLI exits 1. The temporary file is already removed.
class FileWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The file an output to `path` lands in: `path` itself, or the regular file a symbolic link at
// `path` points to (followed, so the link stays a link). Throws OutputPathError as above.
std::string resolve_output_path(const std::string& path);

// A file written atomically: the constructor checks the target (resolve_output_path) and creates
// `.NAME.tmp.XXXXXX` in the target's folder; write() appends; commit() flushes it to disk and
// renames it over the target. Readers see the old file or the whole new one, never part of one.
// Until commit() the temporary is removed by the destructor and by SIGINT / SIGTERM / SIGHUP
// (a handler is installed for each of these signals whose disposition is the default one, on
// first use; a handler the program installed itself is left alone).
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends bytes. Every kWritebackBytes written, writeback of the new range to disk starts in
  // the background (Linux sync_file_range), so that commit()'s fsync waits for little more than
  // the last range while the caller was producing the rest.
  void write(std::span<const std::byte> bytes);
  void write(std::string_view text);
  static constexpr uint64_t kWritebackBytes = 16ull << 20;
  // fsync, close, rename over the target (which keeps its permission bits; new files get
  // rw-r--r--), then fsync the folder. FileWriteError on failure, the temporary removed.
  void commit();

  const std::string& path() const { return path_; }       // as given, for messages
  const std::string& temp_path() const { return temp_; }  // the temporary file

 private:
  void fail(const std::string& what);  // removes the temporary, throws FileWriteError

  std::string path_;    // as given
  std::string target_;  // resolved (symbolic links followed)
  std::string temp_;
  int fd_ = -1;
  int slot_ = -1;  // signal-cleanup registry slot, -1 when none was free
  uint64_t written_ = 0;         // bytes written so far
  uint64_t writeback_from_ = 0;  // start of the range whose writeback has not been started
  bool committed_ = false;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view text);

}  // namespace lockstep
