// The sampler (model/sampler.h): continuous batching over the KV cache. Every iteration runs one
// cached forward over the rows of all active sequences (the whole prompt of a sequence that just
// joined, the last token of the others); every op is row-local, so a sequence's logits never
// depend on what else is in the batch (per-tensor activation recipes aside).
#include "lockstep/model/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lockstep/ops/softmax.h"
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
  const bool new_cache = !impl_->cache || cfg.kv != impl_->cfg.kv;
  impl_->cfg = cfg;
  if (new_cache && impl_->policy)
    impl_->cache = std::make_unique<KvCache>(impl_->policy->config, cfg.kv);
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
  impl_->dec = std::make_unique<Decoder>(decoder_weights(p));
  impl_->cache = std::make_unique<KvCache>(p.config, impl_->cfg.kv);
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
  std::vector<Active> active;
  size_t next = 0;
  std::vector<int32_t> ids;
  std::vector<int64_t> pos, slots, last_row;
  while (next < requests.size() || !active.empty()) {
    while (int64_t(active.size()) < m.cfg.max_batch && next < requests.size()) {
      if (m.cfg.max_new == 0) {
        ++next;
        continue;
      }
      active.push_back({next, m.cache->acquire(), 0, false});
      ++next;
    }
    if (active.empty()) break;
    ids.clear();
    pos.clear();
    slots.clear();
    last_row.clear();
    for (const Active& a : active) {
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
      last_row.push_back(int64_t(ids.size()) - 1);
    }
    const Tensor idt = Tensor::from_vector<int32_t>(ids, {int64_t(ids.size())}, DType::kI32);
    const Tensor logits = m.dec->forward_cached(idt, pos, slots, *m.cache);
    const ops::SampleConfig sc{m.cfg.temperature, m.cfg.top_k, m.cfg.top_p, m.cfg.seed};
    std::vector<Active> still;
    for (size_t i = 0; i < active.size(); ++i) {
      Active a = active[i];
      const SampleRequest& r = requests[a.req];
      a.len = a.prefilled ? a.len + 1 : int64_t(r.prompt.size());
      a.prefilled = true;
      const int32_t stream = int32_t(r.stream);
      const ops::SampledTokens st = ops::sample_tokens(
          logits.slice_rows(last_row[i], last_row[i] + 1),
          Tensor::from_vector<int32_t>(std::span<const int32_t>(&stream, 1), {1}, DType::kI32),
          Tensor::from_vector<int64_t>(std::span<const int64_t>(&a.len, 1), {1}, DType::kI64), sc);
      const int32_t tok = st.tokens.ptr<int32_t>()[0];
      const float logp = st.logprobs.ptr<float>()[0];
      if (tok < 0)
        throw std::runtime_error(fmt::format(
            "sampler: the logits of request {} have no distribution (a NaN or +inf logit)", a.req));
      SampleResult& res = out[a.req];
      res.tokens.push_back(tok);
      res.logprobs.push_back(logp);
      res.eos = m.cfg.eos && tok == *m.cfg.eos;
      const bool done = res.eos || int64_t(res.tokens.size()) >= m.cfg.max_new ||
                        a.len + 1 >= c.max_position_embeddings;
      if (done)
        m.cache->release(a.slot);
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
  const int64_t V = m.policy->config.vocab_size;
  if (int64_t(prompt.size() + continuation.size()) > m.policy->config.max_position_embeddings)
    throw std::invalid_argument("sampler score: prompt + continuation exceed the context");
  const int64_t slot = m.cache->acquire();
  std::vector<float> res;
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  std::vector<int64_t> pos(ids.size()), slots(ids.size(), slot);
  std::iota(pos.begin(), pos.end(), 0);
  int64_t len = 0;
  for (size_t i = 0; i < continuation.size(); ++i) {
    const Tensor idt = Tensor::from_vector<int32_t>(ids, {int64_t(ids.size())}, DType::kI32);
    const Tensor logits = m.scaled(m.dec->forward_cached(idt, pos, slots, *m.cache));
    len += int64_t(ids.size());
    const int32_t tok = continuation[i];
    float logp = 0, ent = 0, lse = 0;
    ops::token_logprobs_fwd_cpu<float>(logits.ptr<float>() + (logits.rows() - 1) * V, &tok, 1, V,
                                       &logp, &ent, &lse);
    res.push_back(logp);
    ids.assign(1, tok);
    pos.assign(1, len);
    slots.assign(1, slot);
  }
  m.cache->release(slot);
  return res;
}

}  // namespace lockstep::model
