// The decoder (model/decoder.h): module construction from DecoderWeights, the packed learner
// forward / backward and the sampler's cached forward. Both executors run the same per-layer code;
// they differ only in where attention reads K and V (the packed sequence or the KV cache) and in
// the attention kernel of the learner's fast mode.
#include "lockstep/model/decoder.h"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "decoder_impl.h"
#include "lockstep/ops/attention.h"

namespace lockstep::model {

std::string_view exec_mode_name(ExecMode m) {
  return m == ExecMode::kDeterministic ? "deterministic" : "fast";
}

std::vector<LinearSite> linear_sites(const ModelConfig& c) {
  std::vector<LinearSite> s;
  for (int l = 0; l < int(c.num_hidden_layers); ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    s.push_back({p + "qkv", ModuleClass::kQkv, l, 1});
    s.push_back({p + "o_proj", ModuleClass::kAttnOut, l, 1});
    if (c.layer_is_moe(l)) {
      s.push_back({p + "router", ModuleClass::kRouter, l, 1});
      s.push_back({p + "experts_fc1", ModuleClass::kExpertsFc1, l, c.num_experts});
      s.push_back({p + "experts_fc2", ModuleClass::kExpertsFc2, l, c.num_experts});
      if (c.shared_expert_intermediate_size > 0) {
        s.push_back({p + "shared_gate_up", ModuleClass::kSharedFc1, l, 1});
        s.push_back({p + "shared_down", ModuleClass::kSharedFc2, l, 1});
        s.push_back({p + "shared_gate", ModuleClass::kCount, l, 1});
      }
    } else {
      s.push_back({p + "gate_up", ModuleClass::kExpertsFc1, l, 1});
      s.push_back({p + "down", ModuleClass::kExpertsFc2, l, 1});
    }
  }
  s.push_back({c.tie_word_embeddings ? "embed" : "lm_head", ModuleClass::kLmHead, -1, 1});
  return s;
}

LinearSpec site_spec(const ModelPlan& plan, const LinearSite& s) {
  // The shared-expert gate [1, H] is a gate like the router: it follows the router's choice.
  if (s.cls == ModuleClass::kCount)
    return plan.per_layer.at(size_t(s.layer)).at(size_t(ModuleClass::kRouter)).spec;
  if (s.cls == ModuleClass::kLmHead) return plan.lm_head.spec;
  return plan.per_layer.at(size_t(s.layer)).at(size_t(s.cls)).spec;
}

namespace {

// The key of a site's prepared operand in DecoderWeights::operands: lm_head is "lm_head" even
// when tied (the sampler's copy of the tied weight in the lm_head's format).
std::string operand_key(const LinearSite& s) {
  return s.cls == ModuleClass::kLmHead ? "lm_head" : s.name;
}

}  // namespace

Decoder::Impl::Impl(DecoderWeights w) : c(w.config), plan(std::move(w.plan)) {
  tensors = std::move(w.tensors);
  grads = std::move(w.grads);
  if (plan.layers != int(c.num_hidden_layers))
    throw std::invalid_argument(fmt::format("decoder: the plan covers {} layers, the config {}",
                                            plan.layers, c.num_hidden_layers));
  hq = c.num_attention_heads;
  hkv = c.num_key_value_heads;
  D = c.head_dim;
  dtype = tensor("final_norm").dtype();
  dev = tensor("final_norm").device();
  if (w.rope.cos.defined()) {
    if (w.rope.max_pos != c.max_position_embeddings || w.rope.head_dim != D ||
        w.rope.device() != dev || w.rope.cos.dtype() != dtype)
      throw std::invalid_argument(fmt::format(
          "decoder: the given rope table ({} positions x {} on {}, {}) is not this config's ({} x "
          "{} on {}, {})",
          w.rope.max_pos, w.rope.head_dim, w.rope.device().str(), dtype_name(w.rope.cos.dtype()),
          c.max_position_embeddings, D, dev.str(), dtype_name(dtype)));
    rope = std::move(w.rope);
  } else {
    rope = ops::rope_table(c.max_position_embeddings, D, c.rope_theta, dtype);
    rope.cos = rope.cos.to(dev);
    rope.sin = rope.sin.to(dev);
  }
  uint32_t stream = 1;
  auto linear = [&](const LinearSite& s) {
    const LinearSpec spec = site_spec(plan, s);
    if (auto it = w.operands.find(operand_key(s)); it != w.operands.end()) {
      const auto [out, in] = w.operand_dims.at(operand_key(s));
      return nn::Linear::from_operand(s.name, it->second, out, in, spec);
    }
    return nn::Linear(s.name, tensor(s.name), grad(s.name), spec, stream++);
  };
  auto grouped = [&](const LinearSite& s) {
    const LinearSpec spec = site_spec(plan, s);
    if (auto it = w.operands.find(s.name); it != w.operands.end()) {
      const auto [out, in] = w.operand_dims.at(s.name);
      return nn::GroupedLinear::from_operand(s.name, it->second, s.groups, out, in, spec);
    }
    return nn::GroupedLinear(s.name, tensor(s.name), grad(s.name), s.groups, spec, stream++);
  };
  std::map<std::string, LinearSite> sites;
  for (const LinearSite& s : linear_sites(c)) sites[s.name] = s;
  auto site = [&](const std::string& n) { return sites.at(n); };
  const double eps = c.rms_norm_eps;
  for (int l = 0; l < int(c.num_hidden_layers); ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    Layer L;
    L.index = l;
    L.moe = c.layer_is_moe(l);
    L.qkv = nn::NormLinear(tensor(p + "input_norm"), grad(p + "input_norm"), eps,
                           linear(site(p + "qkv")));
    L.q_norm = tensor(p + "q_norm");
    L.k_norm = tensor(p + "k_norm");
    L.g_q_norm = grad(p + "q_norm");
    L.g_k_norm = grad(p + "k_norm");
    L.o_proj = linear(site(p + "o_proj"));
    if (L.moe) {
      L.post_norm = tensor(p + "post_norm");
      L.g_post_norm = grad(p + "post_norm");
      std::optional<nn::SharedExpert> shared;
      if (c.shared_expert_intermediate_size > 0)
        shared = nn::SharedExpert{linear(site(p + "shared_gate_up")),
                                  linear(site(p + "shared_down")), linear(site(p + "shared_gate"))};
      L.moe_block =
          nn::MoeBlock(linear(site(p + "router")), grouped(site(p + "experts_fc1")),
                       grouped(site(p + "experts_fc2")),
                       nn::MoeOptions{c.num_experts_per_tok, c.norm_topk_prob}, std::move(shared));
    } else {
      L.gate_up = nn::NormLinear(tensor(p + "post_norm"), grad(p + "post_norm"), eps,
                                 linear(site(p + "gate_up")));
      L.down = linear(site(p + "down"));
    }
    layers.push_back(std::move(L));
  }
  embed = tensor("embed");
  g_embed = grad("embed");
  final_norm = tensor("final_norm");
  g_final_norm = grad("final_norm");
  lm_head = linear(site(c.tie_word_embeddings ? "embed" : "lm_head"));
}

const Tensor& Decoder::Impl::tensor(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end())
    throw std::invalid_argument(fmt::format("decoder: missing tensor '{}'", name));
  return it->second;
}

Tensor Decoder::Impl::grad(const std::string& name) const {
  auto it = grads.find(name);
  return it == grads.end() ? Tensor() : it->second;
}

Tensor Decoder::Impl::final_logits(Tensor& x, bool save, const Tensor& residual) {
  if (residual.defined() && save)
    throw std::logic_error("decoder: a residual fused into a norm in a training forward");
  Tensor rstd;
  const Tensor xf = ops::add_rmsnorm(x, residual, final_norm, c.rms_norm_eps, &rstd,
                                     lm_head.producer_dtype(save));
  if (save) {
    x_final = x;
    final_rstd = rstd;
  }
  return lm_head.forward(xf, save);
}

Decoder::Decoder(DecoderWeights w) : impl_(std::make_unique<Impl>(std::move(w))) {}
Decoder::~Decoder() = default;
const ModelConfig& Decoder::config() const { return impl_->c; }
DType Decoder::dtype() const { return impl_->dtype; }
const ops::RopeTable& Decoder::rope_table() const { return impl_->rope; }

void require_moe_for_replay(const ModelConfig& c, std::string_view what) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.layer_is_moe(l)) return;
  throw std::invalid_argument(fmt::format(
      "{}: routing replay needs a MoE model, and this {} model ({} layers) has no MoE layer: "
      "every token runs the one dense MLP, so there are no expert choices to record or reuse",
      what, c.model_type, c.num_hidden_layers));
}

Tensor Decoder::forward(const Tensor& ids, std::span<const int64_t> cu, ExecMode mode, bool save,
                        const Routing* replay, Routing* record) {
  Impl& m = *impl_;
  const int64_t n = ids.numel();
  m.check_ids(ids);
  if (replay) {
    require_moe_for_replay(m.c, "forward");
    if (replay->layers.size() != m.layers.size())
      throw std::invalid_argument(fmt::format("forward: routing replay has {} layers, the model {}",
                                              replay->layers.size(), m.layers.size()));
    for (const Layer& L : m.layers) {
      const Tensor& r = replay->layers[size_t(L.index)];
      if (L.moe && !(r.defined() && r.dim() == 2 && r.size(0) == n))
        throw std::invalid_argument(
            fmt::format("forward: routing replay of MoE layer {} must be I32 [{}, top_k]; got {}",
                        L.index, n, r.defined() ? r.describe() : "nothing"));
    }
  }
  if (cu.empty() || cu.front() != 0 || cu.back() != n)
    throw std::invalid_argument(fmt::format(
        "forward: cu_seqlens must run from 0 to the {} tokens (got {} entries)", n, cu.size()));
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    if (cu[s + 1] < cu[s])
      throw std::invalid_argument(fmt::format("forward: cu_seqlens decreases at {}", s + 1));
    if (cu[s + 1] - cu[s] > m.c.max_position_embeddings)
      throw std::invalid_argument(
          fmt::format("forward: sequence {} has {} tokens, longer than the configured context "
                      "(max_position_embeddings = {})",
                      s, cu[s + 1] - cu[s], m.c.max_position_embeddings));
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) pos[size_t(t)] = int32_t(t - cu[s]);
  }
  const Tensor positions = Tensor::from_vector<int32_t>(pos, {n}, DType::kI32).to(m.dev);
  const Tensor cut = Tensor::from_vector<int64_t>(cu, {int64_t(cu.size())}, DType::kI64).to(m.dev);
  const ops::AttentionKernel kernel = mode == ExecMode::kDeterministic
                                          ? ops::AttentionKernel::kRowwise
                                          : ops::AttentionKernel::kPrefill;
  m.set_mode(mode);
  const Tensor ids_dev = ids.contiguous().to(m.dev);
  Tensor x = ops::embedding(m.embed, ids_dev);
  if (record) record->layers.assign(m.layers.size(), Tensor());
  for (Layer& L : m.layers) {
    const size_t l = size_t(L.index);
    const Tensor replay_ids = replay && L.moe ? replay->layers[l].contiguous().to(m.dev) : Tensor();
    // New tensors, not in-place adds: the modules keep their inputs for the backward.
    x = ops::add(x, m.attention_packed(L, x, positions, cut, kernel, save));
    x = ops::add(x, m.mlp(L, x, save, replay_ids, record ? &record->layers[l] : nullptr));
  }
  const Tensor logits = m.final_logits(x, save);
  if (save) {
    m.ids = ids_dev;
    m.positions = positions;
    m.cu = cut;
    m.saved = true;
  }
  return logits;
}

void Decoder::backward(const Tensor& dlogits) {
  Impl& m = *impl_;
  if (!m.saved) throw std::logic_error("decoder: backward without a saved forward");
  const Tensor dxf = m.lm_head.backward(dlogits);
  Tensor dw;
  Tensor dx = ops::rmsnorm_backward(dxf, m.x_final, m.final_norm, m.final_rstd, &dw);
  if (m.g_final_norm.defined()) ops::add_inplace(m.g_final_norm, dw);
  for (auto it = m.layers.rbegin(); it != m.layers.rend(); ++it) {
    ops::add_inplace(dx, m.mlp_backward(*it, dx));
    ops::add_inplace(dx, m.attention_backward(*it, dx));
  }
  if (m.g_embed.defined())
    ops::add_inplace(m.g_embed, ops::embedding_backward(dx, m.ids, m.c.vocab_size));
  clear_saved();
}

Tensor Decoder::forward_cached(const Tensor& ids, std::span<const int64_t> positions,
                               std::span<const int64_t> slots, KvCache& cache, Routing* record) {
  Impl& m = *impl_;
  const int64_t n = ids.numel();
  m.check_ids(ids);
  if (int64_t(positions.size()) != n || int64_t(slots.size()) != n)
    throw std::invalid_argument("forward_cached: ids, positions and slots differ in length");
  if (cache.device() != m.dev)
    throw std::invalid_argument(
        fmt::format("forward_cached: the KV cache is on {}, the model on {}", cache.device().str(),
                    m.dev.str()));
  std::vector<int32_t> pos(static_cast<size_t>(n)), slot(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    if (positions[size_t(r)] < 0 || positions[size_t(r)] >= cache.max_pos())
      throw std::invalid_argument(
          fmt::format("forward_cached: position {} is outside the KV cache's {} positions "
                      "(max_position_embeddings = {})",
                      positions[size_t(r)], cache.max_pos(), m.c.max_position_embeddings));
    if (slots[size_t(r)] < 0 || slots[size_t(r)] >= cache.slots())
      throw std::invalid_argument(fmt::format(
          "forward_cached: slot {} is outside the KV cache's {}", slots[size_t(r)], cache.slots()));
    pos[size_t(r)] = int32_t(positions[size_t(r)]);
    slot[size_t(r)] = int32_t(slots[size_t(r)]);
  }
  return forward_cached_device(
      ids.contiguous().to(m.dev), Tensor::from_vector<int32_t>(pos, {n}, DType::kI32).to(m.dev),
      Tensor::from_vector<int32_t>(slot, {n}, DType::kI32).to(m.dev), cache, record);
}

Tensor Decoder::forward_cached_device(const Tensor& ids, const Tensor& pt, const Tensor& st,
                                      KvCache& cache, Routing* record) {
  Impl& m = *impl_;
  const int64_t n = ids.numel();
  for (const Tensor* t : {&ids, &pt, &st})
    if (!t->defined() || t->dtype() != DType::kI32 || t->dim() != 1 || t->numel() != n ||
        t->device() != m.dev)
      throw std::invalid_argument(fmt::format(
          "forward_cached_device: ids, positions and slots must be I32 [{}] on {}; got {}", n,
          m.dev.str(), t->defined() ? t->describe() : "undefined"));
  if (cache.device() != m.dev)
    throw std::invalid_argument(
        fmt::format("forward_cached: the KV cache is on {}, the model on {}", cache.device().str(),
                    m.dev.str()));
  Tensor x = ops::embedding(m.embed, ids);
  if (record) record->layers.assign(m.layers.size(), Tensor());
  // The residual stream: each sublayer's output is added to x by the next norm, in the same
  // kernel (ops::add_rmsnorm: add_inplace's bits, then the norm's).
  Tensor pending;
  for (Layer& L : m.layers) {
    const Tensor a = m.attention_cached(L, x, pending, pt, st, cache);
    pending = m.mlp(L, x, false, Tensor(), record ? &record->layers[size_t(L.index)] : nullptr, a);
  }
  return m.final_logits(x, false, pending);
}

Device Decoder::device() const { return impl_->dev; }

void Decoder::set_mode(ExecMode mode) { impl_->set_mode(mode); }

void Decoder::set_kv_dtype(KvDtype dtype) { impl_->kv = dtype; }

void Decoder::Impl::set_mode(ExecMode m) {
  if (mode == m) return;
  mode = m;
  const GemmOrder o = m == ExecMode::kDeterministic ? GemmOrder::kBatchInvariant : GemmOrder::kFast;
  for (Layer& L : layers) {
    L.qkv.linear().set_gemm_order(o);
    L.o_proj.set_gemm_order(o);
    if (L.moe) {
      L.moe_block.set_gemm_order(o);
    } else {
      L.gate_up.linear().set_gemm_order(o);
      L.down.set_gemm_order(o);
    }
  }
  lm_head.set_gemm_order(o);
}

void Decoder::weights_changed() {
  Impl& m = *impl_;
  for (Layer& L : m.layers) {
    L.qkv.linear().weights_changed();
    L.o_proj.weights_changed();
    if (L.moe) {
      L.moe_block.weights_changed();
    } else {
      L.gate_up.linear().weights_changed();
      L.down.weights_changed();
    }
  }
  m.lm_head.weights_changed();
}

void Decoder::set_grad_seed(uint64_t seed) {
  Impl& m = *impl_;
  for (Layer& L : m.layers) {
    L.qkv.linear().set_grad_seed(seed);
    L.o_proj.set_grad_seed(seed);
    if (L.moe) {
      L.moe_block.set_grad_seed(seed);
    } else {
      L.gate_up.linear().set_grad_seed(seed);
      L.down.set_grad_seed(seed);
    }
  }
  m.lm_head.set_grad_seed(seed);
}

size_t Decoder::saved_bytes() const {
  const Impl& m = *impl_;
  size_t n = m.lm_head.saved_bytes();
  for (const Layer& L : m.layers) n += L.saved_bytes();
  return n;
}

void Decoder::clear_saved() {
  Impl& m = *impl_;
  for (Layer& L : m.layers) L.clear_saved();
  m.lm_head.clear_saved();
  m.x_final = m.final_rstd = m.ids = m.positions = m.cu = Tensor();
  m.saved = false;
}

}  // namespace lockstep::model
