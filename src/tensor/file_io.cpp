// File input (regular files only, never blocking on open) and atomic file output: target checks,
// the temporary-file writer, and the process-wide registry of live temporaries that an
// async-signal-safe handler removes on SIGINT / SIGTERM / SIGHUP.
#include "lockstep/tensor/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

namespace lockstep {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

// ---- registry of live temporary files ----------------------------------------------------------
// Fixed storage, so the signal handler touches nothing but these slots, unlink(2), sigaction(2)
// and raise(3), all async-signal-safe. A slot is kFree, kClaimed (its path being copied in,
// invisible to the handler) or kLive (the handler removes its path).
constexpr int kSlots = 64;
constexpr size_t kSlotPathBytes = 4096;
enum SlotState : int { kFree = 0, kClaimed = 1, kLive = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  char path[kSlotPathBytes] = {};
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");
Slot g_slots[kSlots];

constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

void remove_temp_files_and_reraise(int sig) {
  const int saved_errno = errno;
  for (Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kLive) ::unlink(s.path);
  // Die of the same signal, as without the handler: the exit status still says which one.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);  // pending until this handler returns (the signal is blocked while it runs)
  errno = saved_errno;
}

extern "C" void ignore_file_size_signal(int) {}

void install_signal_cleanup() {
  install_file_size_limit_handler();
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kCleanupSignals) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      // Only replace the default action: an ignored signal cannot end the process, and a handler
      // the program installed itself is its own business.
      if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
      struct sigaction sa {};
      sa.sa_handler = remove_temp_files_and_reraise;
      sigfillset(&sa.sa_mask);  // one cleanup at a time
      ::sigaction(sig, &sa, nullptr);
    }
  });
}

// Returns the slot now holding `path`, or -1 when every slot is taken or the path is too long
// (the temporary is then still removed on errors, just not on signals).
int register_temp(const std::string& path) {
  if (path.size() >= kSlotPathBytes) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel))
      continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(kLive, std::memory_order_release);
    return i;
  }
  return -1;
}

void unregister_temp(int slot) {
  if (slot >= 0) g_slots[slot].state.store(kFree, std::memory_order_release);
}

// Six random characters for a temporary name (uniqueness comes from O_EXCL, not from these).
std::string random_suffix() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng(
      std::random_device{}() ^
      uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (uint64_t(::getpid()) << 32));
  std::string s(6, 'x');
  for (char& c : s) c = kChars[rng() % (sizeof(kChars) - 1)];
  return s;
}

std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void bad_path(const std::string& path, const std::string& why) {
  throw OutputPathError(fmt::format("output '{}': {}", path, why));
}

}  // namespace

void install_file_size_limit_handler() {
  // Checked on every call (a query is cheap), so a program that put the default action back is
  // covered too; two threads installing at once install the same handler.
  struct sigaction old {};
  if (::sigaction(SIGXFSZ, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;
  // A handler rather than SIG_IGN: a program this one executes gets the default action back.
  struct sigaction sa {};
  sa.sa_handler = ignore_file_size_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGXFSZ, &sa, nullptr);
}

int open_input_file(const std::string& path) {
  if (path.empty()) throw InputPathError("input path is empty");
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    throw InputPathError(fmt::format("{}: cannot open: {}", path, errno_text(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputPathError(fmt::format("{}: cannot stat: {}", path, errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputPathError(fmt::format(
        "{}: is {}; lockstep reads regular files only (a FIFO or device can block or never end)",
        path, kind_of(st.st_mode)));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_input_file(const std::string& path) {
  const int fd = open_input_file(path);
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      throw InputPathError(fmt::format("{}: read failed: {}", path, errno_text(err)));
    }
    if (got == 0) break;
    out.append(buf, size_t(got));
  }
  ::close(fd);
  return out;
}

std::string resolve_output_path(const std::string& path) {
  if (path.empty()) throw OutputPathError("output path is empty");
  std::string target = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path resolved = fs::canonical(path, ec);
      if (ec)
        bad_path(path,
                 fmt::format("is a symbolic link that does not lead to a file ({})", ec.message()));
      target = resolved.string();
      if (::stat(target.c_str(), &st) != 0) {
        const int err = errno;
        bad_path(path, fmt::format("cannot stat '{}': {}", target, errno_text(err)));
      }
    }
    if (!S_ISREG(st.st_mode))
      bad_path(path, fmt::format("is {}; lockstep writes regular files only and never replaces a "
                                 "directory, device, FIFO or socket",
                                 kind_of(st.st_mode)));
  } else if (errno != ENOENT) {
    bad_path(path, errno_text(errno));
  }
  const fs::path t(target);
  if (!t.has_filename()) bad_path(path, "names a folder, not a file");
  const fs::path dir = t.parent_path().empty() ? fs::path(".") : t.parent_path();
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0) {
    const int err = errno;
    bad_path(path, fmt::format("folder '{}': {}", dir.string(), errno_text(err)));
  }
  if (!S_ISDIR(ds.st_mode)) bad_path(path, fmt::format("'{}' is not a folder", dir.string()));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    bad_path(path,
             fmt::format("cannot create files in folder '{}': {}", dir.string(), errno_text(err)));
  }
  return target;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), target_(resolve_output_path(path)) {
  install_signal_cleanup();
  const fs::path t(target_);
  const fs::path dir = t.parent_path().empty() ? fs::path(".") : t.parent_path();
  // ".NAME.tmp.XXXXXX", NAME cut so the whole stays within the 255-byte file name limit.
  const std::string base = t.filename().string().substr(0, 200);
  for (int attempt = 0; attempt < 64 && fd_ < 0; ++attempt) {
    const std::string name = (dir / ("." + base + ".tmp." + random_suffix())).string();
    // Registered before it exists, so a cleanup signal that any thread receives while the file
    // is being created still removes it (unlinking a name not yet created is harmless).
    const int slot = register_temp(name);
    fd_ = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    const int open_errno = errno;
    if (fd_ >= 0) {
      temp_ = name;
      slot_ = slot;
    } else {
      unregister_temp(slot);
    }
    if (fd_ < 0 && open_errno != EEXIST)
      throw FileWriteError(fmt::format("{}: cannot create a temporary file in '{}': {}", path_,
                                       dir.string(), errno_text(open_errno)));
  }
  if (fd_ < 0)
    throw FileWriteError(
        fmt::format("{}: no free temporary file name in '{}'", path_, dir.string()));
  // The target's permission bits if it exists, else rw-r--r-- (mkstemp-style 0600 otherwise).
  struct stat st {};
  const mode_t mode = ::stat(target_.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
  if (::fchmod(fd_, mode) != 0) fail(fmt::format("cannot set the mode: {}", errno_text(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
  unregister_temp(slot_);
}

void AtomicFile::fail(const std::string& what) {
  const std::string temp = temp_;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  unregister_temp(slot_);
  slot_ = -1;
  throw FileWriteError(fmt::format("{}: {} (temporary file {} removed)", path_, what, temp));
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) throw std::logic_error(fmt::format("{}: write after commit or failure", path_));
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t put = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) fail(fmt::format("write failed: {}", errno_text(errno)));
    p += put;
    n -= size_t(put);
    written_ += uint64_t(put);
  }
#if defined(__linux__)
  // Only a hint: a file system without sync_file_range still gets everything by commit()'s fsync.
  if (written_ - writeback_from_ >= kWritebackBytes) {
    ::sync_file_range(fd_, off_t(writeback_from_), off_t(written_ - writeback_from_),
                      SYNC_FILE_RANGE_WRITE);
    writeback_from_ = written_;
  }
#endif
}

void AtomicFile::write(std::string_view text) {
  write(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

void AtomicFile::commit() {
  if (fd_ < 0) throw std::logic_error(fmt::format("{}: commit after commit or failure", path_));
  if (::fsync(fd_) != 0) fail(fmt::format("fsync failed: {}", errno_text(errno)));
  const int rc = ::close(fd_);  // a deferred write error (NFS, quota) can surface here
  fd_ = -1;
  if (rc != 0) fail(fmt::format("close failed: {}", errno_text(errno)));
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    fail(fmt::format("cannot rename the temporary file into place: {}", errno_text(errno)));
  committed_ = true;
  unregister_temp(slot_);
  slot_ = -1;
  // Make the rename itself durable; a failure here leaves a complete file, so it is not an error.
  const fs::path t(target_);
  const fs::path dir = t.parent_path().empty() ? fs::path(".") : t.parent_path();
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomic(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace lockstep
