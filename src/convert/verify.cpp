// verify_checkpoint (convert/verify.h): detect the quantized directory's format, pair each
// quantized module with its bf16 weight, re-quantize that weight with the contract (the outer
// domain joint over q / k / v or gate / up when the file's global scales say the tool fused
// them), and classify every differing byte (verify_classify.cpp).
#include "lockstep/convert/verify.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "checkpoint_reader.h"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/given_amax.h"
#include "verify_classify.h"

namespace lockstep::convert {
namespace fs = std::filesystem;
using json = Json;

std::string_view diff_class_name(DiffClass c) {
  static constexpr std::array<std::string_view, size_t(DiffClass::kCount)> kNames{
      "scale_rounding", "tie_rounding", "amax_floor", "nibble_order", "signed_zero", "other"};
  return kNames[size_t(c)];
}

int64_t VerifyReport::identical_modules() const {
  int64_t n = 0;
  for (const ModuleVerdict& m : modules) n += m.identical() ? 1 : 0;
  return n;
}

bool VerifyReport::identical() const { return identical_modules() == int64_t(modules.size()); }

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// The format of a quantized directory, from hf_quant_config.json or config.json.
HfFormat detect_format(const fs::path& dir, std::string& from) {
  std::error_code ec;
  auto modelopt = [&](const std::string& algo,
                      const std::string& where) -> std::optional<HfFormat> {
    const std::string a = upper(algo);
    from = fmt::format("{} quant_algo {}", where, algo);
    if (a == "NVFP4" || a == "W4A16_NVFP4") return HfFormat::kModeloptNvfp4;
    if (a == "MXFP8") return HfFormat::kMxfp8;
    return std::nullopt;
  };
  if (fs::is_regular_file(dir / "hf_quant_config.json", ec)) {
    const json j = read_json(dir / "hf_quant_config.json");
    if (j.contains("quantization") && j["quantization"].is_object() &&
        j["quantization"].contains("quant_algo") && j["quantization"]["quant_algo"].is_string())
      if (auto f =
              modelopt(j["quantization"]["quant_algo"].get<std::string>(), "hf_quant_config.json"))
        return *f;
  }
  if (!fs::is_regular_file(dir / "config.json", ec))
    throw ExportError(fmt::format("{}: no config.json", dir.string()));
  const json c = read_json(dir / "config.json");
  const json q = c.value("quantization_config", json());
  if (!q.is_object())
    throw ExportError(
        fmt::format("{}: config.json has no quantization_config (not a quantized "
                    "checkpoint)",
                    dir.string()));
  const std::string method = q.value("quant_method", "");
  if (method.starts_with("modelopt") && q.contains("quant_algo") && q["quant_algo"].is_string())
    if (auto f = modelopt(q["quant_algo"].get<std::string>(), "config.json")) return *f;
  if (method == "compressed-tensors" && q.value("format", "") == "nvfp4-pack-quantized") {
    from = "config.json compressed-tensors nvfp4-pack-quantized";
    return HfFormat::kCompressedTensorsNvfp4;
  }
  if (method == "fp8" && q.value("weight_block_size", json()) == json({128, 128})) {
    from = "config.json fp8 weight_block_size [128, 128]";
    return HfFormat::kFp8Block;
  }
  throw ExportError(fmt::format("{}: quantization_config {} is in no format verify reads ({})",
                                dir.string(), q.dump(), hf_format_names()));
}

// The data tensor suffix of a quantized module in a format, and its dtype.
std::pair<std::string, DType> data_tensor(HfFormat f) {
  switch (f) {
    case HfFormat::kModeloptNvfp4:
      return {".weight", DType::kU8};
    case HfFormat::kCompressedTensorsNvfp4:
      return {".weight_packed", DType::kU8};
    default:
      return {".weight", DType::kF8E4M3};
  }
}

// The outer domains a tool may have fused a module into, largest first: every expert's gate and up
// (or down) of one MoE layer, one expert's gate and up, q / k / v of one attention, gate and up of
// one dense MLP. `all`: every quantized module prefix.
std::vector<std::vector<std::string>> fused_candidates(const std::string& prefix,
                                                       const std::vector<std::string>& all) {
  const size_t dot = prefix.rfind('.');
  if (dot == std::string::npos) return {};
  const std::string parent = prefix.substr(0, dot), leaf = prefix.substr(dot + 1);
  std::vector<std::vector<std::string>> out;
  const bool fc1 = leaf == "gate_proj" || leaf == "up_proj";
  if (const size_t ex = parent.rfind(".experts."); ex != std::string::npos) {
    const std::string layer = parent.substr(0, ex + 9);  // "...mlp.experts."
    std::vector<std::string> group;
    for (const std::string& p : all) {
      if (!p.starts_with(layer)) continue;
      const std::string l = p.substr(p.rfind('.') + 1);
      if (fc1 ? (l == "gate_proj" || l == "up_proj") : l == leaf) group.push_back(p);
    }
    if (group.size() > 1) out.push_back(group);
  }
  if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj")
    out.push_back({parent + ".q_proj", parent + ".k_proj", parent + ".v_proj"});
  if (fc1) out.push_back({parent + ".gate_proj", parent + ".up_proj"});
  return out;
}

std::string outer_name(HfFormat f) {
  return f == HfFormat::kCompressedTensorsNvfp4 ? ".weight_global_scale" : ".weight_scale_2";
}

std::vector<std::string> leaf_names(const std::vector<std::string>& group) {
  std::vector<std::string> out;
  for (const std::string& s : group) out.push_back(s.substr(s.rfind('.') + 1));
  return out;
}

float scalar_of(const Tensor& t, const std::string& what) {
  if (t.dtype() != DType::kF32 || t.numel() != 1)
    throw ExportError(fmt::format("{} is {}; expected one F32 value", what, t.describe()));
  return *t.ptr<float>();
}

}  // namespace

VerifyReport verify_checkpoint(const std::string& bf16_dir, const std::string& quant_dir) {
  VerifyReport rep;
  rep.format = detect_format(quant_dir, rep.detected_from);
  const auto quant = index_checkpoint(quant_dir);
  const auto source = index_checkpoint(bf16_dir);
  const auto [suffix, dtype] = data_tensor(rep.format);
  const bool nvfp4 =
      rep.format == HfFormat::kModeloptNvfp4 || rep.format == HfFormat::kCompressedTensorsNvfp4;
  auto get = [&](const std::string& name) -> Tensor {
    auto it = quant.find(name);
    if (it == quant.end()) throw ExportError(fmt::format("{}: no tensor '{}'", quant_dir, name));
    return read_tensor(it->second);
  };
  auto source_weight = [&](const std::string& prefix, int64_t rows, int64_t cols) {
    auto it = source.find(prefix + ".weight");
    if (it == source.end())
      throw ExportError(fmt::format("{}: no tensor '{}.weight' for the quantized module '{}'",
                                    bf16_dir, prefix, prefix));
    const TensorInfo& t = it->second.info;
    if (t.shape != std::vector<int64_t>{rows, cols} ||
        (t.dtype != DType::kBF16 && t.dtype != DType::kF32 && t.dtype != DType::kF16))
      throw ExportError(fmt::format("{}: '{}.weight' is {} {}; the quantized module is [{}, {}]",
                                    it->second.file, prefix, dtype_name(t.dtype),
                                    shape_string(t.shape), rows, cols));
    return read_tensor(it->second);
  };
  // Amax of each source weight, read once (joint domains need the siblings').
  std::map<std::string, float> amax_cache;
  auto amax_of = [&](const std::string& prefix, int64_t rows, int64_t cols) {
    if (auto it = amax_cache.find(prefix); it != amax_cache.end()) return it->second;
    const float a = tensor_amax(source_weight(prefix, rows, cols));
    amax_cache[prefix] = a;
    return a;
  };

  std::vector<std::string> prefixes;
  for (const auto& [name, loc] : quant)
    if (name.ends_with(suffix) && loc.info.dtype == dtype && loc.info.shape.size() == 2)
      prefixes.push_back(name.substr(0, name.size() - suffix.size()));
  std::map<std::string, float> outer_cache;
  auto outer_of = [&](const std::string& p) {
    if (auto it = outer_cache.find(p); it != outer_cache.end()) return it->second;
    const std::string n = p + outer_name(rep.format);
    return outer_cache[p] = scalar_of(get(n), n);
  };
  for (const std::string& prefix : prefixes) {
    const TensorLocation& loc = quant.at(prefix + suffix);
    const Tensor data = read_tensor(loc);
    const int64_t rows = data.rows(), cols = nvfp4 ? data.cols() * 2 : data.cols();
    const Tensor w = source_weight(prefix, rows, cols);
    ModuleVerdict v;
    v.module = prefix;
    v.rows = rows;
    v.cols = cols;
    ModuleFiles files;
    files.data = data;
    if (nvfp4) {
      files.block_scale = get(prefix + ".weight_scale");
      files.outer = outer_of(prefix);
      // The contract's domain: the largest fused group whose members all carry this module's
      // global scale bits (a tool that fused them), else the module alone.
      float a = amax_of(prefix, rows, cols);
      v.domain = "tensor";
      for (const std::vector<std::string>& group : fused_candidates(prefix, prefixes)) {
        bool joint = true;
        for (const std::string& s : group)
          joint = joint && quant.contains(s + outer_name(rep.format)) &&
                  quant.contains(s + suffix) &&
                  num::f32_bits(outer_of(s)) == num::f32_bits(files.outer);
        if (!joint) continue;
        for (const std::string& s : group) {
          const std::vector<int64_t>& shape = quant.at(s + suffix).info.shape;
          a = num::fmax_f32(a, amax_of(s, shape.at(0), shape.at(1) * 2));
        }
        v.domain = group.size() <= 3
                       ? fmt::format("joint: {}", fmt::join(leaf_names(group), ", "))
                       : fmt::format("joint: {} modules of {}", group.size(),
                                     group.front().substr(0, group.front().rfind(".experts.") + 8));
        break;
      }
      files.contract_amax = a;
    } else if (rep.format == HfFormat::kMxfp8) {
      files.block_scale = get(prefix + ".weight_scale");
    } else {
      files.scale_inv = get(prefix + ".weight_scale_inv");
    }
    compare_module(rep.format, w, files, v);
    rep.modules.push_back(std::move(v));
  }
  if (rep.modules.empty())
    throw ExportError(fmt::format("{}: no quantized module found (tensors '*{}' of dtype {})",
                                  quant_dir, suffix, dtype_name(dtype)));
  return rep;
}

json verify_json(const VerifyReport& r) {
  json mods = json::array();
  std::array<int64_t, size_t(DiffClass::kCount)> totals{};
  int64_t data_differ = 0, scale_differ = 0, outer_differ = 0;
  for (const ModuleVerdict& m : r.modules) {
    json by = json::object();
    for (size_t c = 0; c < totals.size(); ++c) {
      by[std::string(diff_class_name(DiffClass(c)))] = m.by_class[c];
      totals[c] += m.by_class[c];
    }
    data_differ += m.data_bytes_differ;
    scale_differ += m.scale_bytes_differ;
    outer_differ += m.outer_differs ? 1 : 0;
    json j = {{"module", m.module},
              {"shape", {m.rows, m.cols}},
              {"data_bytes", m.data_bytes},
              {"data_bytes_differ", m.data_bytes_differ},
              {"elements_differ", m.elements_differ},
              {"scale_bytes", m.scale_bytes},
              {"scale_bytes_differ", m.scale_bytes_differ},
              {"by_class", by},
              {"identical", m.identical()}};
    if (!m.domain.empty()) {
      j["domain"] = m.domain;
      j["global_scale"] = {{"file", m.outer_file},
                           {"contract", m.outer_contract},
                           {"differs", m.outer_differs},
                           {"ulps", m.outer_ulps}};
    }
    mods.push_back(std::move(j));
  }
  json tot = json::object();
  for (size_t c = 0; c < totals.size(); ++c)
    tot[std::string(diff_class_name(DiffClass(c)))] = totals[c];
  return {{"format", hf_format_name(r.format)},   {"detected_from", r.detected_from},
          {"modules", int64_t(r.modules.size())}, {"identical_modules", r.identical_modules()},
          {"data_bytes_differ", data_differ},     {"scale_bytes_differ", scale_differ},
          {"global_scales_differ", outer_differ}, {"by_class", tot},
          {"identical", r.identical()},           {"per_module", mods}};
}

}  // namespace lockstep::convert
