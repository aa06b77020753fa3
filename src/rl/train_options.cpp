// TrainOptions: validation and the JSON form stored in run_meta.json
// (include/lockstep/rl/trainer.h).
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <utility>

#include "lockstep/rl/task.h"
#include "lockstep/rl/trainer.h"

namespace lockstep::rl {

void TrainOptions::validate() const {
  const Task& t = find_task(task);  // throws "unknown task 'x' (known: ...)"
  if (difficulty < t.min_difficulty() || difficulty > t.max_difficulty())
    throw std::invalid_argument(fmt::format("--difficulty {} is outside [{}, {}] for task '{}'",
                                            difficulty, t.min_difficulty(), t.max_difficulty(),
                                            task));
  parse_guard(guard);  // throws listing the guard names
  const RewardKind reward_kind = parse_reward_kind(reward);
  parse_split(eval_split);
  if (kv_cache != "bf16" && kv_cache != "fp8")
    throw std::invalid_argument(
        fmt::format("--kv-cache '{}' is not a KV cache format (known: bf16, fp8)", kv_cache));
  if (learner_kv != "bf16" && learner_kv != "match")
    throw std::invalid_argument(fmt::format(
        "--learner-kv '{}' is not a learner K / V rounding (known: bf16, match)", learner_kv));
  if (reward_kind == RewardKind::kPrefix && format_bonus != 0.0f)
    throw std::invalid_argument(
        "--format-bonus applies to the exact reward only; give --reward exact or drop it");
  const int64_t answer = t.max_answer_tokens(difficulty);
  if (answer > 0 && max_new < answer + 1)
    throw std::invalid_argument(fmt::format(
        "--max-new {} cannot hold the answer of task '{}' at difficulty {} ({} tokens + <eos>): "
        "every response would reach the limit and be scored wrong",
        max_new, task, difficulty, answer));
  auto positive = [](int64_t v, const char* flag) {
    if (v < 1) throw std::invalid_argument(fmt::format("{} {} must be >= 1", flag, v));
  };
  if (steps < 0) throw std::invalid_argument(fmt::format("--steps {} must be >= 0", steps));
  positive(prompts, "--prompts");
  positive(group, "--group");
  if (group < 2)
    throw std::invalid_argument(fmt::format(
        "--group {}: GRPO's advantage is a sample's reward minus its group's mean, so a group of "
        "one has advantage 0 and the run would train nothing; use --group 2 or more",
        group));
  positive(max_new, "--max-new");
  positive(minibatches, "--minibatches");
  positive(eval_every, "--eval-every");
  positive(checkpoint_every, "--checkpoint-every");
  positive(sampler_batch, "--sampler-batch");
  if (eval_prompts < 0)
    throw std::invalid_argument(fmt::format("--eval-prompts {} must be >= 0", eval_prompts));
  if (prompts % minibatches != 0)
    throw std::invalid_argument(fmt::format(
        "--prompts {} must be a multiple of --minibatches {} (each minibatch holds whole groups)",
        prompts, minibatches));
  if (grad_slots < 1 || (grad_slots & (grad_slots - 1)) != 0)
    throw std::invalid_argument(fmt::format(
        "--grad-slots {} must be a power of two (the slot gradients are added in a pairwise "
        "tree): 1, 2, 4, ...",
        grad_slots));
  if (grad_slots > prompts / minibatches * group)
    throw std::invalid_argument(
        fmt::format("--grad-slots {} is more than the {} sequences of a minibatch (--prompts {} / "
                    "--minibatches {} x --group {}): a slot would be empty",
                    grad_slots, prompts / minibatches * group, prompts, minibatches, group));
  if (learner_ranks < 1 || (learner_ranks & (learner_ranks - 1)) != 0)
    throw std::invalid_argument(
        fmt::format("{} learner ranks: the rank count must be a power of two (each rank's slots "
                    "are one subtree of the fixed reduction tree)",
                    learner_ranks));
  if (grad_slots % learner_ranks != 0)
    throw std::invalid_argument(fmt::format(
        "--grad-slots {} is not a multiple of the {} learner ranks: every rank computes "
        "grad_slots / ranks slots (give --grad-slots {} or more)",
        grad_slots, learner_ranks, learner_ranks));
  auto finite_in = [](double v, double lo, double hi, bool lo_open, const char* flag) {
    if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo))
      throw std::invalid_argument(
          fmt::format("{} {} must be in {}{}, {}]", flag, v, lo_open ? "(" : "[", lo, hi));
  };
  finite_in(temperature, 0.0, 100.0, true, "--temperature");
  finite_in(lr, 0.0, 1.0, true, "--lr");
  finite_in(beta1, 0.0, 1.0, false, "--beta1");
  finite_in(beta2, 0.0, 1.0, false, "--beta2");
  finite_in(adam_eps, 0.0, 1.0, true, "--adam-eps");
  finite_in(weight_decay, 0.0, 1.0, false, "--weight-decay");
  finite_in(max_grad_norm, 0.0, 1e9, false, "--max-grad-norm");
  finite_in(kl_coef, 0.0, 1e3, false, "--kl-coef");
  finite_in(tis_cap, 0.0, 1e6, true, "--tis-cap");
  finite_in(repair.scale, 0.0, 1e3, true, "--repair-scale");
  finite_in(repair.weight, 0.0, 1e3, false, "--repair-weight");
  if (!std::isfinite(repair.margin)) throw std::invalid_argument("--repair-margin must be finite");
  positive(gate.segment, "--gate-segment");
  positive(repair.segment, "--repair-segment");
  for (const auto& [v, flag] : {std::pair{gate.mild_gap, "--gate-mild-gap"},
                                {gate.severe_gap, "--gate-severe-gap"},
                                {gate.tail_gap, "--gate-tail-gap"}})
    if (!std::isfinite(v)) throw std::invalid_argument(fmt::format("{} must be finite", flag));
  if (!(gate.severe_gap <= gate.mild_gap))
    throw std::invalid_argument(fmt::format("--gate-severe-gap {} must be <= --gate-mild-gap {}",
                                            gate.severe_gap, gate.mild_gap));
  finite_in(gate.mild_weight, 0.0, 1.0, false, "--gate-mild-weight");
  finite_in(gate.severe_weight, 0.0, 1.0, false, "--gate-severe-weight");
  finite_in(gate.tail1_weight, 0.0, 1.0, false, "--gate-tail1-weight");
  finite_in(gate.tail2_weight, 0.0, 1.0, false, "--gate-tail2-weight");
  finite_in(format_bonus, 0.0, 1.0, false, "--format-bonus");
  if (async_rollout != 0 && async_rollout != 1)
    throw std::invalid_argument(fmt::format(
        "--async-rollout {} must be 0 (sample with the current policy) or 1 (sample the next "
        "step's batch while this step trains)",
        async_rollout));
}

int64_t max_sequence_length(const TrainOptions& o) {
  const Example e = find_task(o.task).make(o.seed, 0, o.difficulty, Split::kTrain);
  return int64_t(e.prompt.size()) + o.max_new;
}

Json options_to_json(const TrainOptions& o) {
  return {{"task", o.task},
          {"difficulty", o.difficulty},
          {"guard", o.guard},
          {"deterministic", o.deterministic},
          {"seed", o.seed},
          {"steps", o.steps},
          {"prompts", o.prompts},
          {"group", o.group},
          {"max_new", o.max_new},
          {"temperature", o.temperature},
          {"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"adam_eps", o.adam_eps},
          {"weight_decay", o.weight_decay},
          {"max_grad_norm", o.max_grad_norm},
          {"minibatches", o.minibatches},
          {"grad_slots", o.grad_slots},
          {"kl_coef", o.kl_coef},
          {"tis_cap", o.tis_cap},
          {"repair_enabled", o.repair.enabled},
          {"repair_margin", o.repair.margin},
          {"repair_scale", o.repair.scale},
          {"repair_weight", o.repair.weight},
          {"repair_segment", o.repair.segment},
          {"gate_segment", o.gate.segment},
          {"gate_mild_gap", o.gate.mild_gap},
          {"gate_severe_gap", o.gate.severe_gap},
          {"gate_tail_gap", o.gate.tail_gap},
          {"gate_mild_weight", o.gate.mild_weight},
          {"gate_severe_weight", o.gate.severe_weight},
          {"gate_tail1_weight", o.gate.tail1_weight},
          {"gate_tail2_weight", o.gate.tail2_weight},
          {"format_bonus", o.format_bonus},
          {"reward", o.reward},
          {"eval_every", o.eval_every},
          {"eval_prompts", o.eval_prompts},
          {"eval_split", o.eval_split},
          {"checkpoint_every", o.checkpoint_every},
          {"sampler_batch", o.sampler_batch},
          {"sampler_recipe", o.sampler_recipe ? to_json(*o.sampler_recipe) : Json(nullptr)},
          {"kv_cache", o.kv_cache},
          {"learner_kv", o.learner_kv},
          {"routing_replay", o.routing_replay},
          {"async_rollout", o.async_rollout}};
}

TrainOptions options_from_json(const Json& j, const std::string& where) {
  if (!j.is_object())
    throw std::invalid_argument(fmt::format("{}: 'options' is not an object", where));
  // Fields a run folder may predate keep their defaults when absent.
  auto get_opt = [&](const char* key, auto& target) {
    using T = std::decay_t<decltype(target)>;
    if (!j.contains(key)) return;
    try {
      target = j.at(key).get<T>();
    } catch (const Json::exception&) {
      throw std::invalid_argument(fmt::format("{}: options field '{}' has the wrong type ({})",
                                              where, key, j.at(key).dump()));
    }
  };
  auto get = [&](const char* key, auto& target) {
    if (!j.contains(key))
      throw std::invalid_argument(fmt::format("{}: options field '{}' is missing", where, key));
    get_opt(key, target);
  };
  TrainOptions o;
  get("task", o.task);
  get("difficulty", o.difficulty);
  get("guard", o.guard);
  get("deterministic", o.deterministic);
  get("seed", o.seed);
  get("steps", o.steps);
  get("prompts", o.prompts);
  get("group", o.group);
  get("max_new", o.max_new);
  get("temperature", o.temperature);
  get("lr", o.lr);
  get("beta1", o.beta1);
  get("beta2", o.beta2);
  get("adam_eps", o.adam_eps);
  get("weight_decay", o.weight_decay);
  get("max_grad_norm", o.max_grad_norm);
  get("minibatches", o.minibatches);
  get("kl_coef", o.kl_coef);
  get("tis_cap", o.tis_cap);
  get("repair_enabled", o.repair.enabled);
  get("repair_margin", o.repair.margin);
  get("repair_scale", o.repair.scale);
  get("repair_weight", o.repair.weight);
  get("format_bonus", o.format_bonus);
  get("eval_every", o.eval_every);
  get("eval_prompts", o.eval_prompts);
  get("checkpoint_every", o.checkpoint_every);
  get("sampler_batch", o.sampler_batch);
  get_opt("repair_segment", o.repair.segment);
  get_opt("gate_segment", o.gate.segment);
  get_opt("gate_mild_gap", o.gate.mild_gap);
  get_opt("gate_severe_gap", o.gate.severe_gap);
  get_opt("gate_tail_gap", o.gate.tail_gap);
  get_opt("gate_mild_weight", o.gate.mild_weight);
  get_opt("gate_severe_weight", o.gate.severe_weight);
  get_opt("gate_tail1_weight", o.gate.tail1_weight);
  get_opt("gate_tail2_weight", o.gate.tail2_weight);
  get_opt("reward", o.reward);
  get_opt("eval_split", o.eval_split);
  get_opt("kv_cache", o.kv_cache);
  get_opt("learner_kv", o.learner_kv);
  get_opt("routing_replay", o.routing_replay);
  get_opt("grad_slots", o.grad_slots);
  get_opt("async_rollout", o.async_rollout);
  if (j.contains("sampler_recipe") && !j.at("sampler_recipe").is_null()) {
    try {
      o.sampler_recipe = recipe_from_json(j.at("sampler_recipe"), where + ": sampler_recipe");
    } catch (const std::exception& e) {
      throw std::invalid_argument(e.what());
    }
  }
  return o;
}

}  // namespace lockstep::rl
