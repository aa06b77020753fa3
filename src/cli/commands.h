// The `lockstep` subcommands. Each cmd_*.cpp file registers its subcommands on the root app;
// main.cpp maps exceptions to exit codes (kExitBadInput for anything the user can fix).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
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
SelectedRecipe environment_recipe();
Json provenance(const std::string& command, const std::string& device, Json extra, Json layouts,
                std::map<std::string, uint64_t> seeds);
bool dry_run(bool requested, const std::string& what);

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
// A decimal unsigned integer in [0, max] ("-1", "1e3", "0x10", "" are refused); UsageError
// naming the flag otherwise.
uint64_t parse_unsigned(const std::string& text, std::string_view flag, uint64_t max);
// An option whose value is parsed by parse_unsigned into `target` (its current value is shown as
// the default).
CLI::Option* add_unsigned_option(CLI::App& app, const std::string& name, uint64_t& target,
                                 uint64_t max, const std::string& description);

void register_quantize_commands(CLI::App& app);      // quantize, dequantize
void register_inspect_command(CLI::App& app);        // inspect
void register_sweep_command(CLI::App& app);          // sweep
void register_bench_commands(CLI::App& app);         // bench quantize, ...
void register_bench_gemm_command(CLI::App& bench);   // bench gemm (under `bench`)
void register_recipe_commands(CLI::App& app);        // recipes, describe
void register_doctor_command(CLI::App& app);         // doctor
void register_gemm_command(CLI::App& app);           // gemm
void register_report_command(CLI::App& app);         // report
void register_model_commands(CLI::App& app);         // forward, sample, align
void register_bench_model_command(CLI::App& bench);  // bench model (under `bench`)
void register_init_commands(CLI::App& app);          // init, presets
void register_train_commands(CLI::App& app);         // train, pretrain
void register_compare_command(CLI::App& app);        // compare
void register_export_commands(CLI::App& app);        // export, convert
void register_verify_command(CLI::App& app);         // verify
// `lockstep inspect MODEL_DIR` (src/cli/cmd_inspect_model.cpp).
void inspect_model_dir(const std::string& dir, bool json);

}  // namespace lockstep::cli
