// `lockstep doctor`: what this build and machine can run (CPU, GPUs, compiled architectures) and,
// for a recipe, which route each of its requirements takes on each device.
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "commands.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/recipe/selection.h"
#include "lockstep/tensor/device.h"
#include "train_cli.h"

namespace lockstep::cli {
namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown";
}

// The route a requirement takes on a GPU of compute capability cc (major*10 + minor), following
// DESIGN.md "GPU strategy": NVFP4 / MXFP8 GEMMs are native on sm_100 and emulated exactly on
// sm_90 (dequantized to bf16 in the main loop); FP8 is native from sm_89.
std::string gpu_route(const std::string& req, int cc, bool cuda_compiled) {
  if (!cuda_compiled) return "unavailable (built without CUDA)";
  if (cc < 80) return "unavailable (needs sm_80 or newer)";
  if (req.rfind("gemm:", 0) == 0) {
    const bool block_fp =
        req.find("nvfp4") != std::string::npos || req.find("mxfp8") != std::string::npos;
    const bool fp8 = req.find("fp8") != std::string::npos && !block_fp;
    if (block_fp) {
      if (cc >= 100) return "native (sm_100 block-scaled tensor cores)";
      if (cc >= 90) return "emulated exactly (dequantize to bf16 in the main loop)";
      return "unavailable (needs sm_90 or newer)";
    }
    if (fp8)
      return cc >= 89 ? "native (fp8 tensor cores)" : "unavailable (fp8 needs sm_89 or newer)";
    return "native (bf16 tensor cores)";
  }
  return "cuda kernel";  // quantizers, rounding, transforms: plain CUDA, any supported arch
}

struct DoctorArgs {
  SelectionInputs sel;
  bool json = false;
};

void run_doctor(DoctorArgs& a) {
  a.sel.read_environment();
  const SelectedRecipe s = select_recipe(a.sel);
  const DeviceReport dev = query_devices();
  const std::vector<std::string> reqs = recipe_requirements(s.recipe);

  Json j;
  j["build"] = build_info();
  j["cpu"] = {{"model", cpu_model()}, {"omp_threads", dev.omp_threads}};
  j["cuda"] = {{"compiled", dev.cuda_compiled},
               {"compiled_architectures", dev.compiled_archs},
               {"runtime_version", dev.cuda_runtime_version},
               {"driver_version", dev.cuda_driver_version}};
  if (!dev.error.empty()) j["cuda"]["error"] = dev.error;
  j["gpus"] = Json::array();
  for (const GpuInfo& g : dev.gpus)
    j["gpus"].push_back({{"index", g.index},
                         {"name", g.name},
                         {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)},
                         {"memory_bytes", g.memory_bytes},
                         {"sm_count", g.sm_count}});
  Json rj;
  rj["name"] = s.recipe.name;
  rj["provenance"] = provenance_json(s.provenance);
  rj["requires"] = Json::array();
  for (const std::string& req : reqs) {
    Json r;
    r["id"] = req;
    r["cpu"] = "reference";  // the CPU reference implements every format and scaling
    for (const GpuInfo& g : dev.gpus)
      r[fmt::format("cuda:{}", g.index)] =
          gpu_route(req, g.cc_major * 10 + g.cc_minor, dev.cuda_compiled);
    rj["requires"].push_back(std::move(r));
  }
  rj["runs_on_cpu"] = true;
  bool gpu_ok = dev.cuda_compiled && !dev.gpus.empty();
  for (const GpuInfo& g : dev.gpus)
    for (const std::string& req : reqs)
      gpu_ok =
          gpu_ok && gpu_route(req, g.cc_major * 10 + g.cc_minor, true).rfind("unavailable", 0) != 0;
  rj["runs_on_cuda"] = gpu_ok;
  j["recipe"] = std::move(rj);
  // What --device auto (the default of train, compare, forward, sample, align, bench model) picks.
  const std::string auto_device = dev.cuda_compiled && !dev.gpus.empty() ? "cuda:0" : "cpu";
  j["default_device"] = auto_device;

  if (a.json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  const Json& b = j["build"];
  fmt::print("build:  lockstep {} ({}), {}, CUDA {}\n", b["source_revision"].get<std::string>(),
             b["build_type"].get<std::string>(), b["cxx_flags"].get<std::string>(),
             dev.cuda_compiled ? "on, archs " + dev.compiled_archs : std::string("off"));
  fmt::print("cpu:    {}, {} OpenMP threads\n", cpu_model(), dev.omp_threads);
  if (dev.cuda_compiled) {
    // cudaRuntimeGetVersion / cudaDriverGetVersion encode 1000 * major + 10 * minor.
    auto version = [](int v) {
      return v == 0 ? std::string("none") : fmt::format("{}.{}", v / 1000, v % 1000 / 10);
    };
    fmt::print("cuda:   runtime {}, driver supports up to {}\n", version(dev.cuda_runtime_version),
               version(dev.cuda_driver_version));
  }
  if (dev.gpus.empty()) fmt::print("gpu:    none ({})\n", dev.error);
  for (const GpuInfo& g : dev.gpus)
    fmt::print("gpu {}:  {} (sm_{}{}), {:.1f} GiB, {} SMs\n", g.index, g.name, g.cc_major,
               g.cc_minor, double(g.memory_bytes) / double(1ull << 30), g.sm_count);
  fmt::print("recipe: {} (from {}: {})\n", s.recipe.name, recipe_source_name(s.provenance.source),
             s.provenance.detail);
  for (const Json& r : j["recipe"]["requires"]) {
    std::string line = fmt::format("  {:<32} cpu: reference", r["id"].get<std::string>());
    for (const GpuInfo& g : dev.gpus)
      line += fmt::format("; cuda:{}: {}", g.index,
                          r[fmt::format("cuda:{}", g.index)].get<std::string>());
    fmt::print("{}\n", line);
  }
  fmt::print("verdict: runs on cpu (reference): yes; runs on cuda: {}\n", gpu_ok ? "yes" : "no");
  fmt::print(
      "device: the model commands (train, compare, forward, sample, align, bench model) run on {} "
      "(--device auto){}\n",
      auto_device,
      auto_device == "cpu"
          ? ""
          : fmt::format("; train, pretrain and compare without --preset or --model train the {} "
                        "preset there, warm start included",
                        GpuMainJob::kPreset));
}

}  // namespace

void register_doctor_command(CLI::App& app) {
  auto a = std::make_shared<DoctorArgs>();
  CLI::App* doc = app.add_subcommand(
      "doctor",
      "What this build and machine can run, and which route a recipe's kernels take.\n"
      "Example: lockstep doctor --recipe nvfp4_per_token");
  add_recipe_options(*doc, a->sel);
  doc->add_flag("--json", a->json, "machine-readable output");
  doc->callback([a] { run_doctor(*a); });
}

}  // namespace lockstep::cli
