// Folder-level atomic writes for run folders and caches: a temporary folder beside the target,
// its files and the folder fsynced, then renamed (or atomically exchanged) into place, so readers
// see the old folder or the whole new one.
#pragma once

#include <filesystem>
#include <string>

namespace lockstep::rl::detail {

// A new empty folder `parent/.NAME.tmp.XXXXXX` (mkdtemp). Throws std::runtime_error naming it.
std::filesystem::path make_temp_dir(const std::filesystem::path& parent, const std::string& name);

// fsync every regular file directly inside `dir`, then `dir` itself.
void fsync_dir_tree(const std::filesystem::path& dir);

// Puts the complete folder `tmp` at `target`: rename when `target` does not exist, else an atomic
// exchange (renameat2 RENAME_EXCHANGE) followed by removing the old folder; then fsyncs the parent.
// Throws std::runtime_error naming both paths.
void replace_dir(const std::filesystem::path& tmp, const std::filesystem::path& target);

// Removes leftover `.NAME.tmp.*` folders of killed writers inside `parent`.
void remove_temp_dirs(const std::filesystem::path& parent, const std::string& name);

}  // namespace lockstep::rl::detail
