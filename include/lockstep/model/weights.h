// Model weights in lockstep's layout (fused where the GEMMs are fused) and their conversion from
// and to Hugging Face tensor names, single-file or sharded safetensors, bf16 or f32.
//
// lockstep layout (F32 master weights; H hidden, V vocab, D head_dim, Hq / Hkv heads, I dense
// intermediate, E experts, Ie expert intermediate, Is shared intermediate):
//   embed [V, H]                                  model.embed_tokens.weight
//   layers.L.input_norm [H]                       model.layers.L.input_layernorm.weight
//   layers.L.qkv [(Hq + 2 Hkv) D, H]              rows: self_attn.q_proj | k_proj | v_proj
//   layers.L.q_norm [D], layers.L.k_norm [D]      self_attn.q_norm.weight, self_attn.k_norm.weight
//   layers.L.o_proj [H, Hq D]                     self_attn.o_proj.weight
//   layers.L.post_norm [H]                        post_attention_layernorm.weight
//   dense layer: layers.L.gate_up [2I, H]         rows: mlp.gate_proj | mlp.up_proj
//                layers.L.down [H, I]             mlp.down_proj.weight
//   MoE layer:   layers.L.router [E, H]           mlp.gate.weight
//                layers.L.experts_fc1 [E 2Ie, H]  expert e rows [2Ie e, 2Ie e + Ie) gate_proj,
//                                                 [2Ie e + Ie, 2Ie (e + 1)) up_proj
//                layers.L.experts_fc2 [E H, Ie]   expert e rows [H e, H (e + 1)) down_proj
//                layers.L.shared_gate_up [2Is, H], layers.L.shared_down [H, Is],
//                layers.L.shared_gate [1, H]      mlp.shared_expert.*, mlp.shared_expert_gate
//   final_norm [H]                                model.norm.weight
//   lm_head [V, H]                                lm_head.weight (absent when tied: embed is used)
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/model/config.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/safetensors.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::model {

// Missing, extra or mis-shaped tensors; the message names the file, the tensor and the shape.
class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ModelWeights {
  ModelConfig config;
  std::map<std::string, Tensor> tensors;  // lockstep names above, F32 host tensors
  const Tensor& at(const std::string& name) const;
  Tensor& at(const std::string& name);
};

// One Hugging Face tensor inside a lockstep tensor: rows [row0, row0 + hf_shape[0]) of it (a 1-D
// tensor is one piece covering it).
struct HfPiece {
  std::string hf;
  int64_t row0 = 0;
  std::vector<int64_t> hf_shape;
};
struct HfLayoutEntry {
  std::string name;  // lockstep name
  std::vector<int64_t> shape;
  std::vector<HfPiece> pieces;
};
// The table every conversion below follows: each lockstep tensor of a config and its Hugging Face
// pieces, in the layout's fixed order (embed, layer by layer, norm, head).
std::vector<HfLayoutEntry> hf_layout(const ModelConfig& c);

// Every lockstep tensor name and shape the config implies, in a fixed order.
std::vector<std::pair<std::string, std::vector<int64_t>>> weight_shapes(const ModelConfig& c);
// The number of weights (elements of weight_shapes; a tied head counted once).
int64_t parameter_count(const ModelConfig& c);

// Standard deviation of the random matrices of init_weights.
inline constexpr double kInitStd = 0.02;

// Random initialisation, the same bits on every machine: RMSNorm gains are 1; the matrix at index
// i of weight_shapes(c) draws Philox stream i keyed by `seed`, element k (row-major) being the
// k-th standard normal of that stream (num::philox_normal_f64: Box-Muller in float64 with
// portable log/sin/cos) times kInitStd, rounded once to fp32.
ModelWeights init_weights(const ModelConfig& c, uint64_t seed);

// Hugging Face <-> lockstep layout. from_hf checks that every expected tensor exists with its shape
// and that no unexpected one does (rotary buffers aside; a tied model's lm_head.weight only when
// it equals the embedding), widening BF16 / F16 to F32 exactly. Errors name `where` (or, through
// `file_of`, the file holding the tensor: HF name -> file path).
ModelWeights weights_from_hf(const ModelConfig& c, const std::map<std::string, Tensor>& hf,
                             const std::string& where,
                             const std::map<std::string, std::string>* file_of = nullptr);
std::map<std::string, Tensor> weights_to_hf(const ModelWeights& w, DType dtype);
// The same tensors in the layout's fixed order (embed, layer by layer, norm, head): the order
// save_model_dir writes and shards them in.
std::vector<NamedTensor> weights_to_hf_ordered(const ModelWeights& w, DType dtype);

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard file}}.
struct ShardIndex {
  std::map<std::string, std::string> weight_map;  // HF tensor name -> shard file name
  std::vector<std::string> shards;                // distinct shard file names, sorted
};
// Validates the index's structure (weight_map an object of tensor -> file name; each file name a
// plain "*.safetensors" name inside the directory). Throws WeightsError naming `where` and the
// entry.
ShardIndex parse_shard_index(const Json& j, const std::string& where);
// Checks the index against what the shards hold (shard file name -> tensor names in it): every
// listed tensor is in its shard, no tensor is in two shards, every tensor of a shard is listed.
void check_shard_index(const ShardIndex& index,
                       const std::map<std::string, std::vector<std::string>>& shard_tensors,
                       const std::string& where);

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kSingleWeightsFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

// A model directory: config.json + model.safetensors or model.safetensors.index.json + shards
// (both at once is refused as ambiguous).
ModelWeights load_model_dir(const std::string& dir);
// Writes config.json (with "torch_dtype") and model.safetensors, or, when max_shard_bytes > 0 and
// the tensors do not fit one file of that size, shards model-0000i-of-0000n.safetensors of at
// most max_shard_bytes of tensor data each (a larger tensor gets a shard alone, as transformers
// does) with an index. Each file is written atomically; the other layout's files left from an
// earlier save are removed. dtype F32 or BF16. `metadata` is added to every safetensors file's
// metadata (beside "format": "pt", which transformers requires).
void save_model_dir(const ModelWeights& w, const std::string& dir, DType dtype = DType::kF32,
                    size_t max_shard_bytes = 0,
                    const std::map<std::string, std::string>& metadata = {});

}  // namespace lockstep::model
