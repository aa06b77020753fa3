// Checks of command-line values shared by the commands: output paths validated before any work,
// outputs committed only once all of them are written, and strict unsigned integers for seeds.
#include <fmt/format.h>

#include <charconv>
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

uint64_t parse_unsigned(const std::string& text, std::string_view flag, uint64_t max) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const bool digits_only =
      !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits_only || ec != std::errc() || ptr != end || v > max)
    throw UsageError(fmt::format("{} '{}': expected an integer from 0 to {} (decimal digits only)",
                                 flag, text, max));
  return v;
}

CLI::Option* add_unsigned_option(CLI::App& app, const std::string& name, uint64_t& target,
                                 uint64_t max, const std::string& description) {
  const std::string flag = name.substr(0, name.find(','));
  return app
      .add_option_function<std::string>(
          name,
          [&target, flag, max](const std::string& s) { target = parse_unsigned(s, flag, max); },
          description)
      ->type_name("UINT")
      ->default_str(std::to_string(target));
}

}  // namespace lockstep::cli
