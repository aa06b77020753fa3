// Provenance shared by the commands that produce results: the run_meta.json document (recipe as
// selected by the environment, command line, build, device) and the --dry-run block.
#include <fmt/format.h>

#include "commands.h"
#include "lockstep/diag/run_meta.h"

namespace lockstep::cli {

SelectedRecipe environment_recipe() {
  SelectionInputs in;
  in.read_environment();
  return select_recipe(in);
}

Json provenance(const std::string& command, const std::string& device, Json extra, Json layouts,
                std::map<std::string, uint64_t> seeds) {
  RunMetaExtras x;
  x.command = command;
  x.argv = command_line();
  x.device = device;
  x.extra = std::move(extra);
  x.layouts = std::move(layouts);
  x.seeds = std::move(seeds);
  return run_meta_json(environment_recipe(), x);
}

bool dry_run(bool requested, const std::string& what) {
  if (!requested) return false;
  print_dry_run(stdout, environment_recipe(), command_line());
  fmt::print("would run: {}\n", what);
  return true;
}

}  // namespace lockstep::cli
