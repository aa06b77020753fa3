// `lockstep inspect MODEL_DIR`: loads a model directory (config.json + safetensors, single or
// sharded) with every check load_model_dir makes, and lists the configuration and the weights in
// lockstep's fused layout, each with an FNV-1a 64 checksum of its F32 bytes so another tool can
// verify the layout without reading lockstep's memory.
#include <fmt/format.h>

#include "commands.h"
#include "lockstep/model/weights.h"

namespace lockstep::cli {

namespace {

// FNV-1a 64 over the bytes of a contiguous host tensor.
uint64_t fnv1a64(std::span<const std::byte> bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) {
    h ^= uint64_t(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

void inspect_model_dir(const std::string& dir, bool json) {
  const model::ModelWeights w = model::load_model_dir(dir);
  const model::ModelConfig& c = w.config;
  Json tensors = Json::array();
  for (const auto& [name, shape] : model::weight_shapes(c))
    tensors.push_back({{"name", name},
                       {"shape", shape},
                       {"fnv1a64", fmt::format("{:016x}", fnv1a64(w.at(name).bytes()))}});
  Json layers = Json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    layers.push_back(c.layer_is_moe(l) ? "moe" : "dense");
  if (json) {
    fmt::print("{}\n", Json{{"model_dir", dir},
                            {"config", Json(model::config_to_json(c))},
                            {"parameters", model::parameter_count(c)},
                            {"layers", layers},
                            {"tensors", tensors}}
                           .dump(2));
    return;
  }
  fmt::print(
      "{}: {} model, vocab {}, hidden {}, {} layers, {} x {} heads ({} kv), {} parameters{}\n", dir,
      c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
      c.head_dim, c.num_key_value_heads, model::parameter_count(c),
      c.tie_word_embeddings ? ", tied head" : "");
  if (c.is_moe())
    fmt::print("experts {} top-{} of {} ({}normalised), {} MoE layers of {}\n", c.num_experts,
               c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob ? "" : "not ",
               std::count(layers.begin(), layers.end(), "moe"), c.num_hidden_layers);
  size_t width = 0;
  for (const auto& t : tensors) width = std::max(width, t["name"].get<std::string>().size());
  for (const auto& t : tensors)
    fmt::print("  {:<{}}  {:<14}  {}\n", t["name"].get<std::string>(), width,
               shape_string(t["shape"].get<std::vector<int64_t>>()),
               t["fnv1a64"].get<std::string>());
}

}  // namespace lockstep::cli
