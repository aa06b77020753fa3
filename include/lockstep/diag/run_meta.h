// Provenance of a run: the run_meta.json every result-producing command writes (recipe and its
// full resolved content, where each choice came from, coverage, layouts, seeds, source revision,
// build, device), and the block `--dry-run` prints instead of running.
#pragma once

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lockstep/recipe/selection.h"
#include "lockstep/tensor/file_io.h"

namespace lockstep {

struct RunMetaExtras {
  std::string command;                    // "train", "quantize", ...
  std::vector<std::string> argv;          // the full command line, argv[0] first
  int layers = 0;                         // model depth; > 0 adds the per-layer coverage plan
  std::map<std::string, uint64_t> seeds;  // "init", "sampling", "stochastic_rounding", ...
  Json layouts = Json::object();          // scale layouts, group padding, ... (free form)
  std::string device = "cpu";             // the device the run used
  Json extra = Json::object();            // any other command-specific fields
};

// The environment variables a run's results depend on (LOCKSTEP_*, DISABLE_BACKWARD_QUANT,
// OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES); unset ones map to null.
Json relevant_environment();

// Source revision, build type, compiler flags, CUDA architectures, CUDA on/off.
Json build_info();

// The whole run_meta.json document.
Json run_meta_json(const SelectedRecipe& sel, const RunMetaExtras& x);

// Writes run_meta_json to `path` atomically (write_file_atomic, lockstep/tensor/file_io.h), so
// readers see the old file or the new one, never half of one. Throws OutputPathError for a bad
// target and FileWriteError when writing fails (the temporary is removed).
void write_run_meta(const std::filesystem::path& path, const SelectedRecipe& sel,
                    const RunMetaExtras& x);

// The --dry-run block: the full command line, the resolved recipe with its provenance, the
// relevant environment, and "nothing was created". Commands print it and return before any work.
void print_dry_run(std::FILE* out, const SelectedRecipe& sel, const std::vector<std::string>& argv);
std::string dry_run_text(const SelectedRecipe& sel, const std::vector<std::string>& argv);

// Quotes an argument for a POSIX shell when needed (for printing command lines).
std::string shell_quote(const std::string& arg);

}  // namespace lockstep
