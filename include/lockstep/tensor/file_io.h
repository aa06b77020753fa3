// File input and output shared by every reader and writer. Inputs: regular files only, opened
// without blocking (a FIFO or device could block or never end). Outputs (safetensors files,
// run_meta.json): the target is checked before any work, bytes go to a temporary file beside it
// that is flushed and renamed over it, and temporaries are removed on error, when SIGINT, SIGTERM
// or SIGHUP ends the process, and when a write passes the file size limit (SIGXFSZ).
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

// An input path that cannot be read as a file: missing, unreadable, or not a regular file. The
// message starts with the path and names the rule; the CLI exits 2.
class InputPathError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Opens `path` for reading and returns the descriptor (close-on-exec, blocking; the caller closes
// it). The open itself never blocks (O_NONBLOCK until the type is known), and anything but a
// regular file, or a symbolic link to one, is refused: a FIFO blocks until a writer comes, and a
// device such as /dev/zero never ends. Throws InputPathError: "PATH: cannot open: REASON" or
// "PATH: is a FIFO; ...".
int open_input_file(const std::string& path);
// The whole content of a regular file (open_input_file), for text inputs (JSON, prompts).
std::string read_input_file(const std::string& path);

// Makes a write past the file size limit (RLIMIT_FSIZE) fail with EFBIG, reported as a
// FileWriteError, instead of killing the process with SIGXFSZ and leaving a temporary behind:
// installs a handler that does nothing when SIGXFSZ has its default action (checked on every
// call). Called by every AtomicFile; a program whose other writers should fail the same way calls
// it at start.
void install_file_size_limit_handler();

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
  int slot_ = -1;                // signal-cleanup registry slot, -1 when none was free
  uint64_t written_ = 0;         // bytes written so far
  uint64_t writeback_from_ = 0;  // start of the range whose writeback has not been started
  bool committed_ = false;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view text);

}  // namespace lockstep
