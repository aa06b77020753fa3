// Learner-sampler agreement: the sampler samples a batch of sequences from random prompts, the
// learner rescores them (all packed in one batch, or each alone), and delta = learner log-prob -
// sampler log-prob of every generated token is summarised. In deterministic mode every recipe
// whose ops are row-local gives delta = 0 exactly (docs/model.md "Learner-sampler agreement").
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "lockstep/model/decoder.h"
#include "lockstep/model/weights.h"
#include "lockstep/recipe/recipe.h"

namespace lockstep::model {

struct AlignOptions {
  ExecMode mode = ExecMode::kFast;
  int64_t batch = 8;       // sequences
  int64_t max_new = 16;    // generated tokens per sequence (fewer at eos)
  int64_t min_prompt = 1;  // prompt lengths drawn uniformly in [min_prompt, max_prompt]
  int64_t max_prompt = 8;
  double temperature = 1.0;
  uint64_t seed = 0;              // prompts and sampling
  bool alone = false;             // sampler and learner see one sequence at a time
  KvDtype kv = KvDtype::kBf16;    // the sampler's cache
  bool learner_kv_match = false;  // the learner rounds K / V like the cache (else to bf16)
  Device device = Device::cpu();  // where the learner and the sampler run
  // Rescore with another recipe than the sampler's (e.g. a bf16 learner behind a quantized
  // sampler, the usual setup without a shared contract); unset: the sampler's recipe.
  std::optional<Recipe> learner_recipe;
  // Routing replay (docs/rl.md "Routing replay"): the sampler records its experts and the learner
  // rescores with them; the learner's own routing is scored too (AlignResult's no-replay fields).
  // A model without MoE layers is refused.
  bool routing_replay = false;
};

// delta = learner log-prob - sampler log-prob over tokens.
struct GapStats {
  int64_t tokens = 0;
  double mean_abs = 0, max_abs = 0, q05 = 0;
};
// q05: the nearest-rank 5th percentile of delta (signed), sorted[floor(0.05 (n - 1))].
GapStats gap_stats(const std::vector<double>& delta);

struct AlignResult {
  std::vector<double> delta;  // per generated token, sequences in order (replayed experts when
                              // routing_replay is on)
  GapStats stats;
  // With routing_replay: the same tokens under the learner's own routing, and the share of
  // (scored row, MoE layer) pairs whose experts (in slot order) differ from the sampler's.
  std::vector<double> delta_no_replay;
  GapStats stats_no_replay;
  double routing_mismatch = 0;
};

AlignResult align(const ModelWeights& weights, const Recipe& recipe, const AlignOptions& opt);

}  // namespace lockstep::model
