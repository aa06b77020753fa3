// Python bindings of the RL numerics other trainers can reuse: learner-sampler mismatch statistics
// (align_stats), TIS and TRIAGE weights, GRPO advantages and the combined objective. These are
// host functions over per-token arrays (docs/rl.md); inputs on a GPU are copied to the host.
#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "bindings.h"
#include "bridge.h"
#include "lockstep/diag/mismatch.h"
#include "lockstep/rl/objectives.h"

namespace lockstep::py {
namespace {

Tensor host(nb::handle h, const std::string& what) {
  Tensor t = tensor_from(h, what);
  if (t.dim() != 1) throw ArgError(fmt::format("{}: {} is not 1-D", what, t.describe()));
  return t.to(Device::cpu());
}

std::vector<float> floats(nb::handle h, const std::string& what) {
  if (h.is_none()) return {};
  const Tensor t = host(h, what);
  if (!dtype_info(t.dtype()).is_float)
    throw ArgError(fmt::format("{}: {} is not a floating array", what, t.describe()));
  return to_f32(t);
}

std::vector<uint8_t> mask_of(nb::handle h, const std::string& what) {
  const Tensor t = host(h, what);
  std::vector<uint8_t> out(size_t(t.numel()));
  switch (t.dtype()) {
    case DType::kBool:
    case DType::kU8:
    case DType::kI8: {
      auto b = t.bytes();
      for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(b[i]);
      break;
    }
    case DType::kI32: {
      auto v = t.data<int32_t>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = v[i] == 0 ? 0 : (v[i] == 1 ? 1 : 2);
      break;
    }
    case DType::kI64: {
      auto v = t.data<int64_t>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = v[i] == 0 ? 0 : (v[i] == 1 ? 1 : 2);
      break;
    }
    default: {
      const std::vector<float> f = to_f32(t);  // 0.0 / 1.0 masks
      for (size_t i = 0; i < out.size(); ++i) out[i] = f[i] == 0.0f ? 0 : (f[i] == 1.0f ? 1 : 2);
    }
  }
  return out;  // a value other than 0 / 1 stays 2, which the library refuses by name
}

std::vector<int64_t> offsets_of(nb::handle h, const std::string& what) {
  const Tensor t = host(h, what);
  if (t.dtype() == DType::kI64) {
    auto v = t.data<int64_t>();
    return {v.begin(), v.end()};
  }
  if (t.dtype() == DType::kI32) {
    auto v = t.data<int32_t>();
    return {v.begin(), v.end()};
  }
  throw ArgError(fmt::format("{}: offsets must be int32 or int64, not {}", what, t.describe()));
}

nb::object f32_array(const std::vector<float>& v) {
  return to_array(Tensor::from_vector<float>(v, {int64_t(v.size())}, DType::kF32));
}

nb::dict mismatch_py(nb::handle offsets, nb::handle learner, nb::handle sampler, nb::handle mask,
                     nb::handle advantages) {
  const std::vector<int64_t> off = offsets_of(offsets, "align_stats: offsets");
  const std::vector<float> l = floats(learner, "align_stats: learner_logp");
  const std::vector<float> s = floats(sampler, "align_stats: sampler_logp");
  if (l.size() != s.size())
    throw ArgError(fmt::format("align_stats: learner_logp has {} tokens, sampler_logp {}", l.size(),
                               s.size()));
  std::vector<float> delta(l.size());
  for (size_t i = 0; i < l.size(); ++i) delta[i] = l[i] - s[i];
  const diag::MismatchStats st =
      diag::mismatch_stats(off, delta, mask_of(mask, "align_stats: mask"),
                           floats(advantages, "align_stats: advantages"));
  Json row;
  diag::add_mismatch_metrics(st, row);
  nb::dict out;
  for (auto it = row.begin(); it != row.end(); ++it) {
    if (it->is_array()) {  // gap_hist: the histogram's counts
      nb::list counts;
      for (const Json& v : *it) counts.append(v.get<int64_t>());
      out[it.key().c_str()] = counts;
    } else if (it->is_number_integer()) {
      out[it.key().c_str()] = it->get<int64_t>();
    } else if (it->is_number()) {
      out[it.key().c_str()] = it->get<double>();
    } else {
      out[it.key().c_str()] = nb::float_(std::nan(""));  // null: no valid token
    }
  }
  return out;
}

nb::tuple tis_py(nb::handle old_lp, nb::handle sampler, nb::handle mask, double cap) {
  const std::vector<float> o = floats(old_lp, "tis_weights: logp_old");
  const std::vector<float> s = floats(sampler, "tis_weights: logp_sampler");
  const std::vector<uint8_t> m = mask_of(mask, "tis_weights: mask");
  if (o.size() != s.size() || o.size() != m.size())
    throw ArgError(fmt::format("tis_weights: logp_old has {} tokens, logp_sampler {}, mask {}",
                               o.size(), s.size(), m.size()));
  rl::TisStats st;
  const std::vector<float> w = rl::tis_weights<float>(o, s, m, cap, &st);
  nb::dict d;
  d["weight_mean"] = st.weight_mean;
  d["weight_max"] = st.weight_max;
  d["clip_frac"] = st.clip_frac;
  return nb::make_tuple(f32_array(w), d);
}

nb::tuple triage_py(nb::handle offsets, nb::handle old_lp, nb::handle sampler, nb::handle mask,
                    nb::handle advantages) {
  const std::vector<int64_t> off = offsets_of(offsets, "triage_weights: offsets");
  const std::vector<float> o = floats(old_lp, "triage_weights: logp_old");
  const std::vector<float> s = floats(sampler, "triage_weights: logp_sampler");
  const std::vector<uint8_t> m = mask_of(mask, "triage_weights: mask");
  const std::vector<float> a = floats(advantages, "triage_weights: advantages");
  if (o.size() != s.size() || o.size() != m.size())
    throw ArgError(fmt::format("triage_weights: logp_old has {} tokens, logp_sampler {}, mask {}",
                               o.size(), s.size(), m.size()));
  check_packed_offsets("triage_weights", off, o.size(), a.size());
  std::vector<float> delta(o.size());
  for (size_t i = 0; i < o.size(); ++i) delta[i] = o[i] - s[i];
  rl::TriageGateStats st;
  const std::vector<float> w = rl::triage_gate_weights<float>(off, delta, m, a, &st);
  nb::dict d;
  d["segments"] = st.segments;
  d["gated_segments"] = st.gated_segments;
  d["tail_segments"] = st.tail_segments;
  d["gated_tokens"] = st.gated_tokens;
  d["weight_mean"] = st.weight_mean;
  return nb::make_tuple(f32_array(w), d);
}

nb::tuple objective_py(nb::handle offsets, nb::handle logp_new, nb::handle logp_old,
                       nb::handle logp_sampler, nb::handle logp_ref, nb::handle mask,
                       nb::handle advantages, const std::string& guard, double clip_low,
                       double clip_high, double kl_coef, const std::string& normalization,
                       double tis_cap) {
  const std::vector<int64_t> off = offsets_of(offsets, "objective: offsets");
  const std::vector<float> ln = floats(logp_new, "objective: logp_new");
  const std::vector<float> lo = floats(logp_old, "objective: logp_old");
  const std::vector<float> ls = floats(logp_sampler, "objective: logp_sampler");
  const std::vector<float> lr = floats(logp_ref, "objective: logp_ref");
  const std::vector<uint8_t> m = mask_of(mask, "objective: mask");
  const std::vector<float> a = floats(advantages, "objective: advantages");
  rl::ObjectiveConfig cfg;
  cfg.guard = rl::parse_guard(guard);
  cfg.clip.low = clip_low;
  cfg.clip.high = clip_high;
  cfg.kl_coef = kl_coef;
  cfg.tis_cap = tis_cap;
  if (normalization == "token") {
    cfg.normalization = rl::LossNormalization::kToken;
  } else if (normalization != "response") {
    throw ArgError(fmt::format("objective: normalization must be 'response' or 'token', not '{}'",
                               normalization));
  }
  rl::ObjectiveInputs in{off, ln, lo, ls, lr, m, a};
  const rl::ObjectiveResult r = rl::compute_objective(in, cfg);
  nb::dict d;
  d["loss"] = r.stats.loss;
  d["policy_loss"] = r.stats.policy_loss;
  d["kl"] = r.stats.kl;
  d["repair_loss"] = r.stats.repair_loss;
  d["responses"] = r.stats.responses;
  d["tokens"] = r.stats.tokens;
  d["ratio_mean"] = r.stats.ratio_mean;
  d["clip_frac_low"] = r.stats.clip_frac_low;
  d["clip_frac_high"] = r.stats.clip_frac_high;
  d["tis_weight_mean"] = r.stats.tis.weight_mean;
  d["triage_gated_tokens"] = r.stats.gate.gated_tokens;
  return nb::make_tuple(double(r.loss), f32_array(r.grad_logp_new), d);
}

}  // namespace

void bind_rl(nb::module_& m) {
  m.def("mismatch_stats", &mismatch_py, nb::arg("offsets"), nb::arg("learner_logp"),
        nb::arg("sampler_logp"), nb::arg("mask"), nb::arg("advantages"));
  m.def("tis_weights", &tis_py, nb::arg("logp_old"), nb::arg("logp_sampler"), nb::arg("mask"),
        nb::arg("cap") = 2.0);
  m.def("triage_weights", &triage_py, nb::arg("offsets"), nb::arg("logp_old"),
        nb::arg("logp_sampler"), nb::arg("mask"), nb::arg("advantages"));
  m.def(
      "grpo_advantages",
      [](nb::handle rewards, int64_t group_size) {
        return f32_array(
            rl::grpo_advantages(floats(rewards, "grpo_advantages: rewards"), group_size));
      },
      nb::arg("rewards"), nb::arg("group_size"));
  m.def("objective", &objective_py, nb::arg("offsets"), nb::arg("logp_new"), nb::arg("logp_old"),
        nb::arg("logp_sampler").none(), nb::arg("logp_ref").none(), nb::arg("mask"),
        nb::arg("advantages"), nb::arg("guard") = "none", nb::arg("clip_low") = 0.2,
        nb::arg("clip_high") = 0.28, nb::arg("kl_coef") = 0.0,
        nb::arg("normalization") = "response", nb::arg("tis_cap") = 2.0,
        "(loss, d loss / d logp_new per token, stats) of GRPO with the guard (docs/rl.md)");
}

}  // namespace lockstep::py
