// Checks of command-line values shared by the commands: output paths validated before any work
// (and never one of the inputs), outputs committed only once all of them are written, and the one
// strict parser of integer and real flags.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "commands.h"
#include "lockstep/tensor/file_io.h"

namespace lockstep::cli {

void check_output_paths(std::initializer_list<std::pair<std::string_view, std::string>> outputs) {
  std::vector<std::pair<std::string_view, std::filesystem::path>> seen;
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    std::string target;
    try {
      target = resolve_output_path(path);
    } catch (const OutputPathError& e) {
      throw UsageError(fmt::format("{}: {}", flag, e.what()));
    }
    std::error_code ec;  // a path that cannot be made canonical is compared as resolved
    std::filesystem::path canon = std::filesystem::weakly_canonical(target, ec);
    if (ec) canon = target;
    for (const auto& [other_flag, other] : seen)
      if (other == canon)
        throw UsageError(
            fmt::format("{} and {} name the same file '{}'; give each output its own path",
                        other_flag, flag, path));
    seen.emplace_back(flag, canon);
  }
}

void commit_outputs(AtomicFile& out, const std::string& run_meta_path, const Json& run_meta) {
  // Both temporaries are complete before either is renamed into place, so a failure while
  // writing (disk full) leaves neither output; a failure between the two renames is a rename
  // failure in an already validated folder.
  std::optional<AtomicFile> meta;
  if (!run_meta_path.empty()) {
    meta.emplace(run_meta_path);
    meta->write(run_meta.dump(2) + "\n");
  }
  out.commit();
  if (meta) meta->commit();
}

void write_outputs(const std::string& output, const SafetensorsFile& file,
                   const std::string& run_meta_path, const Json& run_meta) {
  AtomicFile out(output);
  write_safetensors(out, file);
  commit_outputs(out, run_meta_path, run_meta);
}

namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

}  // namespace

uint64_t parse_unsigned(const std::string& text, std::string_view flag, uint64_t max,
                        uint64_t min) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (!all_digits(text) || ec != std::errc() || ptr != end || v < min || v > max)
    throw UsageError(fmt::format("{} '{}': expected an integer from {} to {} (decimal digits only)",
                                 flag, text, min, max));
  return v;
}

int64_t parse_integer(const std::string& text, std::string_view flag, int64_t min, int64_t max) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const std::string_view digits =
      text.starts_with('-') && min < 0 ? std::string_view(text).substr(1) : std::string_view(text);
  if (!all_digits(digits) || ec != std::errc() || ptr != end || v < min || v > max)
    throw UsageError(fmt::format("{} '{}': expected an integer from {} to {} (decimal digits only)",
                                 flag, text, min, max));
  return v;
}

CLI::Option* add_unsigned_option(CLI::App& app, const std::string& name, uint64_t& target,
                                 uint64_t max, const std::string& description) {
  return add_integer_option<uint64_t>(app, name, target, 0, max, description);
}

double parse_real(const std::string& text, std::string_view flag, double lo, double hi,
                  bool lo_open) {
  double v = 0;
  const char* end = text.data() + text.size();
  // Decimal notation only (digits, '.', 'e', sign): from_chars would also read "inf" and "nan".
  const bool chars_ok =
      !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string::npos;
  const auto [ptr, ec] = std::from_chars(text.data(), end, v, std::chars_format::general);
  const bool in_range = std::isfinite(v) && v <= hi && (lo_open ? v > lo : v >= lo);
  if (!chars_ok || ec != std::errc() || ptr != end || !in_range)
    throw UsageError(fmt::format("{} '{}': expected a finite number in {}{}, {}]", flag, text,
                                 lo_open ? "(" : "[", lo, hi));
  return v;
}

// ---- outputs against inputs
// ----------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId&) const = default;
};

std::optional<FileId> file_id(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// The folders that hold `p` once symbolic links are resolved, innermost first, up to the root
// (the nearest existing folder and every folder above it).
std::vector<std::pair<FileId, fs::path>> enclosing_folders(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) return {};
  // weakly_canonical resolves the existing part (symbolic links, "..") and keeps the rest.
  fs::path canon = fs::weakly_canonical(abs, ec);
  if (ec) canon = abs.lexically_normal();
  std::vector<std::pair<FileId, fs::path>> out;
  for (fs::path d = canon.parent_path();; d = d.parent_path()) {
    if (const auto id = file_id(d)) out.emplace_back(*id, d);
    if (d == d.root_path() || d.empty()) break;
  }
  return out;
}

struct InputId {
  const PathArg* arg;
  FileId id;
  bool folder;
};

}  // namespace

void check_outputs_not_inputs(const std::vector<PathArg>& outputs,
                              const std::vector<PathArg>& inputs) {
  std::vector<InputId> ins;
  for (const PathArg& in : inputs) {
    if (in.path.empty()) continue;
    struct stat st {};
    if (::stat(in.path.c_str(), &st) != 0) continue;  // a missing input is the command's to report
    ins.push_back({&in, FileId{st.st_dev, st.st_ino}, S_ISDIR(st.st_mode)});
  }
  for (const PathArg& out : outputs) {
    if (out.path.empty()) continue;
    const std::optional<FileId> self = file_id(out.path);  // symbolic links followed
    const auto folders = enclosing_folders(out.path);
    for (const InputId& in : ins) {
      const std::string what = in.folder ? "folder" : "file";
      if (self && *self == in.id)
        throw UsageError(fmt::format(
            "{} {}: is the input {} {} ({}); writing it would destroy the input: give the output "
            "another path",
            out.flag, out.path, what, in.arg->path, in.arg->flag));
      if (in.folder)
        for (const auto& [id, dir] : folders)
          if (id == in.id)
            throw UsageError(fmt::format(
                "{} {}: lies inside the input folder {} ({}); lockstep never writes into a folder "
                "it reads: give the output a path outside it",
                out.flag, out.path, in.arg->path, in.arg->flag));
      // An output folder (created or written into) must not hold an input.
      if (out.folder && self)
        for (const auto& [id, dir] : enclosing_folders(in.arg->path))
          if (id == *self)
            throw UsageError(fmt::format(
                "{} {}: holds the input {} ({}); writing into it could replace the input: give "
                "the output another folder",
                out.flag, out.path, in.arg->path, in.arg->flag));
    }
  }
}

void check_output_folder(std::string_view flag, const std::string& path) {
  if (path.empty()) throw UsageError(fmt::format("{}: the folder path is empty", flag));
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) throw UsageError(fmt::format("{} {}: {}", flag, path, ec.message()));
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      throw UsageError(fmt::format("{} {}: exists and is not a directory", flag, path));
    if (::access(p.c_str(), W_OK | X_OK) != 0)
      throw UsageError(
          fmt::format("{} {}: cannot write into the folder: {}", flag, path, std::strerror(errno)));
    return;
  }
  if (errno != ENOENT) throw UsageError(fmt::format("{} {}: {}", flag, path, std::strerror(errno)));
  // The nearest existing parent must be a folder lockstep can create the rest in.
  for (fs::path d = p.lexically_normal().parent_path();; d = d.parent_path()) {
    if (::stat(d.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        throw UsageError(fmt::format("{} {}: '{}' is not a folder", flag, path, d.string()));
      if (::access(d.c_str(), W_OK | X_OK) != 0)
        throw UsageError(fmt::format("{} {}: cannot create folders in '{}': {}", flag, path,
                                     d.string(), std::strerror(errno)));
      return;
    }
    if (errno != ENOENT)
      throw UsageError(
          fmt::format("{} {}: '{}': {}", flag, path, d.string(), std::strerror(errno)));
    if (d == d.root_path() || d.empty()) break;
  }
  throw UsageError(fmt::format("{} {}: no existing parent folder", flag, path));
}

Device device_flag(const std::string& choice) {
  try {
    return select_device(choice);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("--device {}: {}", choice, e.what()));
  }
}

void add_device_option(CLI::App& app, std::string& target) {
  app.add_option("--device", target,
                 "cpu, cuda, cuda:N or auto (a GPU when this build has CUDA and one is visible)")
      ->capture_default_str();
}

}  // namespace lockstep::cli
