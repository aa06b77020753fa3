// Entry point of the `lockstep` command-line tool: chooses how OpenMP threads wait, builds the
// subcommand tree and turns errors into a message on stderr and a non-zero exit code.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <exception>
#include <functional>

#include "commands.h"
#include "lockstep/dist/nccl.h"
#include "lockstep/model/weights.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/file_io.h"
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

namespace {
// libgomp's idle threads spin (busy-wait, up to GOMP_SPINCOUNT iterations) between parallel
// regions before they sleep. With the cores to itself that saves a wake-up; beside one busy
// process on a 2-core machine the spinning thread takes the core from the thread that holds the
// work, and the main job ran ten times slower. Passive waiting (sleep at once) costs little idle
// (bench/RESULTS.md, "A busy machine"). libgomp reads the policy once, when it is loaded, before
// main() runs: so unless the user chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT set), the
// process executes itself once more with OMP_WAIT_POLICY=passive. The variable marks the second
// start, so this happens at most once; where exec fails the process runs on as it is.
void choose_omp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OMP_WAIT_POLICY");  // exec failed: this process keeps libgomp's default
}

// CLI11 prints its own parse errors without lockstep's prefix; every error says "lockstep: error:".
int parse_error_exit(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0 || dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr ||
      dynamic_cast<const CLI::CallForAllHelp*>(&e) != nullptr ||
      dynamic_cast<const CLI::CallForVersion*>(&e) != nullptr)
    return app.exit(e) == 0 ? kExitOk : kExitBadInput;
  fmt::print(stderr, "lockstep: error: {} (`lockstep COMMAND --help` lists the options)\n",
             e.what());
  return kExitBadInput;
}
}  // namespace
}  // namespace lockstep::cli

int main(int argc, char** argv) {
  using namespace lockstep::cli;
  choose_omp_wait_policy(argv);
  // A write past the file size limit fails (EFBIG, exit 1, temporaries removed) instead of
  // killing the process with SIGXFSZ.
  lockstep::install_file_size_limit_handler();
  // NVLink multicast stays off in this process and every process it starts (docs/multi-gpu.md).
  lockstep::dist::force_nvls_off();
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
  register_serve_weights_commands(app);
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
    return parse_error_exit(app, e);
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
