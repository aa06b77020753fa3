// Provenance shared by the commands that produce results: the run_meta.json document (command
// line, build, device, and the recipe where the command runs with one) and the --dry-run block.
#include <fmt/format.h>

#include "commands.h"
#include "lockstep/diag/run_meta.h"

namespace lockstep::cli {

Json provenance(const std::string& command, const std::string& device, Json extra, Json layouts,
                std::map<std::string, uint64_t> seeds) {
  RunMetaExtras x;
  x.command = command;
  x.argv = command_line();
  x.device = device;
  x.extra = std::move(extra);
  x.layouts = std::move(layouts);
  x.seeds = std::move(seeds);
  // The command runs without a recipe: LOCKSTEP_RECIPE is not read (a value it would refuse
  // cannot break a command that never uses it), and the document says there was none.
  Json j = run_meta_json(select_recipe(SelectionInputs{}), x);
  j["recipe"] = nullptr;
  j.erase("coverage");
  return j;
}

bool dry_run(bool requested, const std::string& what) {
  if (!requested) return false;
  std::string cmd;
  for (const std::string& a : command_line()) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
  fmt::print("dry run: nothing was run and nothing was created\ncommand: {}\nenvironment:\n", cmd);
  const Json env = relevant_environment();
  for (const auto& [k, v] : env.items())
    fmt::print("  {}={}\n", k, v.is_null() ? "(unset)" : v.get<std::string>());
  fmt::print("would run: {}\n", what);
  return true;
}

bool dry_run(bool requested, const SelectedRecipe& recipe, const std::string& what) {
  if (!requested) return false;
  print_dry_run(stdout, recipe, command_line());
  fmt::print("would run: {}\n", what);
  return true;
}

}  // namespace lockstep::cli
