// The model configuration: a Qwen3 / Qwen3-MoE decoder as Hugging Face `config.json` describes it
// (the same field names), plus the built-in presets sized for the CPU main job.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::model {

// A malformed or inconsistent configuration; the message names the file and the field.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct ModelConfig {
  std::string model_type = "qwen3";  // "qwen3" (dense) or "qwen3_moe"
  int64_t vocab_size = 32;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 128;   // dense MLP
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 16;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1000000.0;
  int64_t max_position_embeddings = 256;
  bool tie_word_embeddings = false;
  // Qwen3-MoE (model_type "qwen3_moe"):
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;           // layer l is MoE when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;      // ... and l is not listed here
  int64_t shared_expert_intermediate_size = 0;  // > 0: a shared expert with a sigmoid gate
  std::optional<int64_t> bos_token_id, eos_token_id;

  bool is_moe() const { return model_type == "qwen3_moe" && num_experts > 0; }
  bool layer_is_moe(int64_t layer) const;
};

// Parses and validates (every field's type and range, head_dim * heads consistency, kv heads
// dividing heads, experts_per_tok <= experts). `where` names the source in errors.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json config_to_json(const ModelConfig& c);  // Hugging Face field names
ModelConfig load_config(const std::string& path);

// Built-in presets: "tiny-dense" and "tiny-moe" (sized for the CPU main job), and others the
// registry lists.
std::vector<std::string> preset_names();
ModelConfig preset(std::string_view name);  // ConfigError listing the names when unknown

}  // namespace lockstep::model
