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
#include <string>
#include <vector>

#include "lockstep/model/config.h"
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

// Every lockstep tensor name and shape the config implies, in a fixed order.
std::vector<std::pair<std::string, std::vector<int64_t>>> weight_shapes(const ModelConfig& c);

// Random initialisation (Philox keyed by seed: normal(0, 0.02) for matrices, ones for norms),
// the same bits on every machine.
ModelWeights init_weights(const ModelConfig& c, uint64_t seed);

// Hugging Face <-> lockstep layout. from_hf checks that every expected tensor exists with its shape
// and that no unexpected one does (rotary buffers aside), widening BF16 / F16 to F32 exactly.
ModelWeights weights_from_hf(const ModelConfig& c, const std::map<std::string, Tensor>& hf,
                             const std::string& where);
std::map<std::string, Tensor> weights_to_hf(const ModelWeights& w, DType dtype);

// A model directory: config.json + model.safetensors or model.safetensors.index.json + shards.
ModelWeights load_model_dir(const std::string& dir);
// Writes config.json and model.safetensors (or shards of at most max_shard_bytes with an index),
// atomically per file; dtype F32 or BF16.
void save_model_dir(const ModelWeights& w, const std::string& dir, DType dtype = DType::kF32,
                    size_t max_shard_bytes = 0);

}  // namespace lockstep::model
