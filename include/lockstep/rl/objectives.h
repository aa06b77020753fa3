// RL objectives as pure functions of per-token arrays (docs/rl.md, "Objectives"): GRPO group
// advantages, the clipped token-level policy loss, the k3 KL to a reference policy, TIS and
// TRIAGE guards, and one entry (compute_objective) that combines them under ObjectiveConfig and
// returns the loss, d loss / d logp_new per token (to chain into the model's backward) and stats.
//
// Layout: R responses packed back to back into T tokens; response i owns tokens
// [offsets[i], offsets[i + 1]) (only generated tokens, never the prompt). Padded batches work too:
// offsets i * L and mask 0 on the padding. Every function is templated on the scalar type S
// (float for training, double for the float64 finite-difference tests); per-token arithmetic is
// done in S, every sum in double in ascending token order, so results never depend on threads.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "lockstep/tensor/packed_offsets.h"

namespace lockstep::rl {

// ---- GRPO ----------------------------------------------------------------------------------
enum class StdKind { kPopulation, kSample };
struct GrpoOptions {
  // A_i = (r_i - mean) / (std + eps). eps only guards all-equal groups (std = 0, then A = 0
  // exactly); with 0/1 rewards a non-constant group has population std >= sqrt(G - 1) / G, so
  // eps changes an advantage by a relative eps / std < 1e-5 for G <= 64.
  double eps = 1e-6;
  StdKind std_kind = StdKind::kPopulation;  // population: divide by G; sample: by G - 1
};
// rewards: [groups * group_size], each group contiguous (G samples of one prompt). Returns one
// advantage per sample. Mean and std in double; throws std::invalid_argument when the size is
// not a multiple of group_size, group_size < 1 (< 2 for kSample), or a reward is not finite.
std::vector<float> grpo_advantages(std::span<const float> rewards, int64_t group_size,
                                   const GrpoOptions& options = {});

// ---- clipped policy loss --------------------------------------------------------------------
struct ClipOptions {
  double low = 0.2;    // ratio lower bound 1 - low  (0.8)
  double high = 0.28;  // ratio upper bound 1 + high (1.28): the asymmetric "clip-higher" range
};
template <class S>
struct ClippedTerm {
  S loss = 0;                 // max(-A r, -A clip(r, 1 - low, 1 + high))
  S dloss_dratio = 0;         // -A when the unclipped branch is active (ties included), else 0
  bool clipped_low = false;   // A < 0 and r < 1 - low: the clipped branch is active
  bool clipped_high = false;  // A > 0 and r > 1 + high
};
// The PPO surrogate of one token given its ratio r = exp(logp_new - logp_old). The bounds are
// computed in S as 1 - low and 1 + high; at a bound exactly, both branches are equal and the
// gradient flows.
template <class S>
ClippedTerm<S> clipped_surrogate(S ratio, S advantage, const ClipOptions& clip);

// ---- guards --------------------------------------------------------------------------------
// none: plain clipped GRPO. tis: truncated importance weights. triage: TRIAGE as its report
// defines it, which acts on an objective that already carries importance correction: TIS + the
// segment gate + the repair term. triage-gate: the gate alone (no TIS, no repair), an ablation.
// TIS and the gate compose because they act on different factors: TIS multiplies each token's
// loss by a bias-correcting weight; the gate reweights which tokens the response's loss is
// normalised over.
enum class Guard { kNone, kTis, kTriage, kTriageGate };
std::string_view guard_name(Guard guard);  // "none", "tis", "triage", "triage-gate"
// Throws std::invalid_argument listing the names ("tis+triage" is refused with a pointer to
// "triage", which includes TIS).
Guard parse_guard(std::string_view name);
constexpr bool guard_has_tis(Guard g) { return g == Guard::kTis || g == Guard::kTriage; }
constexpr bool guard_has_gate(Guard g) { return g == Guard::kTriage || g == Guard::kTriageGate; }
constexpr bool guard_has_repair(Guard g) { return g == Guard::kTriage; }

// TIS: w_t = clamp(exp(logp_old_t - logp_sampler_t), 0, cap), detached. Weights of masked tokens
// are 0. Stats are over valid tokens; the raw sums let several calls (minibatches) be merged.
struct TisStats {
  int64_t tokens = 0;      // valid tokens
  double weight_sum = 0;   // sum of applied (clipped) weights
  int64_t clipped = 0;     // tokens whose raw weight exceeded the cap
  double weight_mean = 0;  // weight_sum / tokens
  double weight_max = 0;   // max raw weight, before the cap
  double clip_frac = 0;    // clipped / tokens
};
template <class S>
std::vector<S> tis_weights(std::span<const S> logp_old, std::span<const S> logp_sampler,
                           std::span<const uint8_t> mask, double cap, TisStats* stats = nullptr);

// TRIAGE gate, with delta_t = logp_old_t - logp_sampler_t. Responses with A < 0 are split into
// `segment`-token segments by position from the response's first token (masked positions take
// part in the split, not in any mean or count). With mu the mean delta of a segment's valid
// tokens and k the number of its valid tokens with delta < tail_gap:
//   mean-gap weight = severe_weight if mu < severe_gap, mild_weight if severe_gap <= mu <
//                     mild_gap, else 1
//   tail weight     = 1 for k = 0, tail1_weight for k = 1, tail2_weight for k >= 2 (the report's
//                     1 - 0.9 min(k / 2, 1), written as its values so k >= 2 gives exactly 0.1)
//   segment weight  = min(mean-gap weight, tail weight), applied to the segment's valid tokens
//                     with delta < 0; all other tokens (and all tokens of responses with A >= 0)
//                     keep weight 1. Masked tokens get 0. The weights are detached.
// Thresholds compare strictly as written. The defaults are the TRIAGE report's.
struct GateOptions {
  int64_t segment = 64;
  double mild_gap = -0.5, severe_gap = -1.5, tail_gap = -6.0;  // nats
  double mild_weight = 0.3, severe_weight = 0.1;
  double tail1_weight = 0.55, tail2_weight = 0.1;
};
struct TriageGateStats {
  int64_t segments = 0;        // segments of negative-advantage responses with a valid token
  int64_t gated_segments = 0;  // of those, segment weight < 1
  int64_t tail_segments = 0;   // of those, k >= 1
  int64_t gated_tokens = 0;    // tokens whose weight is < 1
  int64_t weight_tokens = 0;   // valid tokens of negative-advantage responses
  double weight_sum = 0;       // sum of their weights
  double weight_mean = 0;      // weight_sum / weight_tokens (0 when there is none)
};
template <class S>
std::vector<S> triage_gate_weights(std::span<const int64_t> offsets, std::span<const S> delta,
                                   std::span<const uint8_t> mask, std::span<const S> advantages,
                                   TriageGateStats* stats = nullptr,
                                   const GateOptions& options = {});

// TRIAGE repair: for responses with A > 0, `segment`-token segments; with mu the mean of
// (logp_new - logp_sampler) over a segment's valid tokens and x = margin - mu, the segment's
// penalty is the one-sided pseudo-Huber
//   P = scale^2 * (sqrt(1 + (x / scale)^2) - 1)   for x > 0, else 0,
// quadratic for small shortfalls, linear beyond scale, so dP/dx = x / sqrt(1 + (x/scale)^2) is
// bounded by scale. The repair term is weight * (1 / R_valid) * sum over positive responses of
// the mean penalty over their segments (segments with a valid token). Its gradient
// -weight * dP/dx / (n_valid * S_i * R_valid) on each valid token of an active segment lowers the
// loss by raising logp_new there: the learner is pulled up towards the sampler where a rewarded
// response was sampled from a region the learner under-weights.
// Defaults (the report fixes the segment length, not these three): margin -0.5 matches the
// gate's mildest threshold, so a segment is repaired exactly when it would be gated in a negative
// response; scale 1 nat keeps the pull quadratic (gentle) for gaps within a nat of the margin and
// caps the per-segment gradient at weight * scale; weight 0.1 keeps the term an order of
// magnitude below the policy loss (|A| ~ 1 after GRPO normalisation), a guard rather than a
// second objective.
struct RepairOptions {
  bool enabled = true;
  int64_t segment = 128;
  double margin = -0.5;
  double scale = 1.0;
  double weight = 0.1;
};
struct RepairStats {
  int64_t segments = 0;         // segments of positive-advantage responses with a valid token
  int64_t active_segments = 0;  // of those, mu < margin
  double loss = 0;              // the repair term (already multiplied by weight)
};
// Adds the repair gradient into grad (size T) and returns the repair term. r_valid: the number of
// responses with at least one valid token (the policy loss's divisor).
template <class S>
S triage_repair(std::span<const int64_t> offsets, std::span<const S> logp_new,
                std::span<const S> logp_sampler, std::span<const uint8_t> mask,
                std::span<const S> advantages, const RepairOptions& options, int64_t r_valid,
                std::span<S> grad, RepairStats* stats = nullptr);

// Throws std::invalid_argument naming the field and the rule: segments >= 1, severe_gap <=
// mild_gap, finite thresholds, weights in [0, 1]; repair scale > 0, finite margin, weight >= 0.
void validate_gate_options(const GateOptions& o);
void validate_repair_options(const RepairOptions& o);

// Merging the statistics of several objective calls over disjoint responses (the minibatches of
// one batch): counts and sums add, means are recomputed from them, maxima take the larger.
// RepairStats::loss adds (divide by the number of calls for the mean term).
void accumulate(TisStats& into, const TisStats& add);
void accumulate(TriageGateStats& into, const TriageGateStats& add);
void accumulate(RepairStats& into, const RepairStats& add);

// ---- combined objective ----------------------------------------------------------------------
// kResponse: loss_i = sum_t m g w l / sum_t m g per response, averaged over the responses with a
//   valid token (TRIAGE's response-level normalisation; g = TRIAGE gate weight or 1, w = TIS
//   weight or 1: TIS corrects the loss, it is not renormalised). KL: per-response token mean,
//   averaged over responses.
// kToken: sum over all tokens of m g w l / sum over all tokens of m g (DAPO-style token mean);
//   KL: mean over all valid tokens.
enum class LossNormalization { kResponse, kToken };

struct ObjectiveConfig {
  Guard guard = Guard::kNone;
  ClipOptions clip;
  // k3 KL estimator to the reference policy, per token: exp(ref - new) - (ref - new) - 1 (>= 0,
  // unbiased for KL(new || ref) under samples from new). Added to the loss as kl_coef * KL.
  double kl_coef = 0.0;
  LossNormalization normalization = LossNormalization::kResponse;
  double tis_cap = 2.0;  // TIS weights are clamped to [0, tis_cap]
  GateOptions gate;      // used when the guard includes the TRIAGE gate
  RepairOptions repair;  // used when the guard includes the TRIAGE repair
};

template <class S>
struct ObjectiveInputsT {
  std::span<const int64_t> offsets;  // [R + 1], offsets[0] = 0, non-decreasing, back() = T
  std::span<const S> logp_new;       // [T] learner log-prob at the current parameters (the input
                                     // the gradient is taken with respect to)
  std::span<const S> logp_old;       // [T] learner log-prob at rollout time (detached)
  std::span<const S> logp_sampler;   // [T] sampler log-prob; may be empty for Guard::kNone
  std::span<const S> logp_ref;       // [T] reference policy; may be empty when kl_coef == 0
  std::span<const uint8_t> mask;     // [T] 1 = token counts, 0 = ignored (values unread)
  std::span<const S> advantages;     // [R] one per response
};
using ObjectiveInputs = ObjectiveInputsT<float>;

struct ObjectiveStats {
  double loss = 0, policy_loss = 0;
  double kl = std::numeric_limits<double>::quiet_NaN();  // NaN when logp_ref is empty
  double repair_loss = 0;
  int64_t responses = 0;  // responses with at least one valid token
  int64_t tokens = 0;     // valid tokens
  double ratio_mean = 0, ratio_min = 0, ratio_max = 0;
  double clip_frac_low = 0, clip_frac_high = 0;  // fractions of valid tokens
  TisStats tis;                                  // zeros unless the guard includes TIS
  TriageGateStats gate;                          // zeros unless the guard includes the gate
  RepairStats repair;                            // zeros unless the guard includes the repair
};

template <class S>
struct ObjectiveResultT {
  S loss = 0;
  std::vector<S> grad_logp_new;  // [T] d loss / d logp_new; 0 on masked tokens
  ObjectiveStats stats;
};
using ObjectiveResult = ObjectiveResultT<float>;

// loss = policy loss + kl_coef * KL + repair term (when the guard includes TRIAGE). Validates the
// inputs: sizes, offsets, mask values 0/1, finite values on valid tokens; throws
// std::invalid_argument naming the field, the index and the rule.
template <class S>
ObjectiveResultT<S> compute_objective(const ObjectiveInputsT<S>& in, const ObjectiveConfig& cfg);

}  // namespace lockstep::rl
