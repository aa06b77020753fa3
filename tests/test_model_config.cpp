// Tests of the model configuration: config.json files as transformers 4 and 5 write them for
// Qwen3 and Qwen3-MoE, defaults, the layer rule, round trips, the presets, and one test per
// refusal, each checking that the message names the file and the field.
#include <gtest/gtest.h>

#include "lockstep/model/config.h"
#include "model_test_util.h"

namespace lockstep::model {
namespace {
using test::expect_throw_naming;

// What transformers 5.24 save_pretrained writes for Qwen3Config(vocab_size=32, hidden_size=64,
// intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
// tie_word_embeddings=True) (copied from its output).
const char* kHf5Dense = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": null, "dtype": "float32", "eos_token_id": null, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
  "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 32768,
  "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 4,
  "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": null, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": null,
  "tie_word_embeddings": true, "transformers_version": "5.24.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 32})";

// transformers 5.24 for Qwen3MoeConfig(..., num_experts=4, num_experts_per_tok=2,
// moe_intermediate_size=32, max_position_embeddings=128): experts as num_local_experts, no
// head_dim.
const char* kHf5Moe = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": null, "decoder_sparse_step": 1, "dtype": "float32", "eos_token_id": null,
  "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
  "max_position_embeddings": 128, "mlp_only_layers": [], "model_type": "qwen3_moe",
  "moe_intermediate_size": 32, "norm_topk_prob": false, "num_attention_heads": 4,
  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "num_local_experts": 4, "output_router_logits": false, "pad_token_id": null,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
  "transformers_version": "5.24.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 32})";

// The transformers 4 field set of a published Qwen3-30B-A3B-style config.
const char* kHf4Moe = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

TEST(ModelConfig, ReadsTransformers5Dense) {
  const ModelConfig c = config_from_json(Json::parse(kHf5Dense), "hf5/config.json");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_FALSE(c.is_moe());
  EXPECT_FALSE(c.layer_is_moe(0));
}

TEST(ModelConfig, ReadsTransformers5Moe) {
  const ModelConfig c = config_from_json(Json::parse(kHf5Moe), "hf5moe/config.json");
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.num_experts, 4);  // from num_local_experts
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.head_dim, 16);  // Qwen3-MoE without head_dim: hidden_size / num_attention_heads
  EXPECT_TRUE(c.layer_is_moe(0));
  EXPECT_TRUE(c.layer_is_moe(1));
  EXPECT_FALSE(c.has_dense_layer());
}

TEST(ModelConfig, ReadsTransformers4Moe) {
  const ModelConfig c = config_from_json(Json::parse(kHf4Moe), "hf4moe/config.json");
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_EQ(c.num_hidden_layers, 48);
}

TEST(ModelConfig, DefaultsFollowTransformers) {
  Json j = Json::parse(kHf5Dense);
  for (const char* k : {"head_dim", "rope_parameters", "rms_norm_eps", "max_position_embeddings",
                        "tie_word_embeddings", "bos_token_id", "eos_token_id"})
    j.erase(k);
  ModelConfig c = config_from_json(j, "x");
  EXPECT_EQ(c.head_dim, 128);  // Qwen3Config's default head_dim
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.tie_word_embeddings);
  j["num_key_value_heads"] = nullptr;  // null means as many as the query heads
  EXPECT_EQ(config_from_json(j, "x").num_key_value_heads, 4);
  j["eos_token_id"] = Json::array({7, 9});  // several eos ids: the first is kept
  EXPECT_EQ(config_from_json(j, "x").eos_token_id, 7);

  Json m = Json::parse(kHf5Moe);
  m.erase("norm_topk_prob");
  m.erase("decoder_sparse_step");
  m.erase("mlp_only_layers");
  c = config_from_json(m, "x");
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  m["head_dim"] = 32;  // an explicit head_dim wins over hidden / heads
  EXPECT_EQ(config_from_json(m, "x").head_dim, 32);
}

TEST(ModelConfig, RopeThetaBothSpellings) {
  Json j = Json::parse(kHf5Dense);
  j.erase("rope_parameters");
  j["rope_theta"] = 5e5;
  EXPECT_EQ(config_from_json(j, "x").rope_theta, 5e5);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_EQ(config_from_json(j, "x").rope_theta, 5e5);
}

TEST(ModelConfig, LayerIsMoeFollowsTransformersRule) {
  ModelConfig c = preset("tiny-moe");
  c.num_hidden_layers = 8;
  c.decoder_sparse_step = 2;
  c.mlp_only_layers = {3, 6};
  // (l not in mlp_only_layers) and (l + 1) % 2 == 0: layers 1, 5, 7.
  const std::vector<bool> expect = {false, true, false, false, false, true, false, true};
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(c.layer_is_moe(l), expect[size_t(l)]) << "layer " << l;
  EXPECT_TRUE(c.has_dense_layer());
  c.num_experts = 0;  // no experts: every layer is dense
  for (int64_t l = 0; l < 8; ++l) EXPECT_FALSE(c.layer_is_moe(l));
  ModelConfig d = preset("tiny-dense");
  d.num_experts = 4;  // expert fields do not make a "qwen3" model MoE
  EXPECT_FALSE(d.layer_is_moe(0));
}

TEST(ModelConfig, RoundTrips) {
  std::vector<ModelConfig> configs;
  for (const auto& name : preset_names()) configs.push_back(preset(name));
  ModelConfig mixed = preset("tiny-moe");
  mixed.num_hidden_layers = 6;
  mixed.decoder_sparse_step = 2;
  mixed.mlp_only_layers = {5, 1};
  mixed.shared_expert_intermediate_size = 32;
  mixed.norm_topk_prob = false;
  mixed.tie_word_embeddings = true;
  mixed.eos_token_id.reset();
  mixed.rope_theta = 12345.678;
  mixed.rms_norm_eps = 1.25e-5;
  configs.push_back(mixed);
  ModelConfig wide = preset("tiny-dense");
  wide.head_dim = 40;  // heads x head_dim != hidden, as Qwen3-0.6B
  wide.num_key_value_heads = 4;
  configs.push_back(wide);
  configs.push_back(config_from_json(Json::parse(kHf4Moe), "x"));
  for (const ModelConfig& c : configs) {
    const Json j = config_to_json(c);
    EXPECT_TRUE(config_from_json(j, "roundtrip") == c) << j.dump();
    EXPECT_TRUE(config_from_json(Json::parse(j.dump()), "text") == c) << j.dump();
    EXPECT_NO_THROW(validate_config(c, "validate"));
  }
}

TEST(ModelConfig, WritesTransformersFieldNames) {
  const Json j = config_to_json(preset("tiny-moe"));
  EXPECT_EQ(j.at("architectures"), Json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(j.at("num_experts"), 8);
  EXPECT_EQ(j.at("head_dim"), 16);
  EXPECT_EQ(j.at("rope_theta"), 1e6);
  EXPECT_EQ(j.at("rope_scaling"), nullptr);
  EXPECT_EQ(j.at("hidden_act"), "silu");
  EXPECT_FALSE(j.contains("shared_expert_intermediate_size"));  // not a Qwen3-MoE field
  const Json d = config_to_json(preset("tiny-dense"));
  EXPECT_EQ(d.at("architectures"), Json::array({"Qwen3ForCausalLM"}));
  EXPECT_FALSE(d.contains("num_experts"));
}

TEST(ModelConfig, Presets) {
  const auto names = preset_names();
  ASSERT_EQ(names,
            (std::vector<std::string>{"tiny-dense", "tiny-moe", "gpu-moe", "qwen3-30b-a3b-4l"}));
  // The benchmark preset has Qwen3-30B-A3B's shapes (its config.json) with 4 layers.
  const ModelConfig big = preset("qwen3-30b-a3b-4l");
  EXPECT_EQ(big.vocab_size, 151936);
  EXPECT_EQ(big.hidden_size, 2048);
  EXPECT_EQ(big.num_attention_heads, 32);
  EXPECT_EQ(big.num_key_value_heads, 4);
  EXPECT_EQ(big.head_dim, 128);
  EXPECT_EQ(big.num_experts, 128);
  EXPECT_EQ(big.num_experts_per_tok, 8);
  EXPECT_EQ(big.moe_intermediate_size, 768);
  EXPECT_EQ(big.num_hidden_layers, 4);
  // The GPU main job's preset: 50-200M parameters, every GEMM K a multiple of 128.
  const ModelConfig g = preset("gpu-moe");
  const int64_t H = g.hidden_size, I = g.moe_intermediate_size, E = g.num_experts;
  const int64_t attn = H * (g.num_attention_heads + 2 * g.num_key_value_heads) * g.head_dim +
                       g.num_attention_heads * g.head_dim * H;
  const int64_t params =
      g.num_hidden_layers * (attn + H * E + E * 3 * H * I) + 2 * g.vocab_size * H;
  EXPECT_GE(params, 50'000'000);
  EXPECT_LE(params, 200'000'000);
  for (int64_t k : {H, I, g.num_attention_heads * g.head_dim}) EXPECT_EQ(k % 128, 0) << k;
  const ModelConfig moe = preset("tiny-moe");
  EXPECT_EQ(moe.model_type, "qwen3_moe");
  EXPECT_EQ(moe.vocab_size, 32);
  EXPECT_EQ(moe.hidden_size, 64);
  EXPECT_EQ(moe.num_hidden_layers, 4);
  EXPECT_EQ(moe.num_attention_heads * moe.head_dim, 64);
  EXPECT_EQ(moe.num_key_value_heads, 2);
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.num_experts_per_tok, 2);
  EXPECT_EQ(moe.moe_intermediate_size, 64);
  EXPECT_EQ(moe.max_position_embeddings, 128);
  EXPECT_TRUE(moe.norm_topk_prob);
  EXPECT_FALSE(moe.tie_word_embeddings);
  for (int64_t l = 0; l < 4; ++l) EXPECT_TRUE(moe.layer_is_moe(l));
  const ModelConfig dense = preset("tiny-dense");
  EXPECT_EQ(dense.model_type, "qwen3");
  EXPECT_EQ(dense.intermediate_size, 128);
  EXPECT_FALSE(dense.has_dense_layer() == false);
  for (const auto& n : names) EXPECT_FALSE(preset_description(n).empty());
  expect_throw_naming<ConfigError>([] { preset("huge"); }, {"huge", "tiny-dense", "tiny-moe"});
}

// One refusal per rule: (name, mutation of a valid config, the field the message must name).
struct Refusal {
  std::string what;
  std::function<void(Json&)> mutate;
  std::string field;
};

void run_refusals(const char* base, const std::vector<Refusal>& cases) {
  for (const Refusal& r : cases) {
    Json j = Json::parse(base);
    r.mutate(j);
    expect_throw_naming<ConfigError>([&] { config_from_json(j, "dir/config.json"); },
                                     {"dir/config.json", "field '" + r.field + "'"}, r.what);
  }
}

TEST(ModelConfig, RefusalsNameTheField) {
  run_refusals(
      kHf5Dense,
      {
          {"no model_type", [](Json& j) { j.erase("model_type"); }, "model_type"},
          {"llama", [](Json& j) { j["model_type"] = "llama"; }, "model_type"},
          {"no vocab", [](Json& j) { j.erase("vocab_size"); }, "vocab_size"},
          {"string vocab", [](Json& j) { j["vocab_size"] = "32"; }, "vocab_size"},
          {"zero vocab", [](Json& j) { j["vocab_size"] = 0; }, "vocab_size"},
          {"huge vocab", [](Json& j) { j["vocab_size"] = uint64_t(1) << 63; }, "vocab_size"},
          {"float hidden", [](Json& j) { j["hidden_size"] = 64.5; }, "hidden_size"},
          {"bool layers", [](Json& j) { j["num_hidden_layers"] = true; }, "num_hidden_layers"},
          {"no heads", [](Json& j) { j.erase("num_attention_heads"); }, "num_attention_heads"},
          {"no kv heads", [](Json& j) { j.erase("num_key_value_heads"); }, "num_key_value_heads"},
          {"kv 3 of 4", [](Json& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads"},
          {"odd head_dim", [](Json& j) { j["head_dim"] = 15; }, "head_dim"},
          {"negative eps", [](Json& j) { j["rms_norm_eps"] = -1e-6; }, "rms_norm_eps"},
          {"zero theta", [](Json& j) { j["rope_theta"] = 0; }, "rope_theta"},
          {"rope scaling",
           [](Json& j) {
             j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
           },
           "rope_scaling"},
          {"yarn", [](Json& j) { j["rope_parameters"]["rope_type"] = "yarn"; },
           "rope_parameters.rope_type"},
          {"rope factor", [](Json& j) { j["rope_parameters"]["factor"] = 2.0; },
           "rope_parameters.factor"},
          {"theta disagree", [](Json& j) { j["rope_theta"] = 5.0; }, "rope_parameters.rope_theta"},
          {"rope params list", [](Json& j) { j["rope_parameters"] = Json::array(); },
           "rope_parameters"},
          {"bias", [](Json& j) { j["attention_bias"] = true; }, "attention_bias"},
          {"mlp bias", [](Json& j) { j["mlp_bias"] = true; }, "mlp_bias"},
          {"gelu", [](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
          {"sliding", [](Json& j) { j["use_sliding_window"] = true; }, "use_sliding_window"},
          {"dropout", [](Json& j) { j["attention_dropout"] = 0.1; }, "attention_dropout"},
          {"layer types", [](Json& j) { j["layer_types"][1] = "sliding_attention"; },
           "layer_types[1]"},
          {"unknown", [](Json& j) { j["foo_bar"] = 1; }, "foo_bar"},
          {"quantized",
           [](Json& j) {
             j["quantization_config"] = {{"quant_method", "fp8"}};
           },
           "quantization_config"},
          {"tie string", [](Json& j) { j["tie_word_embeddings"] = "yes"; }, "tie_word_embeddings"},
          {"max pos 0", [](Json& j) { j["max_position_embeddings"] = 0; },
           "max_position_embeddings"},
          {"eos -1", [](Json& j) { j["eos_token_id"] = -1; }, "eos_token_id"},
          {"eos list",
           [](Json& j) {
             j["eos_token_id"] = Json::array({2, "x"});
           },
           "eos_token_id[1]"},
          {"no intermediate", [](Json& j) { j.erase("intermediate_size"); }, "intermediate_size"},
          {"experts in dense", [](Json& j) { j["num_experts"] = 4; }, "num_experts"},
          {"encoder-decoder", [](Json& j) { j["is_encoder_decoder"] = true; },
           "is_encoder_decoder"},
      });
  run_refusals(
      kHf5Moe,
      {
          {"no experts", [](Json& j) { j.erase("num_local_experts"); }, "num_experts"},
          {"experts disagree", [](Json& j) { j["num_experts"] = 8; }, "num_local_experts"},
          {"top-k > experts", [](Json& j) { j["num_experts_per_tok"] = 5; }, "num_experts_per_tok"},
          {"top-k 0", [](Json& j) { j["num_experts_per_tok"] = 0; }, "num_experts_per_tok"},
          {"no moe size", [](Json& j) { j.erase("moe_intermediate_size"); },
           "moe_intermediate_size"},
          {"sparse step 0", [](Json& j) { j["decoder_sparse_step"] = 0; }, "decoder_sparse_step"},
          {"mlp_only out of range", [](Json& j) { j["mlp_only_layers"] = {2}; },
           "mlp_only_layers[0]"},
          {"mlp_only twice",
           [](Json& j) {
             j["mlp_only_layers"] = {1, 1};
           },
           "mlp_only_layers[1]"},
          {"mlp_only not a list", [](Json& j) { j["mlp_only_layers"] = 1; }, "mlp_only_layers"},
          {"dense layer needs intermediate",
           [](Json& j) {
             j["mlp_only_layers"] = {0};
             j.erase("intermediate_size");
           },
           "intermediate_size"},
          {"head_dim not derivable", [](Json& j) { j["hidden_size"] = 66; }, "head_dim"},
          {"norm_topk int", [](Json& j) { j["norm_topk_prob"] = 1; }, "norm_topk_prob"},
          {"shared negative", [](Json& j) { j["shared_expert_intermediate_size"] = -1; },
           "shared_expert_intermediate_size"},
      });
  expect_throw_naming<ConfigError>([] { config_from_json(Json::array(), "a.json"); },
                                   {"a.json", "object"});
}

TEST(ModelConfig, ValidateRefusesWhatAFileCannotSay) {
  ModelConfig d = preset("tiny-dense");
  d.num_experts = 4;  // a dense config.json has no expert fields
  EXPECT_THROW(validate_config(d, "code"), ConfigError);
  ModelConfig m = preset("tiny-moe");
  m.mlp_only_layers = {1, 1};
  expect_throw_naming<ConfigError>([&] { validate_config(m, "code"); }, {"mlp_only_layers[1]"});
  m = preset("tiny-moe");
  m.num_experts_per_tok = 9;
  expect_throw_naming<ConfigError>([&] { validate_config(m, "code"); }, {"num_experts_per_tok"});
}

TEST(ModelConfig, LoadConfigNamesTheFile) {
  test::ScratchDir dir;
  const std::string good = dir.write("config.json", kHf5Moe);
  EXPECT_EQ(load_config(good).num_experts, 4);
  const std::string bad = dir.write("bad.json", "{\"model_type\": \"qwen3\",");
  expect_throw_naming<ConfigError>([&] { load_config(bad); }, {bad, "not valid JSON"});
  const std::string none = dir.str("absent.json");
  expect_throw_naming<ConfigError>([&] { load_config(none); }, {none, "cannot open"});
}

}  // namespace
}  // namespace lockstep::model
