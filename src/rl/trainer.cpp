// The trainer's step loop (include/lockstep/rl/trainer.h): rollout at policy version v, learner
// log-prob recomputation, GRPO objective with the run's guard, update, export of the new version
// to the sampler, held-out evaluation, one metrics row per step and periodic checkpoints.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>

#include "lockstep/diag/mismatch.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/ops/tensor_ops.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/rl/rollout.h"
#include "stopwatch.h"
#include "trainer_impl.h"

namespace lockstep::rl {
namespace {

using detail::Clock;
using detail::seconds_since;

double mean_of(std::span<const float> v) {
  double s = 0.0;
  for (float x : v) s += double(x);
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : s / double(v.size());
}

// Stats summed over minibatches, reported as means (ratio extremes as min / max); the guard
// statistics are merged (objectives.h accumulate), so they are what the objective applied over
// the whole batch.
struct UpdateStats {
  int n = 0;
  double loss = 0, policy_loss = 0, kl = 0, ratio_mean = 0;
  double ratio_min = std::numeric_limits<double>::infinity();
  double ratio_max = -std::numeric_limits<double>::infinity();
  double clip_low = 0, clip_high = 0, grad_norm = 0;
  int64_t clipped = 0, skipped = 0;
  TisStats tis;
  TriageGateStats gate;
  RepairStats repair;

  void add(const ObjectiveStats& s, const model::StepStats& st) {
    ++n;
    loss += s.loss;
    policy_loss += s.policy_loss;
    kl += s.kl;
    ratio_mean += s.ratio_mean;
    ratio_min = std::min(ratio_min, s.ratio_min);
    ratio_max = std::max(ratio_max, s.ratio_max);
    clip_low += s.clip_frac_low;
    clip_high += s.clip_frac_high;
    grad_norm += st.grad_norm;
    clipped += st.clipped ? 1 : 0;
    skipped += st.skipped ? 1 : 0;
    accumulate(tis, s.tis);
    accumulate(gate, s.gate);
    accumulate(repair, s.repair);
  }
};

// A copy of p that owns every tensor the export may share with the learner's F32 masters (the
// F32 dense tensors: embedding and norms; F32 operands), so the next update, which writes the
// masters in place, cannot change a version a background rollout is sampling with. The other
// tensors (quantized or BF16 operands) are the converter's own and stay shared.
model::PolicyVersion owned_policy(const model::PolicyVersion& p) {
  model::PolicyVersion c = p;
  for (auto& [name, t] : c.dense)
    if (t.dtype() == DType::kF32) t = t.clone();
  for (auto& [name, op] : c.operands)
    if (op.t.defined() && op.t.dtype() == DType::kF32) op.t = op.t.clone();
  return c;
}

}  // namespace

const Recipe& Trainer::Impl::sampler_recipe() const {
  return opt.sampler_recipe ? *opt.sampler_recipe : recipe;
}

double Trainer::Impl::sync_policy() {
  // The policy version is the number of completed RL steps: one new version per step, however
  // many optimizer steps (minibatches) it took.
  const int64_t v = step;
  const Recipe& srec = sampler_recipe();
  const Clock::time_point t0 = Clock::now();
  // The amax of each weight (per expert where the recipe scales experts apart) comes from the
  // AdamW step that wrote it, so the converter reads each master once; a weight without one (the
  // first version, a resumed run) is read for it. The bytes are the same either way (the export
  // copies the amax values, it keeps no reference to the learner's buffers).
  const model::WeightAmax amax =
      model::usable_weight_amax(learner().weight_amax(), learner().weights().config, srec);
  model::PolicyVersion p =
      model::export_policy(learner().weights(), srec, v, {}, amax.empty() ? nullptr : &amax);
  // The overlapped rollout samples with this version while the next update runs.
  if (opt.async_rollout) policy = owned_policy(p);
  sampler.load_policy(std::move(p), v, srec.name);
  return seconds_since(t0);
}

double Trainer::Impl::sync_bf16() {
  const int64_t v = step;
  const Clock::time_point t0 = Clock::now();
  model::ExportOptions eo;
  eo.force_bf16 = true;
  model::PolicyVersion b = model::export_policy(learner().weights(), sampler_recipe(), v, eo);
  const std::string bname = b.recipe.name;
  bf16_sampler.load_policy(std::move(b), v, bname);
  return seconds_since(t0);
}

namespace {

void add_eval(diag::MetricsRow& row, const EvalResult& e) {
  row["eval_accuracy"] = e.accuracy;
  row["eval_correct"] = e.correct;
  row["eval_prompts"] = e.prompts;
  row["eval_truncated"] = e.truncated;
  row["eval_response_len_mean"] = e.response_len_mean;
}

// The update's statistics; the guard keys are those the objective applied, null for a part of
// TRIAGE / TIS the run's guard does not include (docs/rl.md lists the keys).
void add_update_stats(diag::MetricsRow& row, const UpdateStats& us, Guard guard) {
  row["loss"] = us.loss / us.n;
  row["policy_loss"] = us.policy_loss / us.n;
  row["kl"] = us.kl / us.n;
  row["repair_loss"] = us.repair.loss / us.n;
  row["ratio_mean"] = us.ratio_mean / us.n;
  row["ratio_min"] = us.ratio_min;
  row["ratio_max"] = us.ratio_max;
  row["clip_frac_low"] = us.clip_low / us.n;
  row["clip_frac_high"] = us.clip_high / us.n;
  row["grad_norm"] = us.grad_norm / us.n;
  row["grad_clipped"] = us.clipped;
  row["update_skipped"] = us.skipped;
  const bool tis = guard_has_tis(guard), gate = guard_has_gate(guard),
             repair = guard_has_repair(guard);
  const auto val = [](bool on, auto v) { return on ? diag::MetricsRow(v) : diag::MetricsRow(); };
  row["tis_weight_mean"] = val(tis, us.tis.weight_mean);
  row["tis_weight_max"] = val(tis, us.tis.weight_max);
  row["tis_clip_frac"] = val(tis, us.tis.clip_frac);
  row["tis_clipped_tokens"] = val(tis, us.tis.clipped);
  row["triage_gate_segments"] = val(gate, us.gate.segments);
  row["triage_gated_segments"] = val(gate, us.gate.gated_segments);
  row["triage_tail_segments"] = val(gate, us.gate.tail_segments);
  row["triage_gated_tokens"] = val(gate, us.gate.gated_tokens);
  row["triage_gate_weight_mean"] = val(gate, us.gate.weight_mean);
  row["triage_repair_segments"] = val(repair, us.repair.segments);
  row["triage_repair_active_segments"] = val(repair, us.repair.active_segments);
  row["triage_repair_loss"] = val(repair, us.repair.loss / us.n);
}

}  // namespace

TrainResult Trainer::run(const TrainCallbacks& cb) {
  Impl& m = *impl_;
  const TrainOptions& o = m.opt;
  m.started = Clock::now();
  TrainResult res;
  ObjectiveConfig ocfg;
  ocfg.guard = m.guard;
  ocfg.kl_coef = o.kl_coef;
  ocfg.tis_cap = o.tis_cap;
  ocfg.gate = o.gate;
  ocfg.repair = o.repair;
  m.learner().set_weight_amax_domains(
      model::weight_amax_domain_counts(m.learner().weights().config, m.sampler_recipe()));
  const RewardKind reward_kind = parse_reward_kind(o.reward);
  const Split eval_split = parse_split(o.eval_split);
  {
    model::SamplerConfig sc = m.sampler.config();
    sc.kv = o.kv_cache == "fp8" ? model::KvDtype::kFp8E4M3 : model::KvDtype::kBf16;
    sc.device = o.sampler_device.value_or(o.device);
    sc.mode = o.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
    m.sampler.set_config(sc);
    model::SamplerConfig bc = m.bf16_sampler.config();
    bc.device = sc.device;
    bc.mode = sc.mode;
    m.bf16_sampler.set_config(bc);
    // The background rollout's sampler runs its decode steps call by call: a CUDA graph capture
    // on its stream fails as soon as another thread queues work on the legacy default stream of
    // the same device (the learner does), since CUDA refuses the implicit dependency on a
    // capturing stream. Call by call gives the same bits (model/sampler.h, cuda_graphs).
    model::SamplerConfig rc = m.rollout_sampler.config();
    rc.kv = sc.kv;
    rc.device = sc.device;
    rc.mode = sc.mode;
    rc.cuda_graphs = false;
    m.rollout_sampler.set_config(rc);
  }
  // The rollout options of the batch of step s + 1 (s: the steps completed before it): its
  // Philox seed and prompts are the step's, whichever policy version samples it.
  auto rollout_options = [&](int64_t s) {
    RolloutOptions ro;
    ro.prompts = o.prompts;
    ro.group = o.group;
    ro.max_new = o.max_new;
    ro.temperature = o.temperature;
    ro.sample_seed = rollout_sample_seed(o.seed, s);
    ro.format_bonus = o.format_bonus;
    ro.reward = reward_kind;
    ro.max_batch = o.sampler_batch;
    ro.record_routing = o.routing_replay;
    return ro;
  };
  // Whether the bf16 reading of a version differs from the sampler's: then the first and last
  // evaluations also run through the bf16 export (eval_accuracy_bf16), so a rise can be told
  // apart from recovering what quantizing the warm start lost.
  const bool bf16_differs =
      o.kv_cache != "bf16" ||
      to_json(m.sampler_recipe()) != to_json(builtin_recipe_or_throw("bf16", "trainer").recipe);

  auto emit = [&](diag::MetricsRow& row) {
    row["elapsed_s"] = m.elapsed_s();
    m.metrics->append(row);
    if (cb.on_row) cb.on_row(row);
  };
  // Evaluates into row; with_bf16 also through the bf16 export (into *bf16 when given).
  auto eval = [&](diag::MetricsRow& row, bool with_bf16, std::optional<double>* bf16) {
    const Clock::time_point t0 = Clock::now();
    const EvalResult e = evaluate_greedy(m.sampler, *m.task, o.seed, o.difficulty, o.eval_prompts,
                                         o.max_new, o.sampler_batch, eval_split);
    add_eval(row, e);
    if (with_bf16) {
      // The bf16 reading is exported only for the evaluations that read it.
      if (bf16_differs) row["time_sync_bf16_s"] = m.sync_bf16();
      const double acc_bf16 =
          bf16_differs ? evaluate_greedy(m.bf16_sampler, *m.task, o.seed, o.difficulty,
                                         o.eval_prompts, o.max_new, o.sampler_batch, eval_split)
                             .accuracy
                       : e.accuracy;
      row["eval_accuracy_bf16"] = acc_bf16;
      if (bf16) *bf16 = acc_bf16;
    }
    row["time_eval_s"] = seconds_since(t0);
    return e.accuracy;
  };

  // The sampler gets the checkpoint's version; row 0 (the initial evaluation) unless it exists.
  {
    const double t_sync = m.sync_policy();
    const diag::MetricsFile mf = diag::read_metrics(m.metrics->path());
    for (const diag::MetricsRow& r : mf.rows)
      if (r.value("step", int64_t(-1)) == 0) {
        if (r.contains("eval_accuracy") && r["eval_accuracy"].is_number())
          res.start_eval_accuracy = r["eval_accuracy"].get<double>();
        if (r.contains("eval_accuracy_bf16") && r["eval_accuracy_bf16"].is_number())
          res.start_eval_accuracy_bf16 = r["eval_accuracy_bf16"].get<double>();
      }
    if (m.step == 0 && mf.rows.empty()) {
      diag::MetricsRow row;
      row["step"] = 0;
      row["policy_version"] = m.step;
      row["time_sync_s"] = t_sync;
      if (o.eval_prompts > 0)
        res.start_eval_accuracy = eval(row, /*with_bf16=*/true, &res.start_eval_accuracy_bf16);
      emit(row);
    }
  }

  const int64_t P = o.prompts, G = o.group, K = o.minibatches;
  if (m.pending && m.pending->step() != m.step + 1)
    throw std::logic_error(fmt::format("trainer: a pending rollout for step {} at step {}",
                                       m.pending->step(), m.step));
  const Device sampler_device = o.sampler_device.value_or(o.device);
  // On an exception the background rollout is joined (its batch and any error of its own
  // dropped): run() never leaves a thread sampling behind it.
  struct JoinPendingOnThrow {
    Impl& m;
    int exceptions = std::uncaught_exceptions();
    ~JoinPendingOnThrow() {
      if (std::uncaught_exceptions() > exceptions) m.pending.reset();
    }
  } join_on_throw{m};
  while (m.step < o.steps) {
    const int64_t k = m.step + 1;  // the step this iteration completes
    const Clock::time_point t_step = Clock::now();
    diag::MetricsRow row;
    row["step"] = k;

    // 1. The step's batch: sampled now by the sampler at the current version k - 1, or
    // (--async-rollout 1, k > 1) the one a background thread sampled during step k - 1 with the
    // version that step started from, k - 2.
    Clock::time_point t0 = Clock::now();
    RolloutBatch rb;
    int64_t rollout_version = m.step;
    double t_rollout = 0.0, t_rollout_gen = 0.0;
    if (m.pending) {
      rb = m.pending->take();  // rethrows what the sampling thread threw
      rollout_version = m.pending->policy_version();
      t_rollout = m.pending->waited_s();
      t_rollout_gen = m.pending->generation_s();
      m.pending.reset();
    } else {
      rb = rollout(m.sampler, *m.task, o.seed, o.difficulty, uint64_t(m.step * P),
                   rollout_options(m.step));
      t_rollout = t_rollout_gen = seconds_since(t0);
    }
    // The batch of step k + 1, sampled on a background thread with version k - 1 (the sampler's
    // now; `sampler` moves on to version k at the end of this step) while the learner trains.
    double t_launch = 0.0;
    if (o.async_rollout && k < o.steps) {
      t0 = Clock::now();
      m.rollout_sampler.load_policy(*m.policy, m.step, m.sampler_recipe().name);
      const RolloutOptions ro = rollout_options(k);
      const uint64_t first = uint64_t(k * P);
      m.pending = std::make_unique<detail::PendingRollout>(
          k + 1, m.step, m.rollout_thread, sampler_device, [&m, &o, ro, first] {
            return rollout(m.rollout_sampler, *m.task, o.seed, o.difficulty, first, ro);
          });
      t_launch = seconds_since(t0);
    }
    const std::vector<float> adv = grpo_advantages(rb.rewards, G);

    // 2. Learner log-probs of the sampled tokens (old, detached), entropy, reference log-probs:
    // one forward per gradient slot, on the rank that owns the slot.
    t0 = Clock::now();
    std::vector<SequenceView> seqs;
    for (size_t i = 0; i < rb.samples.size(); ++i)
      seqs.push_back({rb.examples[i / size_t(G)].prompt, rb.samples[i].tokens});
    const PackedSequences all = pack_sequences(seqs);
    const int64_t n = int64_t(all.tokens.size()), T = int64_t(all.rows.size());
    // Routing replay: the learner, and the reference of the KL term, use the sampler's experts;
    // the learner's own routing gives the residual comparison (logp_no_replay), so metrics.jsonl
    // shows the gap with and without replay.
    const bool replay = o.routing_replay;
    detail::StepBatch batch;
    batch.seqs = seqs;
    batch.samples = rb.samples;
    batch.all = &all;
    batch.routing_replay = replay;
    batch.temperature = o.temperature;
    batch.mode = m.mode();
    const detail::StepLogprobs lp = m.ranks->logprobs(batch);
    const std::vector<float>&logp_old = lp.logp_old, &entropy = lp.entropy, &logp_ref = lp.logp_ref,
          &logp_no_replay = lp.logp_no_replay;
    std::vector<float> logp_sampler;
    for (const model::SampleResult& s : rb.samples)
      logp_sampler.insert(logp_sampler.end(), s.logprobs.begin(), s.logprobs.end());
    const double t_logprob = seconds_since(t0);

    // 3. Objective, backward, AdamW: K minibatches of whole groups, in order, each an AdamW step
    // on every learner rank over the sum of its M gradient slots.
    t0 = Clock::now();
    UpdateStats us;
    const int64_t per = P / K * G;  // responses per minibatch
    std::vector<ObjectiveStats> objective_stats(static_cast<size_t>(K));
    // Every rank evaluates the objective of minibatch c on the same inputs (a pure function), so
    // every rank backpropagates the same per-token gradient; rank 0 keeps the statistics.
    const detail::ObjectiveFn objective = [&](int rank, int64_t c,
                                              std::span<const float> logp_new) {
      const int64_t r0 = c * per, r1 = r0 + per;
      const int64_t t0i = all.offsets[size_t(r0)], t1i = all.offsets[size_t(r1)];
      auto slice = [&](const std::vector<float>& v) {
        return std::span<const float>(v).subspan(size_t(t0i), size_t(t1i - t0i));
      };
      std::vector<int64_t> offsets(all.offsets.begin() + r0, all.offsets.begin() + r1 + 1);
      for (int64_t& x : offsets) x -= t0i;
      const std::vector<uint8_t> mask(size_t(t1i - t0i), 1);
      const std::span<const float> a = std::span(adv).subspan(size_t(r0), size_t(per));
      ObjectiveInputs in{offsets, logp_new, slice(logp_old), slice(logp_sampler), slice(logp_ref),
                         mask,    a};
      ObjectiveResult r = compute_objective(in, ocfg);
      if (rank == 0) objective_stats[size_t(c)] = r.stats;
      return std::move(r.grad_logp_new);
    };
    const std::vector<model::StepStats> steps = m.ranks->update(batch, K, logp_old, objective);
    for (int64_t c = 0; c < K; ++c) us.add(objective_stats[size_t(c)], steps[size_t(c)]);
    const double t_train = seconds_since(t0);

    // 4. The converter exports version k with the sampler's recipe; the sampler verifies and
    // loads it.
    m.step = k;
    const double t_sync = m.sync_policy();

    // 5. Diagnostics of the batch.
    int64_t equal_groups = 0;  // groups whose G rewards are all equal (no gradient)
    for (int64_t p = 0; p < P; ++p) {
      bool same = true;
      for (int64_t g = 1; g < G; ++g)
        same = same && rb.rewards[size_t(p * G + g)] == rb.rewards[size_t(p * G)];
      equal_groups += same;
    }
    row["policy_version"] = m.step;
    // The version that sampled the batch and how far the learner was ahead of it when the step
    // began (the same for every sample of a batch, so the mean over samples is that value).
    row["rollout_policy_version"] = rollout_version;
    row["policy_lag"] = double(k - 1 - rollout_version);
    row["optimizer_steps"] = m.learner().version();
    row["reward_mean"] = mean_of(rb.rewards);
    row["accuracy"] = double(rb.correct) / double(rb.samples.size());
    row["truncated_frac"] = double(rb.truncated) / double(rb.samples.size());
    row["groups_all_equal"] = double(equal_groups) / double(P);
    row["response_len_mean"] = double(T) / double(rb.samples.size());
    row["entropy"] = mean_of(entropy);
    {
      std::vector<float> delta(static_cast<size_t>(T));
      for (size_t t = 0; t < delta.size(); ++t) delta[t] = logp_old[t] - logp_sampler[t];
      const std::vector<uint8_t> valid(delta.size(), 1);
      diag::add_mismatch_metrics(diag::mismatch_stats(all.offsets, delta, valid, adv), row);
      // With routing replay the keys above are the gap the objective sees (replayed experts);
      // these are the gap of the learner's own routing. Null without replay.
      const auto num = [](double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); };
      diag::MismatchStats nr;
      if (replay) {
        for (size_t t = 0; t < delta.size(); ++t) delta[t] = logp_no_replay[t] - logp_sampler[t];
        nr = diag::mismatch_stats(all.offsets, delta, valid, adv);
      }
      row["no_replay_mean_gap"] = num(nr.mean_delta);
      row["no_replay_mean_abs_gap"] = num(nr.mean_abs_delta);
      row["no_replay_max_abs_gap"] = num(nr.max_abs_delta);
      row["no_replay_q05_gap"] = num(nr.q05_delta);
    }
    add_update_stats(row, us, m.guard);
    row["tokens"] = n;
    row["response_tokens"] = T;
    if (k % o.eval_every == 0 || k == o.steps) {
      if (o.eval_prompts > 0) {
        const double acc = eval(row, /*with_bf16=*/k == o.steps, &res.end_eval_accuracy_bf16);
        if (k == o.steps) res.end_eval_accuracy = acc;
      }
    }
    // Asynchronous: time_rollout_s is how long the learner waited for the batch, and
    // time_rollout_gen_s how long sampling it took on its thread (the difference overlapped).
    row["time_rollout_s"] = t_rollout;
    if (o.async_rollout) row["time_rollout_gen_s"] = t_rollout_gen;
    row["time_logprob_s"] = t_logprob;
    row["time_train_s"] = t_train;
    row["time_sync_s"] = t_sync + t_launch;
    const double t_all = seconds_since(t_step);
    row["time_step_s"] = t_all;
    row["tokens_per_s"] = double(n) / t_all;
    emit(row);
    if (k % o.checkpoint_every == 0 || k == o.steps) m.save_checkpoint();
    if (cb.stop_requested && cb.stop_requested() && m.step < o.steps) {
      if (k % o.checkpoint_every != 0) m.save_checkpoint();
      break;
    }
  }
  res.steps_done = m.step;
  res.finished = m.step >= o.steps;
  if (res.finished && !res.end_eval_accuracy) {
    // A resumed run that was already complete: the last row's evaluation.
    for (const diag::MetricsRow& r : diag::read_metrics(m.metrics->path()).rows) {
      if (r.contains("eval_accuracy") && r["eval_accuracy"].is_number())
        res.end_eval_accuracy = r["eval_accuracy"].get<double>();
      if (r.contains("eval_accuracy_bf16") && r["eval_accuracy_bf16"].is_number())
        res.end_eval_accuracy_bf16 = r["eval_accuracy_bf16"].get<double>();
    }
  }
  res.elapsed_s = m.elapsed_s();
  res.report = m.dir / run_files::kReport;
  m.write_results(res);
  return res;
}

}  // namespace lockstep::rl
