// The model configuration: a Qwen3 / Qwen3-MoE decoder as Hugging Face `config.json` describes it
// (the same field names), plus the built-in presets sized for the CPU main job.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/recipe/json.h"

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
  int64_t intermediate_size = 128;  // dense MLP
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
  int64_t decoder_sparse_step = 1;              // layer l is MoE when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;         // ... and l is not listed here
  int64_t shared_expert_intermediate_size = 0;  // > 0: a shared expert with a sigmoid gate
  std::optional<int64_t> bos_token_id, eos_token_id;

  bool is_moe() const { return model_type == "qwen3_moe" && num_experts > 0; }
  // Hugging Face Qwen3-MoE's rule: (layer not in mlp_only_layers) and num_experts > 0 and
  // (layer + 1) % decoder_sparse_step == 0; always false for a dense "qwen3" model.
  bool layer_is_moe(int64_t layer) const;
  bool has_dense_layer() const;  // some layer runs the dense MLP (intermediate_size is used)
  bool operator==(const ModelConfig&) const = default;
};

// Parses and validates (every field's type and range, even head_dim, kv heads dividing heads,
// experts_per_tok <= experts, mlp_only_layers inside the model). Fields transformers writes that
// cannot change the math are checked and ignored (docs/model.md lists them); an unknown field is
// refused. `where` names the source in errors: "<where>: field '<name>': <rule>".
ModelConfig config_from_json(const Json& j, const std::string& where);
Json config_to_json(const ModelConfig& c);  // Hugging Face field names
ModelConfig load_config(const std::string& path);
// Checks a config built in code: it must survive config_to_json -> config_from_json unchanged
// (so every value is in range and a file written from it reads back the same model).
void validate_config(const ModelConfig& c, const std::string& where);

// Built-in presets: "tiny-dense" and "tiny-moe" (sized for the CPU main job), and others the
// registry lists.
std::vector<std::string> preset_names();
ModelConfig preset(std::string_view name);  // ConfigError listing the names when unknown
std::string preset_description(std::string_view name);  // one line, for `lockstep presets`

}  // namespace lockstep::model
