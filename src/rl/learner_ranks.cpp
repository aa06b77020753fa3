// The data-parallel learner step (learner_ranks.h): per rank, the forwards of its gradient slots,
// the per-token values gathered from every rank, one backward per slot, the fixed-tree gradient
// reduction and the same AdamW step on every replica.
#include "learner_ranks.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <stdexcept>

#include "lockstep/dist/grad_reduce.h"
#include "lockstep/ops/tensor_ops.h"

namespace lockstep::rl::detail {
namespace {

Tensor i32_tensor(const std::vector<int32_t>& v) {
  return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, DType::kI32);
}

// values[rows[t]] for every t.
std::vector<float> gather_rows(const Tensor& values_in, std::span<const int64_t> rows) {
  const Tensor values = values_in.to(Device::cpu());
  const std::span<const float> v = values.data<float>();
  std::vector<float> out(rows.size());
  for (size_t t = 0; t < rows.size(); ++t) out[t] = v[size_t(rows[t])];
  return out;
}

// The responses [r0, r1) of the batch packed alone, with their routing when replayed: what one
// gradient slot's forward and backward run on.
struct SlotBatch {
  int64_t r0 = 0, r1 = 0;
  PackedSequences packed;
  Tensor tokens, targets;
  std::optional<model::Routing> replay;
  const model::Routing* rp() const { return replay ? &*replay : nullptr; }
};

SlotBatch slot_batch(const StepBatch& b, const model::ModelConfig& cfg, int64_t r0, int64_t r1) {
  SlotBatch s;
  s.r0 = r0;
  s.r1 = r1;
  s.packed = pack_sequences(b.seqs.subspan(size_t(r0), size_t(r1 - r0)));
  s.tokens = i32_tensor(s.packed.tokens);
  s.targets = i32_tensor(s.packed.targets);
  if (b.routing_replay)
    s.replay = model::replay_routing(cfg, b.samples.subspan(size_t(r0), size_t(r1 - r0)),
                                     s.packed.cu_seqlens);
  return s;
}

// Slot s of M over the responses [base, base + count): contiguous, fixed by M alone.
std::pair<int64_t, int64_t> slot_range(int64_t base, int64_t count, int64_t s, int64_t m) {
  return {base + s * count / m, base + (s + 1) * count / m};
}

// Every rank's `local` values laid end to end in rank order (rank q gives counts[q] values), on
// every rank. The ranks' blocks are padded to the longest, since all_gather moves equal blocks.
std::vector<float> gather_values(dist::Communicator& comm, std::span<const float> local,
                                 std::span<const int64_t> counts) {
  const int n = comm.size();
  int64_t width = 1;
  for (int64_t c : counts) width = std::max(width, c);
  if (int64_t(local.size()) != counts[size_t(comm.rank())])
    throw std::logic_error(fmt::format("learner rank {}: {} values where {} were announced",
                                       comm.rank(), local.size(), counts[size_t(comm.rank())]));
  std::vector<float> padded(size_t(width), 0.0f);
  std::copy(local.begin(), local.end(), padded.begin());
  const Tensor in = Tensor::from_vector<float>(padded, {width}, DType::kF32).to(comm.device());
  Tensor out = Tensor::empty(DType::kF32, {int64_t(n) * width}, comm.device());
  comm.all_gather(in, out);
  const Tensor host = out.to(Device::cpu());
  const std::span<const float> all = host.data<float>();
  std::vector<float> result;
  for (int q = 0; q < n; ++q)
    result.insert(result.end(), all.begin() + q * width,
                  all.begin() + q * width + counts[size_t(q)]);
  return result;
}

uint64_t masters_checksum(const model::ModelWeights& w) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  auto mix = [&h](const void* p, size_t len) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < len; ++i) {
      h ^= b[i];
      h *= 0x100000001b3ull;
    }
  };
  for (const auto& [name, t] : w.tensors) {
    mix(name.data(), name.size());
    for (int64_t d : t.shape()) mix(&d, sizeof d);
    const Tensor host = t.to(Device::cpu()).contiguous();
    mix(host.raw(), host.nbytes());
  }
  return h;
}

}  // namespace

LearnerRanks::LearnerRanks(std::vector<LearnerReplica> replicas,
                           std::unique_ptr<dist::RankGroup> group, int64_t grad_slots)
    : replicas_(std::move(replicas)), group_(std::move(group)), slots_(grad_slots) {
  if (replicas_.empty() || int(replicas_.size()) != group_->size())
    throw std::invalid_argument(fmt::format("learner ranks: {} replicas for a group of {}",
                                            replicas_.size(), group_->size()));
  if (slots_ < 1 || slots_ % int64_t(replicas_.size()) != 0)
    throw std::invalid_argument(fmt::format(
        "learner ranks: {} gradient slots cannot be shared by {} ranks", slots_, replicas_.size()));
  saved_.resize(replicas_.size());
}

LearnerRanks::~LearnerRanks() = default;

StepLogprobs LearnerRanks::logprobs(const StepBatch& b) {
  const int n = size();
  const int64_t R = int64_t(b.seqs.size()), M = slots_;
  const std::vector<int64_t>& off = b.all->offsets;
  // Rank q's slots hold the responses [first(q), first(q + 1)): a contiguous token range.
  const auto first = [&](int q) { return slot_range(0, R, int64_t(q) * M / n, M).first; };
  std::vector<int64_t> counts;
  for (int q = 0; q < n; ++q)
    counts.push_back(off[size_t(q + 1 == n ? R : first(q + 1))] - off[size_t(first(q))]);
  StepLogprobs result;
  group_->run([&](dist::Communicator& comm) {
    const int r = comm.rank();
    LearnerReplica& rep = replicas_[size_t(r)];
    const Device dev = group_->device(r);
    const model::ModelConfig& cfg = rep.learner->weights().config;
    StepLogprobs mine;
    for (int64_t s = int64_t(r) * M / n; s < int64_t(r + 1) * M / n; ++s) {
      const auto [r0, r1] = slot_range(0, R, s, M);
      const SlotBatch sb = slot_batch(b, cfg, r0, r1);
      const Tensor targets_dev = sb.targets.to(dev);
      // log-probs of the targets under logits / temperature, at the response rows.
      const auto response_logp = [&](Tensor logits) {
        if (b.temperature != 1.0) logits = ops::scale(logits, 1.0 / b.temperature);
        return gather_rows(ops::token_logprobs(logits, targets_dev).logp, sb.packed.rows);
      };
      const auto append = [](std::vector<float>& to, const std::vector<float>& v) {
        to.insert(to.end(), v.begin(), v.end());
      };
      // The learner's own routing first (no grad), then the forward whose saved state the
      // backward of this slot may use.
      if (sb.replay)
        append(mine.logp_no_replay,
               response_logp(rep.learner->logits(sb.tokens, sb.packed.cu_seqlens)));
      const model::LearnerOutput out =
          rep.learner->forward(sb.tokens, sb.packed.cu_seqlens, sb.targets, sb.rp());
      saved_[size_t(r)] = {r0, r1, rep.learner->version()};
      append(mine.logp_old, gather_rows(out.logp, sb.packed.rows));
      append(mine.entropy, gather_rows(out.entropy, sb.packed.rows));
      append(mine.logp_ref, response_logp(rep.reference->forward(sb.tokens, sb.packed.cu_seqlens,
                                                                 b.mode, /*save=*/false, sb.rp())));
    }
    StepLogprobs all;
    all.logp_old = gather_values(comm, mine.logp_old, counts);
    all.entropy = gather_values(comm, mine.entropy, counts);
    all.logp_ref = gather_values(comm, mine.logp_ref, counts);
    if (b.routing_replay) all.logp_no_replay = gather_values(comm, mine.logp_no_replay, counts);
    if (r == 0) result = std::move(all);
  });
  return result;
}

std::vector<model::StepStats> LearnerRanks::update(const StepBatch& b, int64_t minibatches,
                                                   std::span<const float> logp_old,
                                                   const ObjectiveFn& objective) {
  const int n = size();
  const int64_t R = int64_t(b.seqs.size()), M = slots_, K = minibatches, per = R / K;
  const std::vector<int64_t>& off = b.all->offsets;
  if (per * K != R || M > per)
    throw std::logic_error(
        fmt::format("learner ranks: {} responses in {} minibatches of {} gradient slots", R, K, M));
  std::vector<model::StepStats> stats;
  group_->run([&](dist::Communicator& comm) {
    const int r = comm.rank();
    LearnerReplica& rep = replicas_[size_t(r)];
    model::Learner& L = *rep.learner;
    const model::ModelConfig& cfg = L.weights().config;
    const int64_t s_lo = int64_t(r) * M / n, s_hi = int64_t(r + 1) * M / n;
    for (int64_t c = 0; c < K; ++c) {
      const int64_t base = c * per, t_base = off[size_t(base)];
      const int64_t t_count = off[size_t(base + per)] - t_base;
      // logp_new of the minibatch's tokens.
      std::vector<float> fresh;
      std::span<const float> logp_new;
      if (K == 1) {
        logp_new = logp_old;  // the same parameters: logprobs()'s forwards serve the backward
      } else {
        std::vector<int64_t> counts;
        for (int q = 0; q < n; ++q) {
          const int64_t a = slot_range(base, per, int64_t(q) * M / n, M).first;
          const int64_t z = slot_range(base, per, int64_t(q + 1) * M / n - 1, M).second;
          counts.push_back(off[size_t(z)] - off[size_t(a)]);
        }
        std::vector<float> mine;
        for (int64_t s = s_lo; s < s_hi; ++s) {
          const auto [r0, r1] = slot_range(base, per, s, M);
          const SlotBatch sb = slot_batch(b, cfg, r0, r1);
          const model::LearnerOutput o =
              L.forward(sb.tokens, sb.packed.cu_seqlens, sb.targets, sb.rp());
          saved_[size_t(r)] = {r0, r1, L.version()};
          const std::vector<float> v = gather_rows(o.logp, sb.packed.rows);
          mine.insert(mine.end(), v.begin(), v.end());
        }
        fresh = gather_values(comm, mine, counts);
        logp_new = fresh;
      }
      if (int64_t(logp_new.size()) != t_count)
        throw std::logic_error(fmt::format("learner rank {}: {} log-probs for {} tokens", r,
                                           logp_new.size(), t_count));
      const std::vector<float> grad = objective(r, c, logp_new);
      if (int64_t(grad.size()) != t_count)
        throw std::logic_error(
            fmt::format("learner rank {}: the objective gave {} gradients for "
                        "{} tokens",
                        r, grad.size(), t_count));
      // One backward per slot from zero gradients; the last forward's slot first, so its saved
      // state is used before another forward replaces it. One rank with one slot: its gradient
      // is the step's (the tree over one slot is that slot), so it stays where the backward put it.
      const bool direct = n == 1 && M == 1;
      std::vector<Tensor> slot_grads(size_t(s_hi - s_lo));
      L.zero_grad();
      for (int64_t s = s_hi - 1; s >= s_lo; --s) {
        const auto [r0, r1] = slot_range(base, per, s, M);
        const SlotBatch sb = slot_batch(b, cfg, r0, r1);
        const SavedForward& sv = saved_[size_t(r)];
        if (sv.r0 != r0 || sv.r1 != r1 || sv.version != L.version())
          (void)L.forward(sb.tokens, sb.packed.cu_seqlens, sb.targets, sb.rp());
        saved_[size_t(r)] = {};
        std::vector<float> dlogp(sb.packed.tokens.size(), 0.0f);
        const int64_t t0 = off[size_t(r0)] - t_base;
        for (size_t t = 0; t < sb.packed.rows.size(); ++t)
          dlogp[size_t(sb.packed.rows[t])] = grad[size_t(t0) + t];
        L.backward(Tensor::from_vector<float>(dlogp, {int64_t(dlogp.size())}, DType::kF32),
                   Tensor());
        if (direct) continue;
        slot_grads[size_t(s - s_lo)] = L.gradient_flat();
        L.zero_grad();
      }
      if (!direct) L.set_gradient_flat(dist::reduce_gradients(comm, slot_grads));
      const model::StepStats st = L.step();
      if (r == 0) stats.push_back(st);
    }
  });
  return stats;
}

void LearnerRanks::check_replicas() {
  if (size() == 1) return;
  group_->run([&](dist::Communicator& comm) {
    const int r = comm.rank();
    const uint64_t h = masters_checksum(replicas_[size_t(r)].learner->weights());
    int64_t word;
    std::memcpy(&word, &h, sizeof word);
    const Tensor in = Tensor::from_vector<int64_t>(std::vector<int64_t>{word}, {1}, DType::kI64)
                          .to(comm.device());
    Tensor out = Tensor::empty(DType::kI64, {int64_t(comm.size())}, comm.device());
    comm.all_gather(in, out);
    const Tensor host = out.to(Device::cpu());
    const std::span<const int64_t> all = host.data<int64_t>();
    if (r != 0) return;
    for (int q = 1; q < comm.size(); ++q)
      if (all[size_t(q)] != all[0])
        throw std::runtime_error(fmt::format(
            "data-parallel learner: the masters of rank {} (checksum {:016x}) differ from rank "
            "0's ({:016x}) after optimizer step {}: the replicas no longer hold the same weights",
            q, uint64_t(all[size_t(q)]), uint64_t(all[0]), replicas_[0].learner->version()));
  });
}

}  // namespace lockstep::rl::detail
