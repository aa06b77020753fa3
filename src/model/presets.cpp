// The built-in model presets: one row per preset in one table (name, one-line description, the
// configuration). tiny-*: the CPU main job (an RL run of a few minutes on 2 cores); gpu-moe: the
// GPU main job (an RL run of a few minutes on one H200); qwen3-30b-a3b-4l: Qwen3-30B-A3B's layer
// shapes with 4 layers, for `lockstep bench model` against transformers.
#include <fmt/format.h>

#include <array>

#include "lockstep/model/config.h"

namespace lockstep::model {

namespace {

struct PresetRow {
  std::string_view name;
  std::string_view description;
  ModelConfig (*make)();
};

// The attention and vocabulary both presets share: the RL tasks' 32-token vocabulary (bos 1,
// eos 2), hidden 64, 4 layers, 4 query heads and 2 key/value heads of 16. Every GEMM K (64, 16 x 4
// heads, 64 or 128 intermediate) is a multiple of 16 (NVFP4 blocks) and of 32 where MXFP8 needs.
ModelConfig tiny_base() {
  ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 64;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.max_position_embeddings = 128;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

ModelConfig tiny_dense() {
  ModelConfig c = tiny_base();
  c.model_type = "qwen3";
  c.intermediate_size = 128;
  c.tie_word_embeddings = true;  // as the small Qwen3 dense models
  return c;
}

ModelConfig tiny_moe() {
  ModelConfig c = tiny_base();
  c.model_type = "qwen3_moe";
  c.intermediate_size = 128;  // unused: every layer is MoE (kept for readers that expect it)
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 64;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.tie_word_embeddings = false;
  return c;
}

// The GPU main job's model: the RL tasks' vocabulary, hidden 512, 8 layers of 8 query heads (4 kv)
// of 64, 32 experts top-4 of 384 (about 160M parameters, 26M active per token).
ModelConfig gpu_moe() {
  ModelConfig c = tiny_base();
  c.model_type = "qwen3_moe";
  c.hidden_size = 512;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 1536;  // unused: every layer is MoE
  c.num_experts = 32;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 384;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 512;
  return c;
}

// Qwen3-30B-A3B's layer and vocabulary shapes (its config.json) with 4 of its 48 layers.
ModelConfig qwen3_30b_a3b_4l() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.max_position_embeddings = 8192;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  c.norm_topk_prob = true;
  c.tie_word_embeddings = false;
  c.bos_token_id = 151643;
  c.eos_token_id = 151645;
  return c;
}

constexpr std::array<PresetRow, 4> kPresets{{
    {"tiny-dense", "Qwen3 dense: vocab 32, hidden 64, 4 layers, 4 x 16 heads (2 kv), MLP 128, tied",
     tiny_dense},
    {"tiny-moe",
     "Qwen3-MoE: vocab 32, hidden 64, 4 layers, 4 x 16 heads (2 kv), 8 experts top-2 of 64, "
     "untied",
     tiny_moe},
    {"gpu-moe",
     "Qwen3-MoE for the GPU main job: vocab 32, hidden 512, 8 layers, 8 x 64 heads (4 kv), 32 "
     "experts top-4 of 384, about 160M parameters",
     gpu_moe},
    {"qwen3-30b-a3b-4l",
     "Qwen3-30B-A3B layer shapes, 4 layers: vocab 151936, hidden 2048, 32 x 128 heads (4 kv), 128 "
     "experts top-8 of 768 (benchmarks)",
     qwen3_30b_a3b_4l},
}};

const PresetRow& find_row(std::string_view name) {
  for (const PresetRow& r : kPresets)
    if (r.name == name) return r;
  std::string names;
  for (const PresetRow& r : kPresets) names += (names.empty() ? "" : ", ") + std::string(r.name);
  throw ConfigError(fmt::format("unknown preset '{}'; presets: {}", name, names));
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const PresetRow& r : kPresets) out.emplace_back(r.name);
  return out;
}

ModelConfig preset(std::string_view name) { return find_row(name).make(); }

std::string preset_description(std::string_view name) {
  return std::string(find_row(name).description);
}

}  // namespace lockstep::model
