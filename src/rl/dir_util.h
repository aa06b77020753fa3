// Folder-level atomic writes for run folders and caches: a temporary folder beside the target,
// its files and the folder fsynced, then renamed (or atomically exchanged) into place, so readers
// see the old folder or the whole new one; and the advisory lock of a folder one process writes.
#pragma once

#include <filesystem>
#include <string>

namespace lockstep::rl::detail {

// A new empty folder `parent/.NAME.tmp.XXXXXX` (mkdtemp). Throws std::runtime_error naming it.
std::filesystem::path make_temp_dir(const std::filesystem::path& parent, const std::string& name);

// fsync one file (its data reaches the disk before what the caller writes next).
void fsync_file(const std::filesystem::path& file);

// fsync every regular file directly inside `dir`, then `dir` itself.
void fsync_dir_tree(const std::filesystem::path& dir);

// Puts the complete folder `tmp` at `target`: rename when `target` does not exist, else an atomic
// exchange (renameat2 RENAME_EXCHANGE) followed by removing the old folder; then fsyncs the parent.
// Throws std::runtime_error naming both paths.
void replace_dir(const std::filesystem::path& tmp, const std::filesystem::path& target);

// Removes leftover `.NAME.tmp.*` folders of killed writers inside `parent`.
void remove_temp_dirs(const std::filesystem::path& parent, const std::string& name);

// The lock file inside a locked folder.
inline constexpr const char* kLockFile = ".lock";

// An exclusive advisory lock (flock) on `dir/.lock`, held while the object lives. The kernel
// releases it when the process ends in any way, kill -9 included, so a stale lock never blocks a
// later process; a second FolderLock on the same folder conflicts even within one process.
class FolderLock {
 public:
  // Takes the lock, or throws std::invalid_argument naming the folder (and the holder's pid,
  // once the holder recorded it) when another holder has it; std::runtime_error when the lock
  // file cannot be created.
  explicit FolderLock(const std::filesystem::path& dir);
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();
  // Writes this process's pid into the lock file for the message others get. Called once the
  // holder starts changing the folder, so that a refused command leaves every byte as it was.
  void record_holder();

 private:
  int fd_ = -1;
};

}  // namespace lockstep::rl::detail
