// The lockstep weight layout of a ModelConfig (names, shapes, fixed order), its correspondence to
// Hugging Face tensor names (row blocks of fused tensors), random initialisation, and the
// conversions between the two layouts. One table (hf_layout) drives all of them.
#include <fmt/format.h>

#include <cstring>
#include <set>

#include "lockstep/model/weights.h"
#include "lockstep/numerics/gaussian.h"
#include "lockstep/quant/quantize.h"

namespace lockstep::model {

namespace {

// Stacks pieces of [rows_i, cols] along dimension 0.
HfLayoutEntry stacked(std::string name, int64_t cols,
                      std::vector<std::pair<std::string, int64_t>> parts) {
  HfLayoutEntry e{std::move(name), {}, {}};
  int64_t rows = 0;
  for (auto& [hf, r] : parts) {
    e.pieces.push_back({std::move(hf), rows, {r, cols}});
    rows += r;
  }
  e.shape = {rows, cols};
  return e;
}

HfLayoutEntry vector_entry(std::string name, std::string hf, int64_t n) {
  return {std::move(name), {n}, {{std::move(hf), 0, {n}}}};
}

}  // namespace

std::vector<HfLayoutEntry> hf_layout(const ModelConfig& c) {
  const int64_t H = c.hidden_size, V = c.vocab_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  std::vector<HfLayoutEntry> out;
  out.push_back(stacked("embed", H, {{"model.embed_tokens.weight", V}}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    const std::string hp = fmt::format("model.layers.{}.", l);
    out.push_back(vector_entry(p + "input_norm", hp + "input_layernorm.weight", H));
    out.push_back(stacked(p + "qkv", H,
                          {{hp + "self_attn.q_proj.weight", Hq * D},
                           {hp + "self_attn.k_proj.weight", Hkv * D},
                           {hp + "self_attn.v_proj.weight", Hkv * D}}));
    out.push_back(vector_entry(p + "q_norm", hp + "self_attn.q_norm.weight", D));
    out.push_back(vector_entry(p + "k_norm", hp + "self_attn.k_norm.weight", D));
    out.push_back(stacked(p + "o_proj", Hq * D, {{hp + "self_attn.o_proj.weight", H}}));
    out.push_back(vector_entry(p + "post_norm", hp + "post_attention_layernorm.weight", H));
    if (!c.layer_is_moe(l)) {
      const int64_t I = c.intermediate_size;
      out.push_back(stacked(p + "gate_up", H,
                            {{hp + "mlp.gate_proj.weight", I}, {hp + "mlp.up_proj.weight", I}}));
      out.push_back(stacked(p + "down", I, {{hp + "mlp.down_proj.weight", H}}));
      continue;
    }
    const int64_t E = c.num_experts, Ie = c.moe_intermediate_size;
    out.push_back(stacked(p + "router", H, {{hp + "mlp.gate.weight", E}}));
    std::vector<std::pair<std::string, int64_t>> fc1, fc2;
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = fmt::format("{}mlp.experts.{}.", hp, e);
      fc1.emplace_back(ep + "gate_proj.weight", Ie);
      fc1.emplace_back(ep + "up_proj.weight", Ie);
      fc2.emplace_back(ep + "down_proj.weight", H);
    }
    out.push_back(stacked(p + "experts_fc1", H, std::move(fc1)));
    out.push_back(stacked(p + "experts_fc2", Ie, std::move(fc2)));
    if (const int64_t Is = c.shared_expert_intermediate_size; Is > 0) {
      out.push_back(stacked(p + "shared_gate_up", H,
                            {{hp + "mlp.shared_expert.gate_proj.weight", Is},
                             {hp + "mlp.shared_expert.up_proj.weight", Is}}));
      out.push_back(
          stacked(p + "shared_down", Is, {{hp + "mlp.shared_expert.down_proj.weight", H}}));
      out.push_back(stacked(p + "shared_gate", H, {{hp + "mlp.shared_expert_gate.weight", 1}}));
    }
  }
  out.push_back(vector_entry("final_norm", "model.norm.weight", H));
  if (!c.tie_word_embeddings) out.push_back(stacked("lm_head", H, {{"lm_head.weight", V}}));
  return out;
}

namespace {

bool is_float_source(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

// Buffers transformers may store that are not weights (RoPE's inverse frequencies).
bool is_rotary_buffer(const std::string& name) {
  constexpr std::string_view kSuffix = "rotary_emb.inv_freq";
  return name.size() >= kSuffix.size() &&
         name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

std::string origin_of(const std::string& where, const std::map<std::string, std::string>* file_of,
                      const std::string& hf) {
  if (file_of) {
    auto it = file_of->find(hf);
    if (it != file_of->end()) return it->second;
  }
  return where;
}

}  // namespace

const Tensor& ModelWeights::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw WeightsError(fmt::format("model weights: no tensor '{}'", name));
  return it->second;
}

Tensor& ModelWeights::at(const std::string& name) {
  return const_cast<Tensor&>(std::as_const(*this).at(name));
}

std::vector<std::pair<std::string, std::vector<int64_t>>> weight_shapes(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (auto& e : hf_layout(c)) out.emplace_back(std::move(e.name), std::move(e.shape));
  return out;
}

int64_t parameter_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& [name, shape] : weight_shapes(c)) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    n += k;
  }
  return n;
}

ModelWeights init_weights(const ModelConfig& c, uint64_t seed) {
  validate_config(c, "init_weights");
  ModelWeights w;
  w.config = c;
  const auto shapes = weight_shapes(c);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [name, shape] = shapes[i];
    Tensor t(DType::kF32, shape);
    std::span<float> v = t.data<float>();
    if (shape.size() == 1) {
      std::fill(v.begin(), v.end(), 1.0f);  // RMSNorm gains
    } else {
      // Tensor i of weight_shapes draws Philox stream i; element k (row-major) is the k-th
      // normal of that stream, times 0.02 in float64, rounded once to fp32.
      // Counter-based: every element is its own draw, so the split over threads changes nothing.
      const int64_t n = int64_t(v.size());
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 16))
      for (int64_t k = 0; k < n; ++k)
        v[size_t(k)] = float(num::philox_normal_f64(seed, uint32_t(i), uint64_t(k)) * kInitStd);
    }
    w.tensors.emplace(name, std::move(t));
  }
  return w;
}

ModelWeights weights_from_hf(const ModelConfig& c, const std::map<std::string, Tensor>& hf,
                             const std::string& where,
                             const std::map<std::string, std::string>* file_of) {
  validate_config(c, where);
  const auto layout = hf_layout(c);
  ModelWeights w;
  w.config = c;
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (const HfLayoutEntry& e : layout) {
    Tensor t(DType::kF32, e.shape);
    const int64_t cols = e.shape.size() == 2 ? e.shape[1] : 1;
    for (const HfPiece& p : e.pieces) {
      auto it = hf.find(p.hf);
      if (it == hf.end()) {
        missing.push_back(
            fmt::format("'{}' {} (part of {})", p.hf, shape_string(p.hf_shape), e.name));
        continue;
      }
      used.insert(p.hf);
      const Tensor& src = it->second;
      const std::string origin = origin_of(where, file_of, p.hf);
      if (!is_float_source(src.dtype()))
        throw WeightsError(fmt::format("{}: tensor '{}' has dtype {}; expected F32, BF16 or F16",
                                       origin, p.hf, dtype_name(src.dtype())));
      if (src.shape() != p.hf_shape)
        throw WeightsError(fmt::format("{}: tensor '{}' has shape {}; the config implies {}",
                                       origin, p.hf, shape_string(src.shape()),
                                       shape_string(p.hf_shape)));
      const std::vector<float> values = to_f32(src);  // exact widening of BF16 / F16
      // One NaN or Inf weight makes every logit NaN: refused here, naming the tensor.
      if (const int64_t bad = count_nonfinite(values); bad > 0)
        throw WeightsError(fmt::format(
            "{}: tensor '{}' {} has {} non-finite value(s) (NaN or Inf); lockstep refuses "
            "non-finite weights",
            origin, p.hf, src.describe(), bad));
      std::memcpy(t.data<float>().data() + p.row0 * cols, values.data(),
                  values.size() * sizeof(float));
    }
    w.tensors.emplace(e.name, std::move(t));
  }
  if (!missing.empty())
    throw WeightsError(fmt::format(
        "{}: missing tensor {}{}", where, missing.front(),
        missing.size() > 1 ? fmt::format(" and {} more", missing.size() - 1) : std::string()));
  for (const auto& [name, t] : hf) {
    if (used.contains(name) || is_rotary_buffer(name)) continue;
    if (name == "lm_head.weight" && c.tie_word_embeddings) {
      // A tied checkpoint may still store the head; accept it only when it is the embedding.
      const auto emb = to_f32(hf.at("model.embed_tokens.weight"));
      const bool same = t.shape() == std::vector<int64_t>{c.vocab_size, c.hidden_size} &&
                        is_float_source(t.dtype()) && to_f32(t) == emb;
      if (same) continue;
      throw WeightsError(fmt::format(
          "{}: tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' but the config "
          "ties them (tie_word_embeddings true)",
          origin_of(where, file_of, name)));
    }
    throw WeightsError(
        fmt::format("{}: unexpected tensor '{}' {}: the config implies no such weight",
                    origin_of(where, file_of, name), name, shape_string(t.shape())));
  }
  return w;
}

std::vector<NamedTensor> weights_to_hf_ordered(const ModelWeights& w, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    throw WeightsError(
        fmt::format("weights_to_hf: dtype {} is not F32, BF16 or F16", dtype_name(dtype)));
  const auto layout = hf_layout(w.config);
  std::vector<NamedTensor> out;
  std::set<std::string> expected;
  for (const HfLayoutEntry& e : layout) {
    expected.insert(e.name);
    const Tensor& t = w.at(e.name);
    if (t.dtype() != DType::kF32 || !t.is_cpu() || t.shape() != e.shape)
      throw WeightsError(
          fmt::format("model weights: tensor '{}' is {}; the config implies {} F32 on the CPU",
                      e.name, t.describe(), shape_string(e.shape)));
    const Tensor src = t.contiguous();
    const int64_t cols = e.shape.size() == 2 ? e.shape[1] : 1;
    for (const HfPiece& p : e.pieces) {
      const int64_t n = p.hf_shape[0] * (p.hf_shape.size() == 2 ? p.hf_shape[1] : 1);
      std::span<const float> values = src.data<float>().subspan(size_t(p.row0 * cols), size_t(n));
      out.push_back({p.hf, from_f32(values, p.hf_shape, dtype)});
    }
  }
  for (const auto& [name, t] : w.tensors)
    if (!expected.contains(name))
      throw WeightsError(
          fmt::format("model weights: unexpected tensor '{}' {}: the config implies no such weight",
                      name, t.describe()));
  return out;
}

std::map<std::string, Tensor> weights_to_hf(const ModelWeights& w, DType dtype) {
  std::map<std::string, Tensor> out;
  for (auto& nt : weights_to_hf_ordered(w, dtype))
    out.emplace(std::move(nt.name), std::move(nt.tensor));
  return out;
}

}  // namespace lockstep::model
