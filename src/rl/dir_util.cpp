// Folder-level atomic writes (dir_util.h).
#include "dir_util.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace lockstep::rl::detail {
namespace fs = std::filesystem;

namespace {
void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot open {}: {}", p.string(), std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0)
    throw std::runtime_error(fmt::format("fsync {}: {}", p.string(), std::strerror(err)));
}
}  // namespace

fs::path make_temp_dir(const fs::path& parent, const std::string& name) {
  std::string templ = (parent / ("." + name + ".tmp.XXXXXX")).string();
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    throw std::runtime_error(fmt::format("cannot create a temporary folder in {}: {}",
                                         parent.string(), std::strerror(errno)));
  return fs::path(buf.data());
}

void fsync_file(const fs::path& file) { fsync_path(file, false); }

void fsync_dir_tree(const fs::path& dir) {
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) fsync_path(e.path(), false);
  fsync_path(dir, true);
}

void replace_dir(const fs::path& tmp, const fs::path& target) {
  std::error_code ec;
  const bool exists = fs::exists(target, ec);
  if (!exists) {
    if (::rename(tmp.c_str(), target.c_str()) != 0)
      throw std::runtime_error(fmt::format("cannot rename {} to {}: {}", tmp.string(),
                                           target.string(), std::strerror(errno)));
  } else {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0)
      throw std::runtime_error(fmt::format("cannot exchange {} with {}: {}", tmp.string(),
                                           target.string(), std::strerror(errno)));
    fs::remove_all(tmp);  // now the old folder
  }
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fsync_path(parent, true);
}

void remove_temp_dirs(const fs::path& parent, const std::string& name) {
  std::error_code ec;
  const std::string prefix = "." + name + ".tmp.";
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with(prefix) && e.is_directory()) fs::remove_all(e.path(), ec);
  }
}

FolderLock::FolderLock(const fs::path& dir) {
  const fs::path p = dir / kLockFile;
  fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0)
    throw std::runtime_error(
        fmt::format("cannot create the lock file {}: {}", p.string(), std::strerror(errno)));
  int rc = 0;
  do {
    rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return;
  const int err = errno;
  char pid[32] = {};
  const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
  ::close(fd_);
  fd_ = -1;
  if (err != EWOULDBLOCK)
    throw std::runtime_error(fmt::format("cannot lock {}: {}", p.string(), std::strerror(err)));
  std::string holder = n > 0 ? std::string(pid, size_t(n)) : std::string();
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  throw std::invalid_argument(fmt::format(
      "run folder '{}' is in use by another lockstep process{}; two processes writing one run "
      "would interleave its files: wait for it to end, or choose another folder",
      dir.string(), holder.empty() ? "" : " (pid " + holder + ")"));
}

void FolderLock::record_holder() {
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd_, me.data(), me.size(), 0);
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the only descriptor releases the lock
}

}  // namespace lockstep::rl::detail
