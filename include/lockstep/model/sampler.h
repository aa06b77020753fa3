// The sampler: its own copy of the weights (a policy version), a KV cache (bf16 or FP8 E4M3),
// continuous batching over a request list (sequences join as slots free up and leave at eos or
// max_new), temperature / top-k / top-p sampling with one Philox uniform per (sequence, position)
// (ops::sample_tokens, ops/sampling.h), returning tokens and the sampler's log-probs of them. On a
// GPU every op of a step runs there; per step the host sends the step's token ids, positions and
// slots and reads back one token and one log-prob per active sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/model/policy.h"
#include "lockstep/tensor/graph.h"

namespace lockstep::model {

struct SamplerConfig {
  double temperature = 1.0;  // > 0; log-probs are of logits / temperature
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0: all tokens
  int64_t max_new = 16;
  uint64_t seed = 0;
  KvDtype kv = KvDtype::kBf16;
  int64_t max_batch = 64;         // sequences decoded together
  std::optional<int64_t> eos{};   // stop token (kept in the output)
  Device device = Device::cpu();  // where the policy, the KV cache and every step run
  // On a CUDA device, a decode step (every active sequence adding one token) is captured once
  // per batch size into a device graph and replayed: the same kernels with the same arguments,
  // so the same tokens and log-probs as running the step's calls one by one.
  bool cuda_graphs = true;
  // With a recorded decode step, the next step is queued before the host reads the tokens of
  // the current one (the step feeds its tokens to the next itself), so the host's part of a step
  // overlaps the device's. A sequence that stops at an eos then rides along one more step (its
  // token dropped), and waiting requests join a step later: the same tokens and log-probs either
  // way wherever a sequence's bits do not depend on its batch (the deterministic mode with
  // row-local recipes); in fast mode, as with any other change of batch, they may round
  // differently.
  bool overlap_steps = true;
  // The GEMM kernels of the sampler's layers. kDeterministic: the batch-invariant kernels the
  // deterministic learner runs, whatever the batch (learner == sampler bit for bit). kFast: the
  // fastest kernel for each shape (on a GPU the decode kernel for <= 16 rows, cuBLAS for bf16
  // weights), as the fast learner picks them. The CPU runs one kernel in both.
  ExecMode mode = ExecMode::kDeterministic;
  // Routing replay (docs/rl.md "Routing replay"): record the experts every MoE layer chose for
  // every position the sampler runs (SampleResult::routing). Decode steps then run call by call,
  // never from a CUDA graph (a graph's outputs are the step's fixed buffers; the experts are
  // per-call tensors). generate() refuses it for a model without MoE layers.
  bool record_routing = false;
};

// What the sampler's decode steps ran as, summed over its generate calls.
struct SamplerStats {
  int64_t direct_steps = 0;    // decode steps run call by call
  int64_t graph_captures = 0;  // decode steps recorded into a graph (one per batch size)
  int64_t graph_replays = 0;   // decode steps run as one graph launch
  int64_t steps_ahead = 0;     // of those, queued before the previous step's tokens were read
  std::string graphs_off;      // why graphs are not used now (empty: they are, where they can)
  GraphNodes graph_nodes;      // the nodes of the decode step recorded last
};

struct SampleRequest {
  std::vector<int32_t> prompt;  // >= 1 token
  uint32_t stream = 0;          // Philox stream (the request's index by convention)
};

struct SampleResult {
  std::vector<int32_t> tokens;  // generated tokens
  std::vector<float> logprobs;  // the sampler's log-prob of each generated token
  bool eos = false;             // stopped at the eos token
  // With SamplerConfig::record_routing: the experts of every position the sampler ran, which are
  // the prompt and every generated token but the last (exactly the learner's input rows of
  // prompt + tokens[:-1]), I32 [positions, moe_layers, top_k] row-major, MoE layers in ascending
  // order, each position's slots in the router's slot order. Empty otherwise.
  std::vector<int32_t> routing;
};

// The learner's routing replay input (Decoder::forward) for a packed batch of recorded samples:
// sample i occupies rows [cu_seqlens[i], cu_seqlens[i + 1]); its recorded positions fill its first
// rows, and a row past them (the last generated token when the packing includes it: the sampler
// never ran it, no scored log-prob reads its output, so its gradient is zero) takes experts
// 0 .. top_k - 1. Throws std::invalid_argument for a model without MoE layers, a sample without a
// recording, or one recorded for more positions than its rows.
Routing replay_routing(const ModelConfig& c, std::span<const SampleResult> samples,
                       std::span<const int64_t> cu_seqlens);

class Sampler {
 public:
  explicit Sampler(SamplerConfig cfg = {});
  ~Sampler();

  // Verifies and installs a policy version: refuses (PolicyError) a version other than
  // expected_version, a recipe other than expected_recipe (when non-empty), or a checksum that
  // does not match the bytes.
  void load_policy(PolicyVersion p, int64_t expected_version, const std::string& expected_recipe);
  int64_t version() const;
  const SamplerConfig& config() const;
  void set_config(const SamplerConfig& cfg);

  // Samples every request (results in request order). Invalid requests (empty prompt, token ids
  // out of range, prompt longer than the context) throw std::invalid_argument before any work;
  // logits without a distribution (NaN or +inf) throw std::domain_error.
  std::vector<SampleResult> generate(std::span<const SampleRequest> requests);

  // Teacher-forced decode: the sampler's log-probs of `continuation` after `prompt`, token by
  // token through the KV cache (what align compares when no sampling is wanted).
  std::vector<float> score(std::span<const int32_t> prompt, std::span<const int32_t> continuation);

  const SamplerStats& stats() const;

  // Seconds per decode step of `batch` sequences with no host work between steps: the step that
  // generate recorded for that batch size, replayed `reps` times back to back on the sampler's
  // stream (its inputs are the last step's; the KV cache positions it writes are rewritten before
  // any later step reads them). 0 when no step of that batch size is recorded (CPU, graphs off).
  // A step of generate takes this plus the host's part (inputs up, tokens back, bookkeeping).
  double replayed_step_seconds(int64_t batch, int reps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::model
