// The learner: fp32 master weights, a decoder over them, per-token log-probs and entropy of given
// targets over packed variable-length sequences (no padding compute), backward through
// everything, AdamW with global gradient-norm clipping, weight versions, and checkpoints from
// which training continues bit-identically.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/model/decoder.h"
#include "lockstep/model/weights.h"
#include "lockstep/ops/optim.h"
#include "lockstep/recipe/coverage.h"

namespace lockstep::model {

struct LearnerConfig {
  ops::AdamWConfig adamw;
  double max_grad_norm = 1.0;  // <= 0: no clipping
  ExecMode mode = ExecMode::kDeterministic;
  double temperature = 1.0;   // log-probs of logits / temperature (as the sampler samples)
  uint64_t seed = 0;          // Philox seed of stochastic rounding (mixed with the step)
  DType dtype = DType::kF32;  // F64: the gradient-check path (f32 pass-through recipes)
  // How attention rounds K and V: a sampler with an FP8 cache attends to E4M3 codes, so a learner
  // that must score what that sampler scored rounds K / V the same way (ops/kv_cache.h; the
  // backward passes gradients straight through the rounding).
  KvDtype kv = KvDtype::kBf16;
  // Where the masters, gradients, moments and every op run (F64 runs on the CPU only). Not part
  // of a checkpoint: a checkpoint written on one device loads on any other.
  Device device = Device::cpu();
  std::vector<CodeOverride> code_overrides;  // per-module specs beating the recipe
};

// Host tensors, whatever the learner's device (per-token values the trainer reads).
struct LearnerOutput {
  Tensor logp;     // [n] log-prob of each target under logits / temperature
  Tensor entropy;  // [n] entropy of the full temperature-scaled distribution
};

struct StepStats {
  double grad_norm = 0.0;  // global L2 norm before clipping
  bool clipped = false;
  bool skipped = false;  // non-finite norm: no update, version unchanged
  int64_t version = 0;
};

class Learner {
 public:
  Learner(ModelWeights weights, Recipe recipe, LearnerConfig cfg = {});
  ~Learner();
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  // tokens, targets: I32 [n]; cu_seqlens: [b + 1]. Keeps what backward() needs. replay: routing
  // replay, the experts each MoE layer uses (e.g. the sampler's, replay_routing in sampler.h),
  // weighted by the learner's own router probabilities, so the router is still trained; refused
  // for a model without MoE layers. record: receives the experts every MoE layer used.
  LearnerOutput forward(const Tensor& tokens, std::span<const int64_t> cu_seqlens,
                        const Tensor& targets, const Routing* replay = nullptr,
                        Routing* record = nullptr);
  // The logits [n, V] of a packed batch (no log-probs, nothing kept); replay as in forward().
  Tensor logits(const Tensor& tokens, std::span<const int64_t> cu_seqlens,
                const Routing* replay = nullptr);
  // Gradients of sum_t dlogp[t] logp[t] + dentropy[t] entropy[t] added into grads(); either
  // may be undefined (zero); host or device tensors.
  void backward(const Tensor& dlogp, const Tensor& dentropy);
  // Clip, AdamW on the masters, zero the gradients, version + 1.
  StepStats step();
  // The AdamW learning rate of the next step() and after (a schedule sets it before each step);
  // a checkpoint records the current one. std::invalid_argument unless lr is finite and >= 0.
  void set_lr(double lr);
  void zero_grad();
  // The gradients as one F32 vector [gradient_numel()] on the learner's device, the tensors of
  // grads() laid end to end in name order: what a data-parallel learner reduces over its
  // gradient slots (one backward from zero gradients per slot). F32 learners only.
  Tensor gradient_flat() const;
  // Replaces every gradient by its part of `flat` (F32 [gradient_numel()], any device): the
  // reduced gradient that step() then clips and applies.
  void set_gradient_flat(const Tensor& flat);
  int64_t gradient_numel() const;
  // The masters were changed in place outside step() (a gradient check, a loaded state): rebuild
  // the weight operands the decoder made from them.
  void weights_changed();

  const ModelWeights& weights() const;  // the masters, on the learner's device
  // F32 [domains] per master (learner names, on the learner's device; domains from
  // set_weight_amax_domains, else 1): the amax of each equal part of the master after the last
  // step, for a converter that quantizes per tensor / per expert without reading the weight again
  // (export_policy's WeightAmax). Empty before the first step and after weights_changed().
  const std::map<std::string, Tensor>& weight_amax() const;
  // The number of equal parts (outer amax domains) of each named master's amax from the next
  // step on (model::weight_amax_domain_counts for the converter's recipe); masters not named keep
  // one. std::invalid_argument for an unknown name or a count that does not divide the rows.
  // Clears weight_amax().
  void set_weight_amax_domains(const std::map<std::string, int64_t>& domains);
  const std::map<std::string, Tensor>& grads() const;
  const Recipe& recipe() const;
  const ModelPlan& plan() const;
  const LearnerConfig& config() const;
  int64_t version() const;
  size_t saved_bytes() const;  // what the last forward keeps for the backward

  // Checkpoint directory: learner.safetensors (param.*, adam_m.*, adam_v.*) + learner.json
  // (config, recipe, version, step, learner settings). Files are written atomically.
  void save_checkpoint(const std::string& dir) const;
  // A learner continuing exactly where the checkpoint left off (same bits on the next steps when
  // it runs on the device that wrote it), on `device`.
  static std::unique_ptr<Learner> load_checkpoint(const std::string& dir,
                                                  Device device = Device::cpu());

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The plan of a recipe for a config with code overrides.
ModelPlan plan_for(const ModelConfig& c, const Recipe& r, std::span<const CodeOverride> code = {});

}  // namespace lockstep::model
