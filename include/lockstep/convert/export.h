// Export of a policy to a Hugging Face model directory in a serving stack's format
// (convert/hf_format.h): per-module Hugging Face names (q_proj / k_proj / v_proj, gate_proj /
// up_proj, experts.E.*), safetensors shards with an index, config.json with its
// quantization_config, hf_quant_config.json for the ModelOpt formats, tokenizer files copied.
// The data and scale bytes are the converter's (model/policy.h), so a serving engine reads the
// sampler's bytes; outer scales are the contract's own S_dec / S_enc. Two sources: a policy
// version in memory (`lockstep export`), or a bf16 checkpoint streamed lockstep tensor by lockstep
// tensor (`lockstep convert`, peak memory about one fused tensor plus its outputs). Output goes to
// a temporary folder beside OUT_DIR, renamed into place once complete.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/convert/hf_format.h"
#include "lockstep/model/policy.h"
#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::convert {

using model::HfLayoutEntry;
using model::HfPiece;

struct HfExportOptions {
  HfFormat format = HfFormat::kModeloptNvfp4;
  model::ExportOptions convert;  // fuse_scales (q / k / v share one NVFP4 outer scale)
  // Declare the weights only (NVFP4: W4A16_NVFP4 / nvfp4a16; mxfp8 / fp8-block: no check of the
  // recipe's activation format), whatever the recipe does to activations.
  bool weights_only = false;
  // NVFP4 with quantized activations (W4A4): the activation amax the serving engine's static
  // input global scale stands for (input_scale = S_dec of it, input_global_scale = S_enc).
  // lockstep's activation scales are dynamic, so there is no value to take from the recipe.
  std::optional<float> input_amax;
  uint64_t max_shard_bytes = 5'000'000'000;  // tensor bytes per shard (transformers' default)
  // Called after each lockstep tensor is written: (done, total).
  std::function<void(int64_t, int64_t)> on_progress;
  // Extra safetensors metadata (provenance) on every shard, beside "format": "pt".
  std::map<std::string, std::string> metadata;
};

// One Hugging Face linear module inside a lockstep weight: rows [row0, row0 + rows) of group
// `group` (an expert of a grouped weight; 0 otherwise), all `cols` columns.
struct HfModule {
  std::string prefix;  // "model.layers.0.self_attn.q_proj" (tensor names append ".weight", ...)
  int64_t group = 0, row0 = 0, rows = 0, cols = 0;
};

// One lockstep tensor and what it becomes.
struct ExportUnit {
  std::string name;               // lockstep name (weights.h)
  bool linear = false;            // a linear weight (else embedding / norm, written bf16)
  bool quantized = false;         // linear and quantized by the recipe
  model::LinearSite site;         // linear only
  std::vector<HfModule> modules;  // linear only
  std::vector<HfPiece> pieces;    // dense only: its Hugging Face tensors
  std::vector<TensorSpec> specs;  // every output tensor, in writing order
};

struct ExportPlan {
  model::ModelConfig config;
  Recipe recipe;
  ModelPlan plan;
  HfExportOptions opt;
  bool activations_quantized = false;  // NVFP4 W4A4: input scales written
  std::vector<std::string> ignore;     // Hugging Face modules kept bf16 (exclude_modules)
  std::vector<ExportUnit> units;       // in the layout's order
};

// Checks that the format can express the recipe on this config and lays out every output tensor.
// ExportError names the layer and the reason otherwise (a format other than the recipe's, per-row
// outer scales, E5M2 elements, a Hadamard-transformed weight, K not a multiple of the block,
// a tied quantized head, activations the format cannot declare, ...).
ExportPlan plan_export(const model::ModelConfig& c, const Recipe& recipe,
                       const HfExportOptions& opt);

// The output tensors of one unit. op: the converter's operand (linear units; on any device);
// dense: the F32 (or BF16) lockstep tensor (dense units). Names, dtypes and shapes follow
// unit.specs.
std::vector<NamedTensor> unit_tensors(const ExportPlan& plan, const ExportUnit& unit,
                                      const nn::Operand* op, const Tensor* dense);

// config.json's quantization_config (and the ModelOpt hf_quant_config.json) of a plan.
Json quantization_config(const ExportPlan& plan);
Json hf_quant_config(const ExportPlan& plan);  // null for formats without one

struct ExportResult {
  std::vector<std::string> files;  // written into OUT_DIR
  uint64_t tensor_bytes = 0;
  int64_t quantized_modules = 0, bf16_modules = 0;
};

// Writes OUT_DIR from a policy version. source_config: the model's config.json object (its fields
// are kept; torch_dtype and quantization_config are set), or null for config_to_json(p.config).
// tokenizer_dir: a folder whose tokenizer files are copied (empty: none).
ExportResult export_policy_dir(const model::PolicyVersion& p, const Json& source_config,
                               const std::string& tokenizer_dir, const std::string& out_dir,
                               const HfExportOptions& opt);

// Streams a bf16 / f32 Hugging Face model directory (config.json + model.safetensors or an index
// with shards) into OUT_DIR in the format, converting one lockstep tensor at a time with the
// converter (the same bytes as export_policy_dir of that model). Tokenizer files are copied.
ExportResult convert_model_dir(const std::string& model_dir, const Recipe& recipe,
                               const std::string& out_dir, const HfExportOptions& opt);

// The tokenizer and generation files copied when present.
const std::vector<std::string>& tokenizer_file_names();

}  // namespace lockstep::convert
