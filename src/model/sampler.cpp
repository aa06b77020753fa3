// The sampler (model/sampler.h): continuous batching over the KV cache. Every iteration runs one
// cached forward over the rows of all active sequences (the whole prompt of a sequence that just
// joined, the last token of the others); every op is row-local, so a sequence's logits never
// depend on what else is in the batch (per-tensor activation recipes aside).
#include "lockstep/model/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lockstep/ops/tensor_ops.h"

namespace lockstep::model {

struct Sampler::Impl {
  SamplerConfig cfg;
  std::optional<PolicyVersion> policy;
  std::unique_ptr<Decoder> dec;
  std::unique_ptr<KvCache> cache;

  void check_ready() const {
    if (!dec) throw std::logic_error("sampler: no policy loaded (load_policy first)");
  }
  void validate(std::span<const int32_t> prompt, size_t i) const {
    const ModelConfig& c = policy->config;
    if (prompt.empty()) throw std::invalid_argument(fmt::format("sampler: prompt {} is empty", i));
    if (int64_t(prompt.size()) >= c.max_position_embeddings)
      throw std::invalid_argument(fmt::format(
          "sampler: prompt {} has {} tokens; the configured context (max_position_embeddings = "
          "{}) leaves no room to generate",
          i, prompt.size(), c.max_position_embeddings));
    for (size_t j = 0; j < prompt.size(); ++j)
      if (prompt[j] < 0 || prompt[j] >= c.vocab_size)
        throw std::invalid_argument(
            fmt::format("sampler: prompt {} token {} is {}, outside the vocabulary of {} tokens", i,
                        j, prompt[j], c.vocab_size));
  }
  // Logits [rows, V] scaled by 1 / temperature exactly as the learner scales them.
  Tensor scaled(const Tensor& logits) const {
    return cfg.temperature == 1.0 ? logits : ops::scale(logits, 1.0 / cfg.temperature);
  }
  // A cache with room for `slots` sequences of `positions` tokens: the current one when it is
  // large enough (and of the configured dtype and device), else a new one at least as large.
  KvCache& cache_for(int64_t slots, int64_t positions) {
    const ModelConfig& c = policy->config;
    constexpr int64_t kPositionQuantum = 64;  // fewer reallocations as lengths vary
    positions = std::min(c.max_position_embeddings,
                         (positions + kPositionQuantum - 1) / kPositionQuantum * kPositionQuantum);
    if (cache && cache->dtype() == cfg.kv && cache->device() == cfg.device &&
        cache->slots() >= slots && cache->max_pos() >= positions)
      return *cache;
    if (cache && cache->dtype() == cfg.kv && cache->device() == cfg.device) {
      slots = std::max(slots, cache->slots());
      positions = std::max(positions, cache->max_pos());
    }
    cache.reset();  // free the old one before allocating
    cache = std::make_unique<KvCache>(c, cfg.kv, slots, positions, cfg.device);
    return *cache;
  }
};

Sampler::Sampler(SamplerConfig cfg) : impl_(std::make_unique<Impl>()) { set_config(cfg); }
Sampler::~Sampler() = default;

void Sampler::set_config(const SamplerConfig& cfg) {
  if (!(cfg.temperature > 0.0))
    throw std::invalid_argument(
        fmt::format("sampler: temperature {} must be > 0", cfg.temperature));
  if (!(cfg.top_p > 0.0 && cfg.top_p <= 1.0))
    throw std::invalid_argument(fmt::format("sampler: top_p {} must be in (0, 1]", cfg.top_p));
  if (cfg.top_k < 0 || cfg.max_new < 0 || cfg.max_batch < 1)
    throw std::invalid_argument("sampler: top_k and max_new must be >= 0, max_batch >= 1");
  const bool moved = cfg.device != impl_->cfg.device;
  impl_->cfg = cfg;
  if (moved) {
    impl_->cache.reset();
    if (impl_->policy)
      impl_->dec = std::make_unique<Decoder>(decoder_weights(*impl_->policy, cfg.device));
  }
}

const SamplerConfig& Sampler::config() const { return impl_->cfg; }
int64_t Sampler::version() const { return impl_->policy ? impl_->policy->version : -1; }

void Sampler::load_policy(PolicyVersion p, int64_t expected_version,
                          const std::string& expected_recipe) {
  if (p.version != expected_version)
    throw PolicyError(fmt::format("sampler: policy version {} refused (expected version {})",
                                  p.version, expected_version));
  if (!expected_recipe.empty() && p.recipe.name != expected_recipe)
    throw PolicyError(fmt::format("sampler: policy version {} has recipe '{}', expected '{}'",
                                  p.version, p.recipe.name, expected_recipe));
  const uint64_t sum = policy_checksum(p);
  if (sum != p.checksum)
    throw PolicyError(fmt::format(
        "sampler: policy version {} checksum {:016x} does not verify (the bytes hash to {:016x})",
        p.version, p.checksum, sum));
  impl_->dec.reset();  // the old version's device memory first
  impl_->dec = std::make_unique<Decoder>(decoder_weights(p, impl_->cfg.device));
  impl_->policy = std::move(p);
}

std::vector<SampleResult> Sampler::generate(std::span<const SampleRequest> requests) {
  Impl& m = *impl_;
  m.check_ready();
  for (size_t i = 0; i < requests.size(); ++i) m.validate(requests[i].prompt, i);
  const ModelConfig& c = m.policy->config;
  struct Active {
    size_t req;
    int64_t slot;
    int64_t len;  // tokens in the cache
    bool prefilled;
  };
  std::vector<SampleResult> out(requests.size());
  if (m.cfg.max_new == 0 || requests.empty()) return out;
  int64_t longest = 0;
  for (const SampleRequest& r : requests)
    longest = std::max(longest, int64_t(r.prompt.size()) + m.cfg.max_new);
  KvCache& cache = m.cache_for(std::min<int64_t>(m.cfg.max_batch, int64_t(requests.size())),
                               std::min(longest, c.max_position_embeddings));
  const Device dev = m.cfg.device;
  std::vector<Active> active;
  size_t next = 0;
  std::vector<int32_t> ids, last_row, streams;
  std::vector<int64_t> pos, slots, lens;
  const ops::SampleConfig sc{m.cfg.temperature, m.cfg.top_k, m.cfg.top_p, m.cfg.seed};
  while (next < requests.size() || !active.empty()) {
    while (int64_t(active.size()) < m.cfg.max_batch && next < requests.size())
      active.push_back({next++, cache.acquire(), 0, false});
    ids.clear();
    pos.clear();
    slots.clear();
    last_row.clear();
    streams.clear();
    lens.clear();
    for (Active& a : active) {
      const SampleRequest& r = requests[a.req];
      if (!a.prefilled) {
        for (size_t j = 0; j < r.prompt.size(); ++j) {
          ids.push_back(r.prompt[j]);
          pos.push_back(int64_t(j));
          slots.push_back(a.slot);
        }
      } else {
        ids.push_back(out[a.req].tokens.back());
        pos.push_back(a.len);
        slots.push_back(a.slot);
      }
      last_row.push_back(int32_t(ids.size()) - 1);
      a.len = a.prefilled ? a.len + 1 : int64_t(r.prompt.size());
      a.prefilled = true;
      streams.push_back(int32_t(r.stream));
      lens.push_back(a.len);
    }
    const int64_t B = int64_t(active.size());
    const Tensor idt = Tensor::from_vector<int32_t>(ids, {int64_t(ids.size())}, DType::kI32);
    const Tensor logits = m.dec->forward_cached(idt, pos, slots, cache);
    // The last row of each sequence (every row when all sequences decode one token).
    const Tensor rows =
        int64_t(ids.size()) == B
            ? logits
            : ops::embedding(logits,
                             Tensor::from_vector<int32_t>(last_row, {B}, DType::kI32).to(dev));
    const ops::SampledTokens st =
        ops::sample_tokens(rows, Tensor::from_vector<int32_t>(streams, {B}, DType::kI32).to(dev),
                           Tensor::from_vector<int64_t>(lens, {B}, DType::kI64).to(dev), sc);
    const Tensor tokens = st.tokens.to(Device::cpu()), logprobs = st.logprobs.to(Device::cpu());
    std::vector<Active> still;
    for (int64_t i = 0; i < B; ++i) {
      const Active& a = active[size_t(i)];
      const int32_t tok = tokens.ptr<int32_t>()[i];
      const float logp = logprobs.ptr<float>()[i];
      if (tok < 0)
        throw std::domain_error(fmt::format(
            "sampler: the logits of request {} are not finite (a NaN or +inf logit): no "
            "distribution to sample",
            a.req));
      SampleResult& res = out[a.req];
      res.tokens.push_back(tok);
      res.logprobs.push_back(logp);
      res.eos = m.cfg.eos && tok == *m.cfg.eos;
      const bool done = res.eos || int64_t(res.tokens.size()) >= m.cfg.max_new ||
                        a.len + 1 >= c.max_position_embeddings;
      if (done)
        cache.release(a.slot);
      else
        still.push_back(a);
    }
    active = std::move(still);
  }
  return out;
}

std::vector<float> Sampler::score(std::span<const int32_t> prompt,
                                  std::span<const int32_t> continuation) {
  Impl& m = *impl_;
  m.check_ready();
  m.validate(prompt, 0);
  if (int64_t(prompt.size() + continuation.size()) > m.policy->config.max_position_embeddings)
    throw std::invalid_argument("sampler score: prompt + continuation exceed the context");
  KvCache& cache = m.cache_for(1, int64_t(prompt.size() + continuation.size()));
  const int64_t slot = cache.acquire();
  std::vector<float> res;
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  std::vector<int64_t> pos(ids.size()), slots(ids.size(), slot);
  std::iota(pos.begin(), pos.end(), 0);
  int64_t len = 0;
  for (size_t i = 0; i < continuation.size(); ++i) {
    const Tensor idt = Tensor::from_vector<int32_t>(ids, {int64_t(ids.size())}, DType::kI32);
    const Tensor logits = m.dec->forward_cached(idt, pos, slots, cache);
    const int64_t last = logits.rows() - 1;
    len += int64_t(ids.size());
    const int32_t tok = continuation[i];
    const ops::TokenLogprobs lp = ops::token_logprobs(
        m.scaled(logits.slice_rows(last, last + 1)),
        Tensor::from_vector<int32_t>(std::span<const int32_t>(&tok, 1), {1}, DType::kI32)
            .to(m.cfg.device));
    res.push_back(lp.logp.to(Device::cpu()).ptr<float>()[0]);
    ids.assign(1, tok);
    pos.assign(1, len);
    slots.assign(1, slot);
  }
  cache.release(slot);
  return res;
}

}  // namespace lockstep::model
