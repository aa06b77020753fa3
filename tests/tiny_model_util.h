// Helpers of the nn / model execution tests: tiny Qwen3 / Qwen3-MoE configs built in memory, random
// weights from Philox (the same bits on every machine and library version), the f32 pass-through
// plan of the float64 gradient checks, and packed batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/model/config.h"
#include "lockstep/model/weights.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/registry.h"

namespace lockstep::test {

struct TinyOptions {
  bool moe = false;
  bool shared_expert = false;
  bool tied = false;
  int64_t layers = 2;
  int64_t hidden = 32;
  int64_t vocab = 16;
  int64_t max_pos = 48;
};

inline model::ModelConfig tiny_config(const TinyOptions& o = {}) {
  model::ModelConfig c;
  c.model_type = o.moe ? "qwen3_moe" : "qwen3";
  c.vocab_size = o.vocab;
  c.hidden_size = o.hidden;
  c.intermediate_size = 2 * o.hidden;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = o.max_pos;
  c.tie_word_embeddings = o.tied;
  if (o.moe) {
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 16;
    c.norm_topk_prob = true;
    c.decoder_sparse_step = 1;
    if (o.layers > 1) c.mlp_only_layers = {0};  // one dense layer, the rest MoE
    if (o.shared_expert) c.shared_expert_intermediate_size = 16;
  }
  return c;
}

// Uniform values in [-scale, scale) from Philox (stream = tensor index); norms 1 + 0.1 u.
inline model::ModelWeights tiny_weights(const model::ModelConfig& c, uint64_t seed,
                                        float scale = 0.25f) {
  model::ModelWeights w;
  w.config = c;
  uint32_t stream = 0;
  for (const auto& [name, shape] : model::weight_shapes(c)) {
    Tensor t(DType::kF32, shape);
    float* p = t.ptr<float>();
    const bool norm = shape.size() == 1;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const uint32_t r = num::philox_element_word(seed, stream, uint64_t(i));
      const float u = float(r >> 8) * (1.0f / 8388608.0f) - 1.0f;  // [-1, 1)
      p[i] = norm ? 1.0f + 0.1f * u : scale * u;
    }
    w.tensors[name] = t;
    ++stream;
  }
  return w;
}

// A recipe every operand of which is f32 (pass-through), with a code override so that router
// and lm_head follow it too: the float64 gradient-check plan.
inline Recipe f32_recipe() {
  Recipe r = builtin_recipe_or_throw("bf16", "test").recipe;
  r.name = "f32_test";
  return r;
}
inline LinearSpec f32_spec(BackwardMode mode = BackwardMode::kQuantized) {
  LinearSpec s;
  for (auto& g : s.gemm) g.a.format = g.b.format = Format::kF32;
  s.backward_mode = mode;
  return s;
}
inline std::vector<CodeOverride> f32_overrides(BackwardMode mode = BackwardMode::kQuantized) {
  return {CodeOverride{"*", f32_spec(mode)}};
}

// Token ids from Philox in [0, vocab).
inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed, uint32_t stream) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = int32_t(num::philox_element_word(seed, stream, uint64_t(i)) % uint32_t(vocab));
  return v;
}

inline Tensor ids_tensor(const std::vector<int32_t>& v) {
  return Tensor::from_vector<int32_t>(v, {int64_t(v.size())}, DType::kI32);
}

}  // namespace lockstep::test
