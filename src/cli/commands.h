// The `lockstep` subcommands. Each cmd_*.cpp file registers its subcommands on the root app;
// main.cpp maps exceptions to exit codes (kExitBadInput for anything the user can fix).
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/selection.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;   // internal or I/O failure
constexpr int kExitBadInput = 2;  // bad usage, bad file, data the contract refuses

// Thrown by commands for errors the user can fix; main prints "lockstep: error: <what>" and
// exits with kExitBadInput.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The process's full command line (argv[0] first), recorded by main() for --dry-run and
// run_meta.json provenance.
const std::vector<std::string>& command_line();
void set_command_line(int argc, char** argv);

// Provenance (src/cli/provenance.cpp). Commands that run work take --dry-run: dry_run() prints
// the resolved recipe, environment and command and returns true, and the command returns before
// creating anything. Commands that produce results record provenance() in run_meta.json.
// Commands that use no recipe (quantize, dequantize, gemm, sweep, init) never read
// LOCKSTEP_RECIPE: their provenance records "recipe": null and their dry run shows no recipe.
Json provenance(const std::string& command, const std::string& device, Json extra, Json layouts,
                std::map<std::string, uint64_t> seeds);
bool dry_run(bool requested, const std::string& what);
// The dry run of a command that runs with a recipe (train, pretrain, compare, forward, sample,
// align): the recipe block as well.
bool dry_run(bool requested, const SelectedRecipe& recipe, const std::string& what);

// Runs f(); a QuantError or SafetensorsError it throws is thrown again with "FILE: " in front
// (unless the message already starts with it), so that every shape-rule or metadata error names
// the file as well as the tensor.
template <class F>
auto naming_file(const std::string& file, F&& f) -> decltype(f()) {
  auto named = [&](const char* what) {
    const std::string m(what);
    return m.starts_with(file + ":") ? m : file + ": " + m;
  };
  try {
    return f();
  } catch (const QuantError& e) {
    throw QuantError(named(e.what()));
  } catch (const SafetensorsError& e) {
    throw SafetensorsError(named(e.what()));
  }
}

// Shared value checks (src/cli/checks.cpp).
// Every output of a command, checked before any work: each path by resolve_output_path
// (lockstep/tensor/file_io.h), and no two naming the same file. Empty paths (an output not asked
// for) are skipped. Throws UsageError naming the flag, the path and the rule.
void check_output_paths(std::initializer_list<std::pair<std::string_view, std::string>> outputs);
// Writes `file` to `output` and, when `run_meta_path` is not empty, `run_meta` to it: both
// written to temporaries first, renamed into place only once both are complete.
void write_outputs(const std::string& output, const SafetensorsFile& file,
                   const std::string& run_meta_path, const Json& run_meta);
// The same for an output already written into `out` (a streamed file): writes run_meta, then
// commits both.
void commit_outputs(AtomicFile& out, const std::string& run_meta_path, const Json& run_meta);
// The one parser of integer flags: decimal digits with an optional '-' (only where min < 0), in
// [min, max] ("-1" for an unsigned flag, "1e3", "0x10", "1.5", " 5", "" are refused). UsageError
// naming the flag, the text and the range otherwise.
int64_t parse_integer(const std::string& text, std::string_view flag, int64_t min, int64_t max);
uint64_t parse_unsigned(const std::string& text, std::string_view flag, uint64_t max,
                        uint64_t min = 0);
// An integer option parsed by parse_integer / parse_unsigned into `target` (its current value is
// shown as the default). Every integer flag of every command is added through these.
template <class T>
CLI::Option* add_integer_option(CLI::App& app, const std::string& name, T& target, T min, T max,
                                const std::string& description);
template <class T>
CLI::Option* add_integer_option(CLI::App& app, const std::string& name, std::optional<T>& target,
                                T min, T max, const std::string& description);
CLI::Option* add_unsigned_option(CLI::App& app, const std::string& name, uint64_t& target,
                                 uint64_t max, const std::string& description);
// A finite real flag in [lo, hi] (or (lo, hi] with lo_open): "nan", "inf", "1e999", "0x1p3" and
// trailing text are refused (UsageError naming the flag).
double parse_real(const std::string& text, std::string_view flag, double lo, double hi,
                  bool lo_open);
template <class T>
CLI::Option* add_real_option(CLI::App& app, const std::string& name, T& target, double lo,
                             double hi, bool lo_open, const std::string& description);

// Inputs and outputs of a command, by flag: an output may be a folder the command creates or
// writes into (folder = true).
struct PathArg {
  std::string flag;
  std::string path;
  bool folder = false;
};
// Refuses (UsageError) an output that is one of the command's inputs or lies inside an input
// folder (a model directory, a run folder), and an output folder that holds an input: paths are
// compared by device and inode of the resolved files and their folders, so symbolic links,
// hard links, "a/../b" and relative paths cannot hide one from another. Inputs that do not exist
// are skipped (the command reports them). Called before any work.
void check_outputs_not_inputs(const std::vector<PathArg>& outputs,
                              const std::vector<PathArg>& inputs);
// A folder a command creates or writes into (--out, --cache-dir, pretrain -o): when it exists it
// must be a writable folder, otherwise its nearest existing parent must be. UsageError naming the
// flag otherwise; checked before any work.
void check_output_folder(std::string_view flag, const std::string& path);

// --device as a Device (select_device: cpu, cuda, cuda:N or auto): UsageError naming the flag for
// an unknown spelling or a device this build or machine lacks.
Device device_flag(const std::string& choice);
// Adds --device (default auto) to a command.
void add_device_option(CLI::App& app, std::string& target);

void register_quantize_commands(CLI::App& app);       // quantize, dequantize
void register_inspect_command(CLI::App& app);         // inspect
void register_sweep_command(CLI::App& app);           // sweep
void register_bench_commands(CLI::App& app);          // bench quantize, ...
void register_bench_gemm_command(CLI::App& bench);    // bench gemm (under `bench`)
void register_bench_header_command(CLI::App& bench);  // bench safetensors-header
void register_recipe_commands(CLI::App& app);         // recipes, describe
void register_doctor_command(CLI::App& app);          // doctor
void register_gemm_command(CLI::App& app);            // gemm
void register_report_command(CLI::App& app);          // report
void register_model_commands(CLI::App& app);          // forward, sample, align
void register_bench_model_command(CLI::App& bench);   // bench model (under `bench`)
void register_bench_sync_command(CLI::App& bench);    // bench sync (under `bench`)
void register_init_commands(CLI::App& app);           // init, presets
void register_train_commands(CLI::App& app);          // train, pretrain
void register_compare_command(CLI::App& app);         // compare
void register_export_commands(CLI::App& app);         // export, convert
void register_verify_command(CLI::App& app);          // verify
void register_serve_weights_commands(CLI::App& app);  // serve-weights, receive-weights
// `lockstep inspect MODEL_DIR` (src/cli/cmd_inspect_model.cpp).
void inspect_model_dir(const std::string& dir, bool json);

// ---- template definitions -----------------------------------------------------------------------

namespace detail {
inline std::string flag_of(const std::string& name) { return name.substr(0, name.find(',')); }
template <class T>
T parse_as(const std::string& text, std::string_view flag, T min, T max) {
  if constexpr (std::is_unsigned_v<T>)
    return T(parse_unsigned(text, flag, uint64_t(max), uint64_t(min)));
  else
    return T(parse_integer(text, flag, int64_t(min), int64_t(max)));
}
}  // namespace detail

template <class T>
CLI::Option* add_integer_option(CLI::App& app, const std::string& name, T& target, T min, T max,
                                const std::string& description) {
  static_assert(std::is_integral_v<T>);
  const std::string flag = detail::flag_of(name);
  return app
      .add_option_function<std::string>(
          name,
          [&target, flag, min, max](const std::string& s) {
            target = detail::parse_as<T>(s, flag, min, max);
          },
          description)
      ->type_name(std::is_unsigned_v<T> ? "UINT" : "INT")
      ->default_str(std::to_string(target));
}

template <class T>
CLI::Option* add_integer_option(CLI::App& app, const std::string& name, std::optional<T>& target,
                                T min, T max, const std::string& description) {
  const std::string flag = detail::flag_of(name);
  return app
      .add_option_function<std::string>(
          name,
          [&target, flag, min, max](const std::string& s) {
            target = detail::parse_as<T>(s, flag, min, max);
          },
          description)
      ->type_name(std::is_unsigned_v<T> ? "UINT" : "INT");
}

template <class T>
CLI::Option* add_real_option(CLI::App& app, const std::string& name, T& target, double lo,
                             double hi, bool lo_open, const std::string& description) {
  const std::string flag = detail::flag_of(name);
  return app
      .add_option_function<std::string>(
          name,
          [&target, flag, lo, hi, lo_open](const std::string& s) {
            target = T(parse_real(s, flag, lo, hi, lo_open));
          },
          description)
      ->type_name("REAL")
      ->default_str(fmt::format("{}", target));
}

}  // namespace lockstep::cli
