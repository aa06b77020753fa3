// The sampler (model/sampler.h): continuous batching over the KV cache. Every iteration runs one
// cached forward over the rows of all active sequences (the whole prompt of a sequence that just
// joined, the last token of the others); every op is row-local, so a sequence's logits never
// depend on what else is in the batch (per-tensor activation recipes aside).
#include "lockstep/model/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "lockstep/ops/tensor_ops.h"
#include "lockstep/tensor/graph.h"
#include "lockstep/tensor/storage.h"

namespace lockstep::model {

// One batch size's decode step on a device: its inputs, outputs and (once recorded) its graph.
// The step reads and writes only these tensors, the policy's weights and the KV cache, so a
// replay after new inputs are copied in is the step on those inputs. The step also writes its
// sampled tokens into its ids row, so the next step of the same sequences can run before the
// host has read them (SamplerConfig::overlap_steps); the host sends what it knows ahead
// (positions, lengths). Inputs go up from, and outputs come back to, two page-locked host slots
// used by alternate steps, each with an event that marks its outputs' arrival.
struct DecodeStep {
  Tensor in;    // I32 [4, B]: ids, positions, slots, Philox streams
  Tensor lens;  // I64 [B]: tokens in the cache after the step (the Philox counter)
  Tensor out;   // I32 [2, B]: the sampled tokens, then the bits of their F32 log-probs
  Tensor host_in[2], host_lens[2], host_out[2];  // pinned host mirrors of in, lens and out
  std::unique_ptr<StreamEvent> arrived[2];       // host_out[h] holds its step's outputs
  DeviceGraph graph;
};

struct Sampler::Impl {
  SamplerConfig cfg;
  // Declared before everything that allocates on it, so it is destroyed after them.
  std::unique_ptr<OwnedStream> stream;
  std::optional<PolicyVersion> policy;
  std::unique_ptr<Decoder> dec;
  std::unique_ptr<KvCache> cache;
  std::map<int64_t, DecodeStep> steps;  // by batch size; they hold pointers into dec and cache
  SamplerStats stats;

  // Graphs hold the addresses of the weights, the cache and the sampling settings: any change of
  // those drops them.
  void drop_steps() {
    steps.clear();
    stats.graphs_off.clear();
  }
  bool graphs_wanted() const { return cfg.cuda_graphs && device_graphs_available(cfg.device); }
  DecodeStep& step_for(int64_t B) {
    auto it = steps.find(B);
    if (it != steps.end()) return it->second;
    DecodeStep s;
    s.in = Tensor::empty(DType::kI32, {4, B}, cfg.device);
    s.lens = Tensor::empty(DType::kI64, {B}, cfg.device);
    s.out = Tensor::empty(DType::kI32, {2, B}, cfg.device);
    auto pinned = [&](const Tensor& t) {
      return Tensor::wrap(Storage::allocate_pinned(t.nbytes(), cfg.device), t.dtype(), t.shape());
    };
    for (int h = 0; h < 2; ++h) {
      s.host_in[h] = pinned(s.in);
      s.host_lens[h] = pinned(s.lens);
      s.host_out[h] = pinned(s.out);
      s.arrived[h] = std::make_unique<StreamEvent>(cfg.device);
    }
    return steps.emplace(B, std::move(s)).first->second;
  }
  // The decode step's calls: every temporary is freed before it returns (a graph records it).
  void run_step(DecodeStep& s, const ops::SampleConfig& sc) {
    const int64_t B = s.lens.numel();
    auto row = [&](int64_t r) { return s.in.slice_rows(r, r + 1).view({B}); };
    const Tensor logits = dec->forward_cached_device(row(0), row(1), row(2), *cache);
    const ops::SampledTokens st = ops::sample_tokens(logits, row(3), s.lens, sc);
    auto* out = static_cast<std::byte*>(s.out.raw());
    const size_t row_bytes = size_t(B) * 4;
    copy_bytes(out, cfg.device, st.tokens.raw(), cfg.device, row_bytes);
    copy_bytes(out + row_bytes, cfg.device, st.logprobs.raw(), cfg.device, row_bytes);
    copy_bytes(s.in.raw(), cfg.device, st.tokens.raw(), cfg.device, row_bytes);  // next ids
  }
  // Runs the step on the inputs already in `s`: a replay when recorded, else the calls one by one
  // followed (the first time) by recording them for the next step of this batch size.
  void decode(DecodeStep& s, const ops::SampleConfig& sc) {
    if (s.graph.defined()) {
      s.graph.replay(stream->get());
      ++stats.graph_replays;
      return;
    }
    run_step(s, sc);
    ++stats.direct_steps;
    if (!stats.graphs_off.empty() || !graphs_wanted()) return;  // a refused capture is not retried
    try {
      s.graph.capture(cfg.device, stream->get(), [&] { run_step(s, sc); });
      ++stats.graph_captures;
      stats.graph_nodes = s.graph.nodes();
    } catch (const std::exception& e) {
      // A step that cannot be recorded (a recipe whose step reads device values on the host)
      // keeps running call by call, with the same results.
      stats.graphs_off = e.what();
    }
  }

  // Appends the experts of this call's rows to each active sequence's SampleResult::routing:
  // sequence i owns rows first[i] .. last[i].
  template <class A>
  void append_routing(const Routing& routing, std::span<const int32_t> first,
                      std::span<const int32_t> last, const std::vector<A>& active,
                      std::vector<SampleResult>& out) const {
    std::vector<Tensor> moe;  // the MoE layers' [rows, k] on the host, in layer order
    for (const Tensor& t : routing.layers)
      if (t.defined()) moe.push_back(t.to(Device::cpu()).contiguous());
    for (size_t i = 0; i < active.size(); ++i) {
      std::vector<int32_t>& dst = out[active[i].req].routing;
      for (int64_t r = first[i]; r <= last[i]; ++r)
        for (const Tensor& t : moe) {
          const int32_t* row = t.ptr<int32_t>() + r * t.size(1);
          dst.insert(dst.end(), row, row + t.size(1));
        }
    }
  }

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
    drop_steps();
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
  const SamplerConfig& was = impl_->cfg;
  const bool moved = cfg.device != was.device;
  // A recorded step holds the sampling settings and the cache (dtype, device) it was made for;
  // lengths, batch limits and the stop token are the host's business.
  if (moved || cfg.temperature != was.temperature || cfg.top_p != was.top_p ||
      cfg.top_k != was.top_k || cfg.seed != was.seed || cfg.kv != was.kv ||
      cfg.cuda_graphs != was.cuda_graphs || cfg.mode != was.mode)
    impl_->drop_steps();
  impl_->cfg = cfg;
  if (impl_->dec) impl_->dec->set_mode(cfg.mode);
  if (moved) {
    impl_->cache.reset();
    impl_->stream.reset();
    if (impl_->policy) {
      impl_->dec = std::make_unique<Decoder>(decoder_weights(*impl_->policy, cfg.device));
      impl_->dec->set_mode(cfg.mode);
    }
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
  impl_->drop_steps();
  DecoderWeights w = decoder_weights(p, impl_->cfg.device);
  // The rope table depends on the config and dtype alone: a new version of the same model keeps
  // it (an 8192-position table is 0.5M sines and cosines on the host, then a copy to the device).
  const auto norm = w.tensors.find("final_norm");
  if (impl_->dec && impl_->policy && impl_->policy->config == p.config && norm != w.tensors.end() &&
      norm->second.dtype() == impl_->dec->dtype())
    w.rope = impl_->dec->rope_table();
  impl_->dec.reset();  // the old version's device memory first
  impl_->dec = std::make_unique<Decoder>(std::move(w));
  impl_->dec->set_mode(impl_->cfg.mode);
  impl_->policy = std::move(p);
}

double Sampler::replayed_step_seconds(int64_t batch, int reps) {
  Impl& m = *impl_;
  const auto it = m.steps.find(batch);
  if (it == m.steps.end() || !it->second.graph.defined() || reps < 1 || !m.stream) return 0.0;
  const Stream st = m.stream->get();
  synchronize(m.cfg.device, st);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) it->second.graph.replay(st);
  synchronize(m.cfg.device, st);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

std::vector<SampleResult> Sampler::generate(std::span<const SampleRequest> requests) {
  Impl& m = *impl_;
  m.check_ready();
  for (size_t i = 0; i < requests.size(); ++i) m.validate(requests[i].prompt, i);
  const ModelConfig& c = m.policy->config;
  if (m.cfg.record_routing) require_moe_for_replay(c, "sampler record_routing");
  // Every call of a CUDA sampler runs on its own stream (a graph is recorded from one).
  if (m.cfg.device.is_cuda() && !m.stream) m.stream = std::make_unique<OwnedStream>(m.cfg.device);
  const StreamGuard on(m.stream ? m.stream->get() : Stream{});
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
  std::vector<int32_t> ids, first_row, last_row, streams;
  std::vector<int64_t> pos, slots, lens;
  const ops::SampleConfig sc{m.cfg.temperature, m.cfg.top_k, m.cfg.top_p, m.cfg.seed};
  while (next < requests.size() || !active.empty()) {
    while (int64_t(active.size()) < m.cfg.max_batch && next < requests.size())
      active.push_back({next++, cache.acquire(), 0, false});
    ids.clear();
    pos.clear();
    slots.clear();
    first_row.clear();
    last_row.clear();
    streams.clear();
    lens.clear();
    for (Active& a : active) {
      const SampleRequest& r = requests[a.req];
      first_row.push_back(int32_t(ids.size()));
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
    // Takes sequence i's token of a step (its a.len already counts the step): false when that
    // finishes the sequence, whose cache slot is then released.
    auto take = [&](Active& a, int32_t tok, float logp) {
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
      if (done) cache.release(a.slot);
      return !done;
    };
    std::vector<Active> still;
    if (int64_t(ids.size()) == B && dev.is_cuda() && !m.cfg.record_routing) {
      // Decode steps of this batch on the device. Recording the routing takes the call-by-call
      // path below: a graph writes only the step's fixed buffers, and the experts are tensors of
      // each call. With a recorded step and overlap_steps, the steps run ahead up to the first
      // length limit of the batch (known in advance): step j + 1 is queued before step j's tokens
      // are read. A sequence that an eos of step j finishes got one more token from step j + 1,
      // which is dropped (its cache rows are its own and released); the others keep theirs.
      DecodeStep& s = m.step_for(B);
      int64_t run = 1;
      if (s.graph.defined() && m.cfg.overlap_steps) {
        run = std::numeric_limits<int64_t>::max();
        for (const Active& a : active) {
          const int64_t made = int64_t(out[a.req].tokens.size());  // before this step
          run = std::min(run,
                         1 + std::max<int64_t>(0, std::min(m.cfg.max_new - made - 1,
                                                           c.max_position_embeddings - a.len - 1)));
        }
      }
      const Stream st = m.stream->get();
      auto queue = [&](int64_t j) {  // step j of the run, inputs from host slot j % 2
        const int h = int(j % 2);
        int32_t* in = s.host_in[h].ptr<int32_t>();
        int64_t* ln = s.host_lens[h].ptr<int64_t>();
        for (int64_t i = 0; i < B; ++i) {
          in[i] = ids[size_t(i)];
          in[B + i] = int32_t(pos[size_t(i)] + j);
          in[2 * B + i] = int32_t(slots[size_t(i)]);
          in[3 * B + i] = streams[size_t(i)];
          ln[i] = lens[size_t(i)] + j;
        }
        // Step 0 sends the ids too; a later step's ids are the previous step's tokens.
        const size_t skip = j == 0 ? 0 : size_t(B) * 4;
        copy_bytes_async(static_cast<std::byte*>(s.in.raw()) + skip, dev,
                         reinterpret_cast<const std::byte*>(in) + skip, Device::cpu(),
                         s.in.nbytes() - skip, st);
        copy_bytes_async(s.lens.raw(), dev, ln, Device::cpu(), s.lens.nbytes(), st);
        m.decode(s, sc);
        copy_bytes_async(s.host_out[h].raw(), Device::cpu(), s.out.raw(), dev, s.out.nbytes(), st);
        s.arrived[h]->record(st);
      };
      std::vector<char> live(size_t(B), 1);
      try {
        queue(0);
        for (int64_t j = 0; j < run; ++j) {
          if (j + 1 < run) {
            queue(j + 1);
            ++m.stats.steps_ahead;
          }
          s.arrived[j % 2]->synchronize();
          const int32_t* o = s.host_out[j % 2].ptr<int32_t>();
          bool finished = false;
          for (int64_t i = 0; i < B; ++i) {
            if (!live[size_t(i)]) continue;
            Active& a = active[size_t(i)];
            if (j > 0) ++a.len;
            float logp;
            std::memcpy(&logp, o + B + i, sizeof logp);
            if (!take(a, o[i], logp)) live[size_t(i)] = 0, finished = true;
          }
          // Step j + 1, already queued, is the last of the run: the batch changes after it.
          if (finished && j + 1 < run) run = j + 2;
        }
      } catch (...) {
        // A step may still be queued: nothing may free or reuse the host slots before it ends.
        synchronize(dev, st);
        throw;
      }
      for (int64_t i = 0; i < B; ++i)
        if (live[size_t(i)]) still.push_back(active[size_t(i)]);
    } else {
      const Tensor idt = Tensor::from_vector<int32_t>(ids, {int64_t(ids.size())}, DType::kI32);
      Routing routing;
      const Tensor logits =
          m.dec->forward_cached(idt, pos, slots, cache, m.cfg.record_routing ? &routing : nullptr);
      if (m.cfg.record_routing) m.append_routing(routing, first_row, last_row, active, out);
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
      for (int64_t i = 0; i < B; ++i) {
        Active& a = active[size_t(i)];
        if (take(a, tokens.ptr<int32_t>()[i], logprobs.ptr<float>()[i])) still.push_back(a);
      }
    }
    active = std::move(still);
  }
  return out;
}

const SamplerStats& Sampler::stats() const { return impl_->stats; }

Routing replay_routing(const ModelConfig& c, std::span<const SampleResult> samples,
                       std::span<const int64_t> cu) {
  require_moe_for_replay(c, "replay_routing");
  if (cu.size() != samples.size() + 1 || cu.front() != 0)
    throw std::invalid_argument(fmt::format(
        "replay_routing: {} cu_seqlens entries for {} samples (need samples + 1 from 0)", cu.size(),
        samples.size()));
  const int64_t n = cu.back(), k = c.num_experts_per_tok;
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.layer_is_moe(l)) moe_layers.push_back(l);
  const int64_t M = int64_t(moe_layers.size());
  std::vector<std::vector<int32_t>> ids(size_t(M), std::vector<int32_t>(size_t(n * k)));
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::vector<int32_t>& rec = samples[i].routing;
    const int64_t rows = cu[i + 1] - cu[i], recorded = int64_t(rec.size()) / (M * k);
    if (rec.empty() || int64_t(rec.size()) != recorded * M * k || recorded > rows)
      throw std::invalid_argument(fmt::format(
          "replay_routing: sample {} has {} recorded expert ids; need {} per position ({} MoE "
          "layers x top_k {}) for at most its {} rows (record with SamplerConfig::record_routing)",
          i, rec.size(), M * k, M, k, rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t mi = 0; mi < M; ++mi)
        for (int64_t s = 0; s < k; ++s)
          ids[size_t(mi)][size_t((cu[i] + r) * k + s)] =
              r < recorded ? rec[size_t((r * M + mi) * k + s)] : int32_t(s);
  }
  Routing out;
  out.layers.assign(size_t(c.num_hidden_layers), Tensor());
  for (int64_t mi = 0; mi < M; ++mi)
    out.layers[size_t(moe_layers[size_t(mi)])] =
        Tensor::from_vector<int32_t>(ids[size_t(mi)], {n, k}, DType::kI32);
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
