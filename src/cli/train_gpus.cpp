// `lockstep train --gpus L:S` and `--async-rollout`: parsed with the shared integer parser and
// checked against the CUDA devices this build and machine offer before any work (train_cli.h).
#include <fmt/format.h>

#include "commands.h"
#include "train_cli.h"

namespace lockstep::cli {

GpuSplit parse_gpus(const std::string& text) {
  constexpr int64_t kMaxGpus = 1024;
  GpuSplit g;
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    g.learners = int(parse_integer(text, "--gpus", 1, kMaxGpus));
    return g;
  }
  g.learners =
      int(parse_integer(text.substr(0, colon), "--gpus (learner GPUs, before ':')", 1, kMaxGpus));
  g.samplers =
      int(parse_integer(text.substr(colon + 1), "--gpus (sampler GPUs, after ':')", 0, kMaxGpus));
  return g;
}

void add_gpus_options(CLI::App& cmd, GpuSplit& gpus, int& async_rollout) {
  cmd.add_option_function<std::string>(
         "--gpus", [&gpus](const std::string& s) { gpus = parse_gpus(s); },
         "L:S GPUs of this host: L data-parallel learner ranks and S sampler GPUs (N alone is "
         "N:0, every GPU both learns and samples); 1:0 is the single-device run on --device. "
         "Checked against the CUDA devices found before any work (docs/multi-gpu.md)")
      ->type_name("L:S")
      ->default_str("1:0");
  add_integer_option(cmd, "--async-rollout", async_rollout, 0, 1,
                     "1: sample version v + 1 while the learner trains on version v's rollouts "
                     "(needs --gpus with sampler GPUs; not implemented yet)");
}

void check_gpus(const GpuSplit& g, int async_rollout, const DeviceReport& found) {
  const std::string flag = fmt::format("--gpus {}:{}", g.learners, g.samplers);
  const int want = g.learners + g.samplers;
  if (want > 1 && want > int(found.gpus.size()))
    throw UsageError(fmt::format(
        "{} asks for {} GPUs ({} learner, {} sampler); this machine has {} CUDA device(s){}", flag,
        want, g.learners, g.samplers, found.gpus.size(),
        found.gpus.empty() ? fmt::format(" ({})", found.error) : std::string()));
  if (want > 1)
    throw UsageError(fmt::format(
        "{}: runs on more than one GPU are not implemented yet (the transport, the gradient "
        "reduction and the weight broadcast exist as a library layer: docs/multi-gpu.md); run "
        "with --gpus 1:0",
        flag));
  if (async_rollout)
    throw UsageError(
        "--async-rollout 1: overlapping rollouts with training is not implemented yet (it needs "
        "sampler GPUs, --gpus L:S with S >= 1); run with --async-rollout 0");
}

}  // namespace lockstep::cli
