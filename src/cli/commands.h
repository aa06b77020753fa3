// The `lockstep` subcommands. Each cmd_*.cpp file registers its subcommands on the root app;
// main.cpp maps exceptions to exit codes (kExitBadInput for anything the user can fix).
#pragma once

#include <CLI/CLI.hpp>

#include <stdexcept>
#include <string>

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

void register_quantize_commands(CLI::App& app);  // quantize, dequantize
void register_inspect_command(CLI::App& app);    // inspect
void register_sweep_command(CLI::App& app);      // sweep
void register_bench_commands(CLI::App& app);     // bench quantize, ...
void register_recipe_commands(CLI::App& app);    // recipes, describe
void register_doctor_command(CLI::App& app);     // doctor

}  // namespace lockstep::cli
