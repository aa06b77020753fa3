// The two sources of an export (convert/export.h): a policy version in memory, and a Hugging Face
// checkpoint streamed from disk one lockstep tensor at a time (its pieces read by byte range from
// whichever shard holds them, widened, converted, written, dropped).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint_reader.h"
#include "export_write.h"
#include "lockstep/model/config.h"

namespace lockstep::convert {
namespace fs = std::filesystem;
using json = Json;

namespace {

std::string operand_key(const model::LinearSite& s) {
  return s.cls == ModuleClass::kLmHead ? "lm_head" : s.name;
}

bool float_source(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

bool rotary_buffer(const std::string& name) { return name.ends_with("rotary_emb.inv_freq"); }

}  // namespace

ExportResult export_policy_dir(const model::PolicyVersion& p, const json& source_config,
                               const std::string& tokenizer_dir, const std::string& out_dir,
                               const HfExportOptions& opt_in) {
  HfExportOptions opt = opt_in;
  opt.convert = p.options;  // the policy's bytes were made with its own options
  const ExportPlan plan = plan_export(p.config, p.recipe, opt);
  check_out_dir(out_dir);
  const json config = source_config.is_object() ? source_config : model::config_to_json(p.config);
  return write_export(plan, config, tokenizer_dir, out_dir, [&](const ExportUnit& u) {
    if (!u.linear) {
      auto it = p.dense.find(u.name);
      if (it == p.dense.end())
        throw ExportError(fmt::format("policy version {}: no tensor '{}'", p.version, u.name));
      return unit_tensors(plan, u, nullptr, &it->second);
    }
    auto it = p.operands.find(operand_key(u.site));
    if (it == p.operands.end())
      throw ExportError(fmt::format("policy version {}: no operand '{}'", p.version, u.name));
    return unit_tensors(plan, u, &it->second, nullptr);
  });
}

ExportResult convert_model_dir(const std::string& model_dir, const Recipe& recipe,
                               const std::string& out_dir, const HfExportOptions& opt) {
  const fs::path dir(model_dir);
  if (!fs::is_directory(dir))
    throw ExportError(
        fmt::format("{}: not a model directory (config.json + safetensors)", model_dir));
  const fs::path config_path = dir / model::kConfigFile;
  if (!fs::is_regular_file(config_path))
    throw ExportError(fmt::format("{}: no config.json in the model directory", model_dir));
  const json config_json = read_json(config_path);
  if (config_json.is_object() && config_json.contains("quantization_config"))
    throw ExportError(fmt::format(
        "{}: the model is already quantized (quantization_config); convert reads bf16 / f32 "
        "checkpoints",
        config_path.string()));
  const model::ModelConfig config = model::config_from_json(config_json, config_path.string());
  const ExportPlan plan = plan_export(config, recipe, opt);
  check_out_dir(out_dir);

  // Every tensor the layout needs is present with its shape and a float dtype; nothing else is.
  const std::map<std::string, TensorLocation> where = index_checkpoint(dir);
  std::set<std::string> used;
  for (const HfLayoutEntry& e : model::hf_layout(config))
    for (const HfPiece& p : e.pieces) {
      auto it = where.find(p.hf);
      if (it == where.end())
        throw ExportError(
            fmt::format("{}: the model has no tensor '{}' {} (part of {}), which "
                        "the config implies",
                        model_dir, p.hf, shape_string(p.hf_shape), e.name));
      const TensorInfo& t = it->second.info;
      if (!float_source(t.dtype) || t.shape != p.hf_shape)
        throw ExportError(
            fmt::format("{}: tensor '{}' is {} {}; the config implies {} F32, BF16 "
                        "or F16",
                        it->second.file, p.hf, dtype_name(t.dtype), shape_string(t.shape),
                        shape_string(p.hf_shape)));
      used.insert(p.hf);
    }
  for (const auto& [name, loc] : where) {
    if (used.contains(name) || rotary_buffer(name)) continue;
    if (name == "lm_head.weight" && config.tie_word_embeddings) {
      const Tensor head = read_tensor(loc);
      const Tensor emb = read_tensor(where.at("model.embed_tokens.weight"));
      if (head.shape() == emb.shape() && float_source(head.dtype()) && to_f32(head) == to_f32(emb))
        continue;
      throw ExportError(
          fmt::format("{}: tensor 'lm_head.weight' differs from the embedding but "
                      "the config ties them (tie_word_embeddings true)",
                      loc.file));
    }
    throw ExportError(
        fmt::format("{}: unexpected tensor '{}' {}: the config implies no such "
                    "weight",
                    loc.file, name, shape_string(loc.info.shape)));
  }

  std::map<std::string, HfLayoutEntry> entries;
  for (HfLayoutEntry& e : model::hf_layout(config)) entries.emplace(e.name, std::move(e));
  return write_export(plan, config_json, model_dir, out_dir, [&](const ExportUnit& u) {
    const HfLayoutEntry& e = entries.at(u.name);
    Tensor w(DType::kF32, e.shape);
    const int64_t cols = e.shape.size() == 2 ? e.shape[1] : 1;
    for (const HfPiece& p : e.pieces) {
      const std::vector<float> v = to_f32(read_tensor(where.at(p.hf)));
      std::copy(v.begin(), v.end(), w.data<float>().begin() + p.row0 * cols);
    }
    if (!u.linear) return unit_tensors(plan, u, nullptr, &w);
    const nn::Operand op = model::convert_weight(w, config, plan.plan, u.site, opt.convert);
    return unit_tensors(plan, u, &op, nullptr);
  });
}

}  // namespace lockstep::convert
