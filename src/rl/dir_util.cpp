// Folder-level atomic writes (dir_util.h).
#include "dir_util.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
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

}  // namespace lockstep::rl::detail
