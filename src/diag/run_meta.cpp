// run_meta.json (written atomically) and the --dry-run block: what a run used and why, so any
// result can be traced to its recipe, its sources, the build and the machine.
#include "lockstep/diag/run_meta.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/device.h"
#include "lockstep/tensor/file_io.h"
#include "lockstep/version.h"

extern char** environ;

namespace lockstep {
namespace {

#ifndef LOCKSTEP_BUILD_TYPE
#define LOCKSTEP_BUILD_TYPE "unknown"
#endif
#ifndef LOCKSTEP_CXX_FLAGS
#define LOCKSTEP_CXX_FLAGS ""
#endif
#ifndef LOCKSTEP_CUDA_ARCHS
#define LOCKSTEP_CUDA_ARCHS ""
#endif

// Per module class: runs of consecutive layers with the same choice, e.g.
// {"experts_fc1": [{"layers": "0-16", "fprop": "nvfp4", ...}, {"layers": "17-19", ...}]}.
Json coverage_summary_json(const ModelPlan& plan) {
  Json out = Json::object();
  for (int c = 0; c < kLayerModuleClasses; ++c) {
    Json runs = Json::array();
    int start = 0;
    for (int l = 1; l <= plan.layers; ++l) {
      const bool end = l == plan.layers;
      const Json prev = choice_json(plan.per_layer[size_t(l - 1)][size_t(c)]);
      if (!end && choice_json(plan.per_layer[size_t(l)][size_t(c)]) == prev) continue;
      Json r;
      r["layers"] = start == l - 1 ? fmt::format("{}", start) : fmt::format("{}-{}", start, l - 1);
      for (const auto& [k, v] : prev.items()) r[k] = v;
      runs.push_back(std::move(r));
      start = l;
    }
    out[std::string(module_class_name(ModuleClass(c)))] = std::move(runs);
  }
  out["lm_head"] = choice_json(plan.lm_head);
  return out;
}

Json device_json(const std::string& used) {
  const DeviceReport r = query_devices();
  Json j;
  j["used"] = used;
  j["cuda_compiled"] = r.cuda_compiled;
  j["omp_threads"] = r.omp_threads;
  j["gpus"] = Json::array();
  for (const GpuInfo& g : r.gpus)
    j["gpus"].push_back({{"index", g.index},
                         {"name", g.name},
                         {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)},
                         {"memory_bytes", g.memory_bytes}});
  if (!r.error.empty()) j["gpu_error"] = r.error;
  return j;
}

}  // namespace

std::string shell_quote(const std::string& a) {
  if (!a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+@%") == std::string::npos)
    return a;
  std::string q = "'";
  for (char ch : a) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

Json relevant_environment() {
  Json j;
  for (const char* name :
       {kRecipeEnvVar, kDisableBackwardQuantEnvVar, "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"}) {
    const char* v = std::getenv(name);
    j[name] = v ? Json(v) : Json(nullptr);
  }
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "LOCKSTEP_", 9) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    j[std::string(*e, size_t(eq - *e))] = std::string(eq + 1);
  }
  return j;
}

Json build_info() {
  Json j;
  j["source_revision"] = lockstep_source_revision();
  j["build_type"] = LOCKSTEP_BUILD_TYPE;
  j["cxx_flags"] = LOCKSTEP_CXX_FLAGS;
#if defined(LOCKSTEP_HAVE_CUDA)
  j["cuda"] = true;
#else
  j["cuda"] = false;
#endif
  j["cuda_architectures"] = LOCKSTEP_CUDA_ARCHS;
  return j;
}

Json run_meta_json(const SelectedRecipe& sel, const RunMetaExtras& x) {
  Json j;
  j["schema"] = "lockstep.run_meta/1";
  j["command"] = x.command;
  j["argv"] = x.argv;
  Json rj;
  rj["name"] = sel.recipe.name;
  rj["provenance"] = provenance_json(sel.provenance);
  rj["backward_mode"] = backward_mode_name(sel.recipe.linear.backward_mode);
  rj["forward"] = forward_summary(sel.recipe);
  rj["backward"] = backward_summary(sel.recipe);
  rj["content"] = to_json(sel.recipe);
  j["recipe"] = std::move(rj);
  Json cov;
  cov["rules"] = to_json(sel.recipe)["coverage"];
  if (x.layers > 0) {
    const ModelPlan plan = resolve_model(sel.recipe, x.layers);
    cov["layers"] = x.layers;
    cov["per_class"] = coverage_summary_json(plan);
  }
  j["coverage"] = std::move(cov);
  j["layouts"] = x.layouts;
  j["seeds"] = Json::object();
  for (const auto& [k, v] : x.seeds) j["seeds"][k] = v;
  j["build"] = build_info();
  j["device"] = device_json(x.device);
  j["environment"] = relevant_environment();
  for (const auto& [k, v] : x.extra.items()) j[k] = v;
  return j;
}

void write_run_meta(const std::filesystem::path& path, const SelectedRecipe& sel,
                    const RunMetaExtras& x) {
  write_file_atomic(path.string(), run_meta_json(sel, x).dump(2) + "\n");
}

std::string dry_run_text(const SelectedRecipe& sel, const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) {
    if (!cmd.empty()) cmd += ' ';
    cmd += shell_quote(a);
  }
  std::string s = "dry run: nothing was run and nothing was created\n";
  s += "command: " + cmd + "\n";
  s += fmt::format("recipe: {} (from {}: {})\n", sel.recipe.name,
                   recipe_source_name(sel.provenance.source), sel.provenance.detail);
  s += fmt::format("backward_mode: {} (from {})\n",
                   backward_mode_name(sel.recipe.linear.backward_mode),
                   sel.provenance.backward_mode_source);
  for (const auto& sh : sel.provenance.shadowed) s += "note: " + sh + "\n";
  s += "environment:\n";
  const Json env = relevant_environment();
  for (const auto& [k, v] : env.items())
    s += fmt::format("  {}={}\n", k, v.is_null() ? "(unset)" : v.get<std::string>());
  s += "resolved recipe:\n" + to_json(sel.recipe).dump(2) + "\n";
  return s;
}

void print_dry_run(std::FILE* out, const SelectedRecipe& sel,
                   const std::vector<std::string>& argv) {
  const std::string t = dry_run_text(sel, argv);
  std::fwrite(t.data(), 1, t.size(), out);
}

}  // namespace lockstep
