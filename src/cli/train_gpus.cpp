// `lockstep train --gpus L:S`, `--learner-ranks N` and `--async-rollout`: parsed with the shared
// integer parser and checked against the CUDA devices this build and machine offer before any
// work (train_cli.h).
#include <fmt/format.h>

#include <bit>

#include "commands.h"
#include "lockstep/dist/nccl.h"
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

void add_gpus_options(CLI::App& cmd, ParallelArgs& p) {
  cmd.add_option_function<std::string>(
         "--gpus", [&p](const std::string& s) { p.gpus = parse_gpus(s); },
         "L:S GPUs of this host: L data-parallel learner ranks (threads over NCCL on cuda:0 .. "
         "cuda:L-1, L a power of two) and S sampler GPUs (0: the sampler shares cuda:0; 1: it "
         "runs on cuda:L); N alone is N:0. 1:0 is the single-device run on --device. Checked "
         "against the CUDA devices found before any work (docs/multi-gpu.md)")
      ->type_name("L:S")
      ->default_str("1:0");
  add_integer_option(cmd, "--learner-ranks", p.learner_ranks, 1, 1024,
                     "N data-parallel learner ranks as threads on the CPU (the in-process fake "
                     "transport; N a power of two dividing --grad-slots): the same bits as one "
                     "rank with the same --grad-slots. On GPUs use --gpus L:S");
  add_integer_option(cmd, "--async-rollout", p.async_rollout, 0, 1,
                     "1: overlap rollouts with training: while the learner trains step k, a "
                     "background thread samples step k + 1's batch with version k - 1, so step k "
                     "trains on version max(0, k - 2)'s samples (policy lag 1 after step 1; "
                     "TIS / TRIAGE correct for it). Deterministic and resumable; a resume keeps "
                     "the run's value");
}

void check_gpus(const ParallelArgs& p, const DeviceReport& found) {
  const GpuSplit& g = p.gpus;
  const std::string flag = fmt::format("--gpus {}:{}", g.learners, g.samplers);
  const int want = g.learners + g.samplers;
  if (want > 1 && want > int(found.gpus.size()))
    throw UsageError(fmt::format(
        "{} asks for {} GPUs ({} learner, {} sampler); this machine has {} CUDA device(s){}", flag,
        want, g.learners, g.samplers, found.gpus.size(),
        found.gpus.empty() ? fmt::format(" ({})", found.error) : std::string()));
  if (g.samplers > 1)
    throw UsageError(fmt::format(
        "{}: more than one sampler GPU is not implemented (the sampler runs on one GPU: S = 0 "
        "shares cuda:0, S = 1 gives it cuda:{})",
        flag, g.learners));
  if (!std::has_single_bit(unsigned(g.learners)))
    throw UsageError(fmt::format(
        "{}: {} learner ranks; the count must be a power of two (each rank's gradient slots are "
        "one subtree of the fixed reduction tree)",
        flag, g.learners));
  if (g.learners > 1 && !dist::nccl_compiled())
    throw UsageError(fmt::format(
        "{}: several learner GPUs need the NCCL transport, and this lockstep was built without it "
        "(-DLOCKSTEP_CUDA=ON with the NCCL header; docs/multi-gpu.md)",
        flag));
  if (!std::has_single_bit(unsigned(p.learner_ranks)))
    throw UsageError(
        fmt::format("--learner-ranks {}: the count must be a power of two (each rank's gradient "
                    "slots are one subtree of the fixed reduction tree)",
                    p.learner_ranks));
  if (p.learner_ranks > 1 && p.multi_gpu())
    throw UsageError(fmt::format(
        "--learner-ranks {} with {}: --learner-ranks runs CPU threads, --gpus GPU ranks; give one",
        p.learner_ranks, flag));
}

void apply_parallel(const ParallelArgs& p, rl::TrainOptions& o) {
  o.async_rollout = p.async_rollout;
  if (p.multi_gpu()) {
    const std::string flag = fmt::format("--gpus {}:{}", p.gpus.learners, p.gpus.samplers);
    if (o.device != Device::cuda(0))
      throw UsageError(fmt::format(
          "{} places the learner ranks on cuda:0 .. cuda:{} and the run on cuda:0, but --device "
          "is {}; drop --device (or give cuda:0)",
          flag, p.gpus.learners - 1, o.device.str()));
    o.learner_ranks = p.gpus.learners;
    if (p.gpus.samplers == 1) o.sampler_device = Device::cuda(p.gpus.learners);
    return;
  }
  if (p.learner_ranks > 1 && !o.device.is_cpu())
    throw UsageError(fmt::format(
        "--learner-ranks {} runs threads on the CPU over the fake transport, but the run is on "
        "{}; give --device cpu, or --gpus {} for GPU ranks",
        p.learner_ranks, o.device.str(), p.learner_ranks));
  o.learner_ranks = p.learner_ranks;
}

}  // namespace lockstep::cli
