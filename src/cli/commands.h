// The `lockstep` subcommands. Each cmd_*.cpp file registers its subcommands on the root app;
// main.cpp maps exceptions to exit codes (kExitBadInput for anything the user can fix).
#pragma once

#include <CLI/CLI.hpp>

#include "lockstep/recipe/selection.h"

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

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

void register_quantize_commands(CLI::App& app);  // quantize, dequantize
void register_inspect_command(CLI::App& app);    // inspect
void register_sweep_command(CLI::App& app);      // sweep
void register_bench_commands(CLI::App& app);     // bench quantize, ...
void register_bench_gemm_command(CLI::App& bench);  // bench gemm (under `bench`)
void register_recipe_commands(CLI::App& app);    // recipes, describe
void register_doctor_command(CLI::App& app);     // doctor
void register_gemm_command(CLI::App& app);       // gemm
void register_model_commands(CLI::App& app);     // forward, sample, align
void register_bench_model_command(CLI::App& bench);  // bench model (under `bench`)
void register_init_commands(CLI::App& app);      // init, presets
// `lockstep inspect MODEL_DIR` (src/cli/cmd_inspect_model.cpp).
void inspect_model_dir(const std::string& dir, bool json);

}  // namespace lockstep::cli
