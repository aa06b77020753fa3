// GRPO advantages, the clipped surrogate, TIS weights and the combined objective
// (include/lockstep/rl/objectives.h); TRIAGE's gate and repair are in triage.cpp.
#include "lockstep/rl/objectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "scalar.h"

namespace lockstep::rl {

std::vector<float> grpo_advantages(std::span<const float> rewards, int64_t group_size,
                                   const GrpoOptions& opt) {
  const int64_t min_group = opt.std_kind == StdKind::kSample ? 2 : 1;
  if (group_size < min_group || rewards.size() % size_t(group_size) != 0)
    throw std::invalid_argument(fmt::format(
        "grpo_advantages: {} rewards do not split into groups of {} (need group_size >= {} and "
        "a multiple of it)",
        rewards.size(), group_size, min_group));
  if (!(opt.eps >= 0)) throw std::invalid_argument("grpo_advantages: eps must be >= 0");
  std::vector<float> adv(rewards.size());
  const size_t g = size_t(group_size);
  for (size_t start = 0; start < rewards.size(); start += g) {
    double sum = 0;
    for (size_t j = 0; j < g; ++j) {
      if (!std::isfinite(rewards[start + j]))
        throw std::invalid_argument(fmt::format("grpo_advantages: rewards[{}] = {} is not finite",
                                                start + j, rewards[start + j]));
      sum += rewards[start + j];
    }
    const double mean = sum / double(g);
    double ss = 0;
    for (size_t j = 0; j < g; ++j) {
      const double d = rewards[start + j] - mean;
      ss += d * d;
    }
    const double var = ss / double(opt.std_kind == StdKind::kSample ? g - 1 : g);
    const double denom = std::sqrt(var) + opt.eps;
    for (size_t j = 0; j < g; ++j) {
      const double d = rewards[start + j] - mean;
      adv[start + j] = d == 0 ? 0.0f : float(d / denom);
    }
  }
  return adv;
}

std::string_view guard_name(Guard guard) {
  switch (guard) {
    case Guard::kNone:
      return "none";
    case Guard::kTis:
      return "tis";
    case Guard::kTriage:
      return "triage";
    case Guard::kTriageGate:
      return "triage-gate";
  }
  return "?";
}

Guard parse_guard(std::string_view name) {
  for (Guard g : {Guard::kNone, Guard::kTis, Guard::kTriage, Guard::kTriageGate})
    if (guard_name(g) == name) return g;
  if (name == "tis+triage")
    throw std::invalid_argument(
        "unknown guard 'tis+triage': guard 'triage' is TIS + gate + repair (the TRIAGE report's "
        "method); 'triage-gate' is the gate alone");
  throw std::invalid_argument(
      fmt::format("unknown guard '{}' (known: none, tis, triage, triage-gate)", name));
}

template <class S>
ClippedTerm<S> clipped_surrogate(S ratio, S adv, const ClipOptions& clip) {
  const S lo = S(1) - S(clip.low), hi = S(1) + S(clip.high);
  const S clipped = std::min(std::max(ratio, lo), hi);
  const S unclipped_loss = -adv * ratio, clipped_loss = -adv * clipped;
  ClippedTerm<S> out;
  if (unclipped_loss >= clipped_loss) {
    out.loss = unclipped_loss;
    out.dloss_dratio = -adv;
  } else {
    out.loss = clipped_loss;
    out.dloss_dratio = 0;
    out.clipped_low = adv < S(0);
    out.clipped_high = adv > S(0);
  }
  return out;
}

template <class S>
std::vector<S> tis_weights(std::span<const S> logp_old, std::span<const S> logp_sampler,
                           std::span<const uint8_t> mask, double cap, TisStats* stats) {
  if (logp_old.size() != mask.size() || logp_sampler.size() != mask.size())
    throw std::invalid_argument(fmt::format(
        "tis_weights: logp_old ({}), logp_sampler ({}) and mask ({}) must have T entries each",
        logp_old.size(), logp_sampler.size(), mask.size()));
  if (!(cap > 0)) throw std::invalid_argument(fmt::format("tis_weights: cap {} must be > 0", cap));
  std::vector<S> w(mask.size(), S(0));
  TisStats st;
  double sum = 0;
  int64_t n = 0, clipped = 0;
  for (size_t t = 0; t < mask.size(); ++t) {
    if (!mask[t]) continue;
    const S raw = detail::exp_s(S(logp_old[t] - logp_sampler[t]));
    // clamp to [0, cap]; exp is >= 0, the lower bound only matters for a NaN-free underflow.
    const S applied = std::min(std::max(raw, S(0)), S(cap));
    w[t] = applied;
    sum += double(applied);
    st.weight_max = n == 0 ? double(raw) : std::max(st.weight_max, double(raw));
    clipped += double(raw) > cap;
    ++n;
  }
  st.tokens = n;
  st.weight_sum = sum;
  st.clipped = clipped;
  if (n > 0) {
    st.weight_mean = sum / double(n);
    st.clip_frac = double(clipped) / double(n);
  }
  if (stats) *stats = st;
  return w;
}

void accumulate(TisStats& into, const TisStats& add) {
  if (add.tokens == 0) return;
  into.weight_max = into.tokens == 0 ? add.weight_max : std::max(into.weight_max, add.weight_max);
  into.tokens += add.tokens;
  into.weight_sum += add.weight_sum;
  into.clipped += add.clipped;
  into.weight_mean = into.weight_sum / double(into.tokens);
  into.clip_frac = double(into.clipped) / double(into.tokens);
}

namespace {

template <class S>
void check_inputs(const ObjectiveInputsT<S>& in, const ObjectiveConfig& cfg) {
  const size_t T = in.logp_new.size(), R = in.advantages.size();
  const auto bad = [](const std::string& what) {
    throw std::invalid_argument("compute_objective: " + what);
  };
  check_packed_offsets("compute_objective", in.offsets, T, R);
  if (in.logp_old.size() != T || in.mask.size() != T)
    bad(fmt::format("logp_new has {} tokens but logp_old has {} and mask {}", T, in.logp_old.size(),
                    in.mask.size()));
  if (in.logp_sampler.empty() && cfg.guard != Guard::kNone)
    bad(fmt::format("guard '{}' needs logp_sampler", guard_name(cfg.guard)));
  if (!in.logp_sampler.empty() && in.logp_sampler.size() != T)
    bad(fmt::format("logp_sampler has {} tokens, expected T = {}", in.logp_sampler.size(), T));
  if (in.logp_ref.empty() && cfg.kl_coef != 0)
    bad(fmt::format("kl_coef = {} needs logp_ref", cfg.kl_coef));
  if (!in.logp_ref.empty() && in.logp_ref.size() != T)
    bad(fmt::format("logp_ref has {} tokens, expected T = {}", in.logp_ref.size(), T));
  if (!(cfg.clip.low >= 0 && cfg.clip.low < 1 && cfg.clip.high >= 0))
    bad(fmt::format("clip range [1 - {}, 1 + {}] must have 0 <= low < 1 and high >= 0",
                    cfg.clip.low, cfg.clip.high));
  if (!(cfg.tis_cap > 0)) bad(fmt::format("tis_cap = {} must be > 0", cfg.tis_cap));
  validate_gate_options(cfg.gate);
  validate_repair_options(cfg.repair);
  for (size_t i = 0; i < R; ++i)
    if (!std::isfinite(double(in.advantages[i])))
      bad(fmt::format("advantages[{}] = {} is not finite", i, double(in.advantages[i])));
  const auto finite = [&](std::span<const S> v, const char* name, size_t t) {
    if (!v.empty() && !std::isfinite(double(v[t])))
      bad(fmt::format("{}[{}] = {} is not finite on a valid token", name, t, double(v[t])));
  };
  for (size_t t = 0; t < T; ++t) {
    if (in.mask[t] > 1) bad(fmt::format("mask[{}] = {} must be 0 or 1", t, int(in.mask[t])));
    if (!in.mask[t]) continue;
    finite(in.logp_new, "logp_new", t);
    finite(in.logp_old, "logp_old", t);
    finite(in.logp_sampler, "logp_sampler", t);
    finite(in.logp_ref, "logp_ref", t);
  }
}

}  // namespace

template <class S>
ObjectiveResultT<S> compute_objective(const ObjectiveInputsT<S>& in, const ObjectiveConfig& cfg) {
  check_inputs(in, cfg);
  const size_t T = in.logp_new.size(), R = in.advantages.size();
  ObjectiveResultT<S> out;
  out.grad_logp_new.assign(T, S(0));
  ObjectiveStats& st = out.stats;
  std::vector<double> grad(T, 0.0);

  // Valid tokens per response, and the responses that count.
  std::vector<int64_t> n_valid(R, 0);
  for (size_t i = 0; i < R; ++i)
    for (int64_t t = in.offsets[i]; t < in.offsets[i + 1]; ++t) n_valid[i] += in.mask[size_t(t)];
  for (size_t i = 0; i < R; ++i) {
    st.tokens += n_valid[i];
    st.responses += n_valid[i] > 0;
  }

  // Detached factors: TIS weight w and TRIAGE gate g (masked tokens: 0).
  std::vector<S> w(T), g(T);
  for (size_t t = 0; t < T; ++t) w[t] = g[t] = in.mask[t] ? S(1) : S(0);
  if (guard_has_tis(cfg.guard))
    w = tis_weights<S>(in.logp_old, in.logp_sampler, in.mask, cfg.tis_cap, &st.tis);
  if (guard_has_gate(cfg.guard)) {
    std::vector<S> delta(T, S(0));
    for (size_t t = 0; t < T; ++t)
      if (in.mask[t]) delta[t] = in.logp_old[t] - in.logp_sampler[t];
    g = triage_gate_weights<S>(in.offsets, delta, in.mask, in.advantages, &st.gate, cfg.gate);
  }

  // Per-token surrogate l and d l / d logp_new.
  std::vector<double> l(T, 0.0), dl(T, 0.0);
  int64_t clip_low = 0, clip_high = 0;
  double ratio_sum = 0;
  bool first = true;
  for (size_t i = 0; i < R; ++i)
    for (int64_t tt = in.offsets[i]; tt < in.offsets[i + 1]; ++tt) {
      const size_t t = size_t(tt);
      if (!in.mask[t]) continue;
      const S ratio = detail::exp_s(S(in.logp_new[t] - in.logp_old[t]));
      const ClippedTerm<S> c = clipped_surrogate<S>(ratio, in.advantages[i], cfg.clip);
      l[t] = double(c.loss);
      dl[t] = double(c.dloss_dratio) * double(ratio);  // d r / d logp_new = r
      clip_low += c.clipped_low;
      clip_high += c.clipped_high;
      ratio_sum += double(ratio);
      st.ratio_min = first ? double(ratio) : std::min(st.ratio_min, double(ratio));
      st.ratio_max = first ? double(ratio) : std::max(st.ratio_max, double(ratio));
      first = false;
    }
  if (st.tokens > 0) {
    st.ratio_mean = ratio_sum / double(st.tokens);
    st.clip_frac_low = double(clip_low) / double(st.tokens);
    st.clip_frac_high = double(clip_high) / double(st.tokens);
  }

  // Policy loss under the chosen normalisation.
  const double r_valid = double(st.responses);
  if (cfg.normalization == LossNormalization::kResponse) {
    for (size_t i = 0; i < R; ++i) {
      if (n_valid[i] == 0) continue;
      double num = 0, den = 0;
      for (int64_t t = in.offsets[i]; t < in.offsets[i + 1]; ++t) {
        num += double(g[size_t(t)]) * double(w[size_t(t)]) * l[size_t(t)];
        den += double(g[size_t(t)]);
      }
      if (den == 0) continue;
      st.policy_loss += num / den / r_valid;
      for (int64_t t = in.offsets[i]; t < in.offsets[i + 1]; ++t)
        grad[size_t(t)] +=
            double(g[size_t(t)]) * double(w[size_t(t)]) * dl[size_t(t)] / (den * r_valid);
    }
  } else {
    double num = 0, den = 0;
    for (size_t t = 0; t < T; ++t) {
      num += double(g[t]) * double(w[t]) * l[t];
      den += double(g[t]);
    }
    if (den > 0) {
      st.policy_loss = num / den;
      for (size_t t = 0; t < T; ++t) grad[t] += double(g[t]) * double(w[t]) * dl[t] / den;
    }
  }

  // k3 KL to the reference, always computed when logp_ref is given.
  if (!in.logp_ref.empty()) {
    st.kl = 0;
    const double n_all = double(st.tokens);
    for (size_t i = 0; i < R; ++i) {
      if (n_valid[i] == 0) continue;
      const double scale = cfg.normalization == LossNormalization::kResponse
                               ? 1.0 / (double(n_valid[i]) * r_valid)
                               : 1.0 / n_all;
      for (int64_t tt = in.offsets[i]; tt < in.offsets[i + 1]; ++tt) {
        const size_t t = size_t(tt);
        if (!in.mask[t]) continue;
        const S d = in.logp_ref[t] - in.logp_new[t];
        const double e = double(detail::exp_s(d));
        st.kl += (e - double(d) - 1.0) * scale;
        if (cfg.kl_coef != 0) grad[t] += cfg.kl_coef * (1.0 - e) * scale;
      }
    }
  }

  for (size_t t = 0; t < T; ++t) out.grad_logp_new[t] = S(grad[t]);
  if (guard_has_repair(cfg.guard))
    triage_repair<S>(in.offsets, in.logp_new, in.logp_sampler, in.mask, in.advantages, cfg.repair,
                     st.responses, out.grad_logp_new, &st.repair);
  st.repair_loss = st.repair.loss;
  st.loss = st.policy_loss + (in.logp_ref.empty() ? 0.0 : cfg.kl_coef * st.kl) + st.repair_loss;
  out.loss = S(st.loss);
  return out;
}

#define LOCKSTEP_RL_INSTANTIATE(S)                                                     \
  template ClippedTerm<S> clipped_surrogate<S>(S, S, const ClipOptions&);              \
  template std::vector<S> tis_weights<S>(std::span<const S>, std::span<const S>,       \
                                         std::span<const uint8_t>, double, TisStats*); \
  template ObjectiveResultT<S> compute_objective<S>(const ObjectiveInputsT<S>&,        \
                                                    const ObjectiveConfig&);
LOCKSTEP_RL_INSTANTIATE(float)
LOCKSTEP_RL_INSTANTIATE(double)
#undef LOCKSTEP_RL_INSTANTIATE

}  // namespace lockstep::rl
