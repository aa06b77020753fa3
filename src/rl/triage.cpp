// TRIAGE (include/lockstep/rl/objectives.h, docs/rl.md): the detached segment gate on
// negative-advantage responses and the pseudo-Huber repair term on positive-advantage ones.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "lockstep/rl/objectives.h"

namespace lockstep::rl {

void validate_gate_options(const GateOptions& o) {
  const auto bad = [](const std::string& what) {
    throw std::invalid_argument("TRIAGE gate: " + what);
  };
  if (o.segment < 1) bad(fmt::format("segment length {} must be >= 1", o.segment));
  if (!std::isfinite(o.mild_gap) || !std::isfinite(o.severe_gap) || !std::isfinite(o.tail_gap))
    bad("the thresholds must be finite");
  if (!(o.severe_gap <= o.mild_gap))
    bad(fmt::format("severe gap {} must be <= mild gap {}", o.severe_gap, o.mild_gap));
  const std::pair<const char*, double> weights[] = {{"mild weight", o.mild_weight},
                                                    {"severe weight", o.severe_weight},
                                                    {"tail weight (k = 1)", o.tail1_weight},
                                                    {"tail weight (k >= 2)", o.tail2_weight}};
  for (const auto& [name, w] : weights)
    if (!(w >= 0 && w <= 1)) bad(fmt::format("{} {} must be in [0, 1]", name, w));
}

void validate_repair_options(const RepairOptions& o) {
  const auto bad = [](const std::string& what) {
    throw std::invalid_argument("TRIAGE repair: " + what);
  };
  if (o.segment < 1) bad(fmt::format("segment length {} must be >= 1", o.segment));
  if (!(o.scale > 0) || !std::isfinite(o.scale))
    bad(fmt::format("scale {} must be finite and > 0", o.scale));
  if (!std::isfinite(o.margin)) bad("margin must be finite");
  if (!(o.weight >= 0) || !std::isfinite(o.weight))
    bad(fmt::format("weight {} must be finite and >= 0", o.weight));
}

void accumulate(TriageGateStats& into, const TriageGateStats& add) {
  into.segments += add.segments;
  into.gated_segments += add.gated_segments;
  into.tail_segments += add.tail_segments;
  into.gated_tokens += add.gated_tokens;
  into.weight_tokens += add.weight_tokens;
  into.weight_sum += add.weight_sum;
  into.weight_mean = into.weight_tokens > 0 ? into.weight_sum / double(into.weight_tokens) : 0.0;
}

void accumulate(RepairStats& into, const RepairStats& add) {
  into.segments += add.segments;
  into.active_segments += add.active_segments;
  into.loss += add.loss;
}

template <class S>
std::vector<S> triage_gate_weights(std::span<const int64_t> offsets, std::span<const S> delta,
                                   std::span<const uint8_t> mask, std::span<const S> advantages,
                                   TriageGateStats* stats, const GateOptions& opt) {
  validate_gate_options(opt);
  if (delta.size() != mask.size())
    throw std::invalid_argument(fmt::format("triage_gate_weights: delta has {} tokens, mask {}",
                                            delta.size(), mask.size()));
  check_packed_offsets("triage_gate_weights", offsets, delta.size(), advantages.size());
  std::vector<S> w(delta.size());
  for (size_t t = 0; t < w.size(); ++t) w[t] = mask[t] ? S(1) : S(0);
  TriageGateStats st;
  double weight_sum = 0;
  int64_t weight_count = 0;
  for (size_t i = 0; i < advantages.size(); ++i) {
    if (!(advantages[i] < S(0))) continue;
    const int64_t end = offsets[i + 1];
    for (int64_t s = offsets[i]; s < end; s += opt.segment) {
      const int64_t e = std::min<int64_t>(s + opt.segment, end);
      int64_t n = 0, k = 0;
      double sum = 0;
      for (int64_t t = s; t < e; ++t) {
        if (!mask[size_t(t)]) continue;
        ++n;
        sum += double(delta[size_t(t)]);
        k += double(delta[size_t(t)]) < opt.tail_gap;
      }
      if (n == 0) continue;
      const double mu = sum / double(n);
      const double gap_w = mu < opt.severe_gap ? opt.severe_weight
                           : mu < opt.mild_gap ? opt.mild_weight
                                               : 1.0;
      // 1 - 0.9 min(k / 2, 1) written as its three values, so k >= 2 gives exactly the 0.1 of
      // the severe mean-gap weight (1 - 0.9 rounds to 0.09999999999999998 in double).
      const double tail_w = k == 0 ? 1.0 : k == 1 ? opt.tail1_weight : opt.tail2_weight;
      const double seg_w = std::min(gap_w, tail_w);
      ++st.segments;
      st.gated_segments += seg_w < 1.0;
      st.tail_segments += k >= 1;
      for (int64_t t = s; t < e; ++t) {
        if (!mask[size_t(t)]) continue;
        if (seg_w < 1.0 && delta[size_t(t)] < S(0)) {
          w[size_t(t)] = S(seg_w);
          ++st.gated_tokens;
        }
        weight_sum += double(w[size_t(t)]);
        ++weight_count;
      }
    }
  }
  st.weight_tokens = weight_count;
  st.weight_sum = weight_sum;
  st.weight_mean = weight_count > 0 ? weight_sum / double(weight_count) : 0.0;
  if (stats) *stats = st;
  return w;
}

template <class S>
S triage_repair(std::span<const int64_t> offsets, std::span<const S> logp_new,
                std::span<const S> logp_sampler, std::span<const uint8_t> mask,
                std::span<const S> advantages, const RepairOptions& opt, int64_t r_valid,
                std::span<S> grad, RepairStats* stats) {
  if (logp_new.size() != mask.size() || logp_sampler.size() != mask.size() ||
      grad.size() != mask.size())
    throw std::invalid_argument(fmt::format(
        "triage_repair: logp_new ({}), logp_sampler ({}), grad ({}) and mask ({}) must have T "
        "entries each",
        logp_new.size(), logp_sampler.size(), grad.size(), mask.size()));
  check_packed_offsets("triage_repair", offsets, mask.size(), advantages.size());
  validate_repair_options(opt);
  RepairStats st;
  double total = 0;
  if (opt.enabled && opt.weight != 0 && r_valid > 0) {
    struct Segment {
      int64_t begin, end, n;
      double dp_dx;  // 0 when inactive
    };
    std::vector<Segment> segs;
    for (size_t i = 0; i < advantages.size(); ++i) {
      if (!(advantages[i] > S(0))) continue;
      segs.clear();
      double penalty_sum = 0;
      const int64_t end = offsets[i + 1];
      for (int64_t s = offsets[i]; s < end; s += opt.segment) {
        const int64_t e = std::min<int64_t>(s + opt.segment, end);
        int64_t n = 0;
        double sum = 0;
        for (int64_t t = s; t < e; ++t)
          if (mask[size_t(t)]) {
            ++n;
            sum += double(logp_new[size_t(t)] - logp_sampler[size_t(t)]);
          }
        if (n == 0) continue;
        const double x = opt.margin - sum / double(n);
        Segment seg{s, e, n, 0.0};
        if (x > 0) {
          const double u = x / opt.scale;
          const double root = std::sqrt(1.0 + u * u);
          penalty_sum += opt.scale * opt.scale * (root - 1.0);
          seg.dp_dx = x / root;
          ++st.active_segments;
        }
        ++st.segments;
        segs.push_back(seg);
      }
      if (segs.empty()) continue;
      const double per_response = opt.weight / (double(segs.size()) * double(r_valid));
      total += per_response * penalty_sum;
      for (const Segment& seg : segs) {
        if (seg.dp_dx == 0) continue;
        // d mu / d logp_new_t = 1 / n, d x / d mu = -1.
        const double g = -per_response * seg.dp_dx / double(seg.n);
        for (int64_t t = seg.begin; t < seg.end; ++t)
          if (mask[size_t(t)]) grad[size_t(t)] = S(double(grad[size_t(t)]) + g);
      }
    }
  }
  st.loss = total;
  if (stats) *stats = st;
  return S(total);
}

template std::vector<float> triage_gate_weights<float>(std::span<const int64_t>,
                                                       std::span<const float>,
                                                       std::span<const uint8_t>,
                                                       std::span<const float>, TriageGateStats*,
                                                       const GateOptions&);
template std::vector<double> triage_gate_weights<double>(std::span<const int64_t>,
                                                         std::span<const double>,
                                                         std::span<const uint8_t>,
                                                         std::span<const double>, TriageGateStats*,
                                                         const GateOptions&);
template float triage_repair<float>(std::span<const int64_t>, std::span<const float>,
                                    std::span<const float>, std::span<const uint8_t>,
                                    std::span<const float>, const RepairOptions&, int64_t,
                                    std::span<float>, RepairStats*);
template double triage_repair<double>(std::span<const int64_t>, std::span<const double>,
                                      std::span<const double>, std::span<const uint8_t>,
                                      std::span<const double>, const RepairOptions&, int64_t,
                                      std::span<double>, RepairStats*);

}  // namespace lockstep::rl
