// Entry point of the `lockstep` command-line tool: builds the subcommand tree and turns errors
// into a message on stderr and a non-zero exit code.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "lockstep/version.h"
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <exception>
#include <functional>

#include "commands.h"
#include "lockstep/model/weights.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/safetensors.h"
#include "lockstep/version.h"

namespace lockstep::cli {
namespace {
std::vector<std::string>& command_line_storage() {
  static std::vector<std::string> v;
  return v;
}
}  // namespace
const std::vector<std::string>& command_line() { return command_line_storage(); }
void set_command_line(int argc, char** argv) { command_line_storage().assign(argv, argv + argc); }
}  // namespace lockstep::cli

int main(int argc, char** argv) {
  using namespace lockstep::cli;
#if defined(__GLIBC__)
  // Keep freed memory in the heap: the CPU engine allocates and frees the same large buffers every
  // step, and glibc's default (fresh mmap for each large block) costs a page fault per 4 KiB
  // touched.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  set_command_line(argc, argv);
  CLI::App app{
      "lockstep: one precision contract (NVFP4, MXFP8, FP8), bit-identical on CPU and GPU.\n"
      "Example: lockstep train"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("lockstep " LOCKSTEP_VERSION " (") +
                                        lockstep_source_revision() + ")");
  register_quantize_commands(app);
  register_inspect_command(app);
  register_sweep_command(app);
  register_bench_commands(app);
  register_recipe_commands(app);
  register_doctor_command(app);
  register_gemm_command(app);
  register_model_commands(app);
  register_init_commands(app);
  register_report_command(app);
  register_train_commands(app);
  register_compare_command(app);
  register_export_commands(app);
  register_verify_command(app);
  // CLI11 reports a misspelt command as "A subcommand is required"; name it instead. The root
  // app takes only flags (--help, --version), so its first other argument is the command.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("-")) continue;
    const auto subs = app.get_subcommands(std::function<bool(CLI::App*)>());
    if (std::none_of(subs.begin(), subs.end(),
                     [&](CLI::App* sub) { return sub->check_name(arg); })) {
      std::string names;
      for (const CLI::App* sub : subs) names += (names.empty() ? "" : ", ") + sub->get_name();
      fmt::print(stderr,
                 "lockstep: error: unknown command '{}' (commands: {}; `lockstep --help` describes "
                 "them)\n",
                 arg, names);
      return kExitBadInput;
    }
    break;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  } catch (const UsageError& e) {
    fmt::print(stderr, "lockstep: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const lockstep::QuantError& e) {
    fmt::print(stderr, "lockstep: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const lockstep::model::WeightsError& e) {
    fmt::print(stderr, "lockstep: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const lockstep::SafetensorsError& e) {
    fmt::print(stderr, "lockstep: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "lockstep: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep: failed: {}\n", e.what());
    return kExitFailure;
  }
  return kExitOk;
}
