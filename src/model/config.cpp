// Hugging Face config.json <-> ModelConfig for Qwen3 and Qwen3-MoE: every field transformers
// writes is either parsed, checked and ignored (it cannot change the math), or refused by name.
// Defaults for absent fields follow transformers' Qwen3Config / Qwen3MoeConfig where they are
// conventions; fields that fix the model's size have no silent default.
#include "lockstep/model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "json_file.h"

namespace lockstep::model {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& field, const std::string& why) {
  throw ConfigError(fmt::format("{}: field '{}': {}", where, field, why));
}

// Sanity bounds on every size, chosen so that any product weight_shapes forms (for example
// E * 2 Ie * H over all layers) fits int64 bytes with room to spare; real models are far below.
constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxHidden = int64_t(1) << 18;
constexpr int64_t kMaxIntermediate = int64_t(1) << 20;
constexpr int64_t kMaxLayers = int64_t(1) << 10;
constexpr int64_t kMaxHeads = int64_t(1) << 12;
constexpr int64_t kMaxHeadDim = int64_t(1) << 12;
constexpr int64_t kMaxExperts = int64_t(1) << 12;
constexpr int64_t kMaxPositions = int64_t(1) << 24;
// transformers' Qwen3Config default head_dim (Qwen3MoeConfig has none: hidden / heads).
constexpr int64_t kQwen3DefaultHeadDim = 128;
// transformers' default rope_theta when a config names none.
constexpr double kDefaultRopeTheta = 10000.0;
constexpr int64_t kDefaultMaxPositions = 32768;

int64_t get_int(const Json& v, const std::string& where, const std::string& field, int64_t lo,
                int64_t hi) {
  if (!v.is_number_integer())
    fail(where, field, fmt::format("must be an integer, got {}", v.dump()));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))
    fail(where, field, fmt::format("{} is above the limit {}", v.dump(), hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) fail(where, field, fmt::format("{} is outside [{}, {}]", x, lo, hi));
  return x;
}

double get_positive_double(const Json& v, const std::string& where, const std::string& field) {
  if (!v.is_number()) fail(where, field, fmt::format("must be a number, got {}", v.dump()));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x <= 0.0)
    fail(where, field, fmt::format("must be a finite number > 0, got {}", v.dump()));
  return x;
}

bool get_bool(const Json& v, const std::string& where, const std::string& field) {
  if (!v.is_boolean()) fail(where, field, fmt::format("must be true or false, got {}", v.dump()));
  return v.get<bool>();
}

// A token id: an integer >= 0, null (none), or a list of them (transformers allows several eos
// ids; lockstep keeps the first, which is the one its sampler stops at).
// A token id (or a list of them, the first one used) inside the vocabulary: [0, vocab_size).
std::optional<int64_t> get_token_id(const Json& v, const std::string& where,
                                    const std::string& field, int64_t vocab_size) {
  if (v.is_null()) return std::nullopt;
  if (v.is_array()) {
    if (v.empty()) return std::nullopt;
    for (size_t i = 0; i < v.size(); ++i)
      get_int(v[i], where, fmt::format("{}[{}]", field, i), 0, vocab_size - 1);
    return v[0].get<int64_t>();
  }
  return get_int(v, where, field, 0, vocab_size - 1);
}

// The checks of a field lockstep reads but whose value cannot change the model's math (or must
// have the one value lockstep implements). Returns nothing; throws ConfigError when refused.
using FieldCheck = std::function<void(const Json&, const std::string& where, const std::string&)>;

void any_value(const Json&, const std::string&, const std::string&) {}
FieldCheck must_equal(Json expected, std::string rule) {
  return [expected = std::move(expected), rule = std::move(rule)](
             const Json& v, const std::string& where, const std::string& field) {
    if (v != expected) fail(where, field, fmt::format("{} (got {})", rule, v.dump()));
  };
}
void must_be_false_or_null(const Json& v, const std::string& where, const std::string& field) {
  if (!(v.is_null() || v == Json(false)))
    fail(where, field,
         fmt::format("lockstep implements full attention only; must be false (got {})", v.dump()));
}
void zero_dropout(const Json& v, const std::string& where, const std::string& field) {
  if (!v.is_number() || v.get<double>() != 0.0)
    fail(where, field, fmt::format("lockstep has no dropout; must be 0 (got {})", v.dump()));
}
void full_attention_layers(const Json& v, const std::string& where, const std::string& field) {
  if (v.is_null()) return;
  if (!v.is_array()) fail(where, field, "must be a list of layer types");
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != Json("full_attention"))
      fail(where, fmt::format("{}[{}]", field, i),
           fmt::format("lockstep implements full attention only (got {})", v[i].dump()));
}

// Fields that are accepted without changing the model: bookkeeping, training-only settings of
// transformers, and generation defaults (lockstep's sampler takes its own flags).
const std::map<std::string, FieldCheck, std::less<>>& ignored_fields() {
  static const std::map<std::string, FieldCheck, std::less<>> table = [] {
    std::map<std::string, FieldCheck, std::less<>> t;
    for (const char* name : {"architectures",
                             "torch_dtype",
                             "dtype",
                             "transformers_version",
                             "_name_or_path",
                             "use_cache",
                             "initializer_range",
                             "output_router_logits",
                             "router_aux_loss_coef",
                             "max_window_layers",
                             "pad_token_id",
                             "sliding_window",
                             "return_dict",
                             "output_hidden_states",
                             "output_attentions",
                             "torchscript",
                             "use_return_dict",
                             "id2label",
                             "label2id",
                             "problem_type",
                             "tokenizer_class",
                             "prefix",
                             "sep_token_id",
                             "decoder_start_token_id",
                             "task_specific_params",
                             "finetuning_task",
                             "chunk_size_feed_forward",
                             "is_decoder",
                             "tie_encoder_decoder",
                             "pruned_heads",
                             "_attn_implementation",
                             "_attn_implementation_autoset",
                             "max_length",
                             "min_length",
                             "do_sample",
                             "early_stopping",
                             "num_beams",
                             "num_beam_groups",
                             "diversity_penalty",
                             "temperature",
                             "top_k",
                             "top_p",
                             "typical_p",
                             "repetition_penalty",
                             "length_penalty",
                             "no_repeat_ngram_size",
                             "encoder_no_repeat_ngram_size",
                             "bad_words_ids",
                             "num_return_sequences",
                             "output_scores",
                             "return_dict_in_generate",
                             "forced_bos_token_id",
                             "forced_eos_token_id",
                             "remove_invalid_values",
                             "exponential_decay_length_penalty",
                             "suppress_tokens",
                             "begin_suppress_tokens"})
      t.emplace(name, any_value);
    t.emplace("attention_bias",
              must_equal(false, "lockstep's attention has no bias; must be false"));
    t.emplace("mlp_bias", must_equal(false, "lockstep's MLP has no bias; must be false"));
    t.emplace("hidden_act", must_equal("silu", "lockstep implements SwiGLU; must be \"silu\""));
    t.emplace("rope_scaling", must_equal(nullptr, "lockstep implements plain RoPE; must be null"));
    t.emplace("use_sliding_window", must_be_false_or_null);
    t.emplace("attention_dropout", zero_dropout);
    t.emplace("layer_types", full_attention_layers);
    t.emplace("is_encoder_decoder", must_equal(false, "a decoder-only model; must be false"));
    t.emplace("add_cross_attention", must_equal(false, "no cross attention; must be false"));
    return t;
  }();
  return table;
}

// Fields parsed into ModelConfig (the dense and MoE sets); anything else not in ignored_fields()
// is refused.
const std::set<std::string, std::less<>> kDenseFields = {
    "model_type",          "vocab_size",          "hidden_size",         "intermediate_size",
    "num_hidden_layers",   "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps",        "rope_theta",          "rope_parameters",     "max_position_embeddings",
    "tie_word_embeddings", "bos_token_id",        "eos_token_id"};
const std::set<std::string, std::less<>> kMoeFields = {
    "num_experts",         "num_local_experts",
    "num_experts_per_tok", "moe_intermediate_size",
    "norm_topk_prob",      "decoder_sparse_step",
    "mlp_only_layers",     "shared_expert_intermediate_size"};

const Json* find(const Json& j, std::string_view key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

const Json& require(const Json& j, const std::string& where, const std::string& field,
                    const std::string& why) {
  const Json* v = find(j, field);
  if (!v) fail(where, field, "missing; " + why);
  return *v;
}

double parse_rope_theta(const Json& j, const std::string& where) {
  std::optional<double> theta;
  if (const Json* v = find(j, "rope_theta")) theta = get_positive_double(*v, where, "rope_theta");
  const Json* p = find(j, "rope_parameters");
  if (p && !p->is_null()) {
    if (!p->is_object()) fail(where, "rope_parameters", "must be an object");
    for (const auto& [k, v] : p->items()) {
      const std::string field = "rope_parameters." + k;
      if (k == "rope_type") {
        if (v != Json("default"))
          fail(where, field,
               fmt::format("lockstep implements plain RoPE; must be \"default\" (got {})",
                           v.dump()));
      } else if (k == "rope_theta") {
        const double t = get_positive_double(v, where, field);
        if (theta && *theta != t)
          fail(where, field, fmt::format("{} disagrees with rope_theta {}", t, *theta));
        theta = t;
      } else {
        fail(where, field,
             "not a key of plain RoPE; it would change the rotary embedding, refusing");
      }
    }
  }
  return theta.value_or(kDefaultRopeTheta);
}

void parse_moe(const Json& j, const std::string& where, ModelConfig& c) {
  const Json* ne = find(j, "num_experts");
  const Json* nl = find(j, "num_local_experts");
  if (ne && nl && *ne != *nl)
    fail(where, "num_local_experts",
         fmt::format("{} disagrees with num_experts {}", nl->dump(), ne->dump()));
  if (!ne && !nl) fail(where, "num_experts", "missing (also accepted as num_local_experts)");
  c.num_experts =
      get_int(ne ? *ne : *nl, where, ne ? "num_experts" : "num_local_experts", 0, kMaxExperts);
  if (c.num_experts > 0) {
    c.num_experts_per_tok =
        get_int(require(j, where, "num_experts_per_tok", "a qwen3_moe config needs it"), where,
                "num_experts_per_tok", 1, c.num_experts);
    c.moe_intermediate_size =
        get_int(require(j, where, "moe_intermediate_size", "a qwen3_moe config needs it"), where,
                "moe_intermediate_size", 1, kMaxIntermediate);
  } else {
    // No experts: every layer is dense (transformers' rule); the expert fields are unused.
    if (const Json* v = find(j, "num_experts_per_tok"))
      c.num_experts_per_tok = get_int(*v, where, "num_experts_per_tok", 0, kMaxExperts);
    if (const Json* v = find(j, "moe_intermediate_size"))
      c.moe_intermediate_size = get_int(*v, where, "moe_intermediate_size", 0, kMaxIntermediate);
  }
  if (const Json* v = find(j, "norm_topk_prob"))
    c.norm_topk_prob = get_bool(*v, where, "norm_topk_prob");
  else
    c.norm_topk_prob = false;  // transformers' Qwen3MoeConfig default
  if (const Json* v = find(j, "decoder_sparse_step"))
    c.decoder_sparse_step = get_int(*v, where, "decoder_sparse_step", 1, kMaxLayers);
  c.mlp_only_layers.clear();
  if (const Json* v = find(j, "mlp_only_layers"); v && !v->is_null()) {
    if (!v->is_array()) fail(where, "mlp_only_layers", "must be a list of layer indices");
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string field = fmt::format("mlp_only_layers[{}]", i);
      const int64_t l = get_int((*v)[i], where, field, 0, c.num_hidden_layers - 1);
      if (std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), l) !=
          c.mlp_only_layers.end())
        fail(where, field, fmt::format("layer {} is listed twice", l));
      c.mlp_only_layers.push_back(l);
    }
  }
  if (const Json* v = find(j, "shared_expert_intermediate_size"))
    c.shared_expert_intermediate_size =
        get_int(*v, where, "shared_expert_intermediate_size", 0, kMaxIntermediate);
}

}  // namespace

bool ModelConfig::layer_is_moe(int64_t layer) const {
  if (!is_moe() || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

bool ModelConfig::has_dense_layer() const {
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (!layer_is_moe(l)) return true;
  return false;
}

ModelConfig config_from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) throw ConfigError(fmt::format("{}: a config must be a JSON object", where));
  ModelConfig c;
  const Json& type = require(j, where, "model_type", "must be \"qwen3\" or \"qwen3_moe\"");
  if (type != Json("qwen3") && type != Json("qwen3_moe"))
    fail(where, "model_type",
         fmt::format("lockstep implements \"qwen3\" and \"qwen3_moe\", got {}", type.dump()));
  c.model_type = type.get<std::string>();
  const bool moe_type = c.model_type == "qwen3_moe";

  // Every key is parsed, checked-and-ignored, or refused.
  for (const auto& [key, value] : j.items()) {
    if (kDenseFields.contains(key) || (moe_type && kMoeFields.contains(key))) continue;
    auto ig = ignored_fields().find(key);
    if (ig != ignored_fields().end()) {
      ig->second(value, where, key);
      continue;
    }
    if (kMoeFields.contains(key))
      fail(where, key,
           "a qwen3_moe field in a \"qwen3\" config; set model_type \"qwen3_moe\" or remove it");
    fail(where, key,
         "not a Qwen3 / Qwen3-MoE field lockstep knows; it may change the model, refusing");
  }

  const std::string sizes = "it fixes the model's size";
  c.vocab_size = get_int(require(j, where, "vocab_size", sizes), where, "vocab_size", 1, kMaxVocab);
  c.hidden_size =
      get_int(require(j, where, "hidden_size", sizes), where, "hidden_size", 1, kMaxHidden);
  c.num_hidden_layers = get_int(require(j, where, "num_hidden_layers", sizes), where,
                                "num_hidden_layers", 1, kMaxLayers);
  c.num_attention_heads = get_int(require(j, where, "num_attention_heads", sizes), where,
                                  "num_attention_heads", 1, kMaxHeads);
  const Json& kv =
      require(j, where, "num_key_value_heads", sizes + " (null means num_attention_heads)");
  c.num_key_value_heads = kv.is_null() ? c.num_attention_heads
                                       : get_int(kv, where, "num_key_value_heads", 1, kMaxHeads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(where, "num_key_value_heads",
         fmt::format("{} does not divide num_attention_heads {} (grouped-query attention)",
                     c.num_key_value_heads, c.num_attention_heads));
  if (const Json* v = find(j, "head_dim"); v && !v->is_null()) {
    c.head_dim = get_int(*v, where, "head_dim", 2, kMaxHeadDim);
  } else if (moe_type) {  // transformers' Qwen3-MoE attention: hidden_size // num_attention_heads
    if (c.hidden_size % c.num_attention_heads != 0)
      fail(where, "head_dim",
           fmt::format("absent, and hidden_size {} is not a multiple of num_attention_heads {}",
                       c.hidden_size, c.num_attention_heads));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  } else {
    c.head_dim = kQwen3DefaultHeadDim;  // transformers' Qwen3Config default
  }
  if (c.head_dim % 2 != 0 || c.head_dim < 2)
    fail(where, "head_dim",
         fmt::format("{} must be even (RoPE rotates pairs i, i + head_dim/2)", c.head_dim));
  c.rms_norm_eps = 1e-6;
  if (const Json* v = find(j, "rms_norm_eps"))
    c.rms_norm_eps = get_positive_double(*v, where, "rms_norm_eps");
  c.rope_theta = parse_rope_theta(j, where);
  c.max_position_embeddings = kDefaultMaxPositions;
  if (const Json* v = find(j, "max_position_embeddings"))
    c.max_position_embeddings = get_int(*v, where, "max_position_embeddings", 1, kMaxPositions);
  c.tie_word_embeddings = false;
  if (const Json* v = find(j, "tie_word_embeddings"))
    c.tie_word_embeddings = get_bool(*v, where, "tie_word_embeddings");
  if (const Json* v = find(j, "bos_token_id"))
    c.bos_token_id = get_token_id(*v, where, "bos_token_id", c.vocab_size);
  if (const Json* v = find(j, "eos_token_id"))
    c.eos_token_id = get_token_id(*v, where, "eos_token_id", c.vocab_size);

  if (moe_type) parse_moe(j, where, c);
  c.intermediate_size = 0;
  if (const Json* v = find(j, "intermediate_size"))
    c.intermediate_size = get_int(*v, where, "intermediate_size", 0, kMaxIntermediate);
  if (c.has_dense_layer() && c.intermediate_size == 0)
    fail(where, "intermediate_size",
         find(j, "intermediate_size") ? "must be > 0: the model has a dense MLP layer"
                                      : "missing; the model has a dense MLP layer");
  return c;
}

Json config_to_json(const ModelConfig& c) {
  const bool moe = c.model_type == "qwen3_moe";
  Json j;
  j["architectures"] = Json::array({moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;  // always written: transformers' default differs per model_type
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  // rope_theta at the top level is read by transformers 4 and 5 alike.
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["use_cache"] = true;
  j["bos_token_id"] = c.bos_token_id ? Json(*c.bos_token_id) : Json(nullptr);
  j["eos_token_id"] = c.eos_token_id ? Json(*c.eos_token_id) : Json(nullptr);
  if (moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    if (c.shared_expert_intermediate_size > 0)
      j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  }
  return j;
}

void validate_config(const ModelConfig& c, const std::string& where) {
  const ModelConfig back = config_from_json(config_to_json(c), where);
  if (!(back == c))
    throw ConfigError(fmt::format(
        "{}: the configuration does not survive its own config.json (a field outside what the "
        "file can say, such as an expert field of a dense model, or a duplicated layer): {}",
        where, config_to_json(c).dump()));
}

ModelConfig load_config(const std::string& path) {
  return config_from_json(read_json_file<ConfigError>(path), path);
}

}  // namespace lockstep::model
