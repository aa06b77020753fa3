// plan_export (convert/export.h): what a format can express of a recipe, checked module by module
// before anything is written, and the name, dtype and shape of every output tensor.
#include <fmt/format.h>

#include <cmath>
#include <set>

#include "lockstep/convert/export.h"
#include "lockstep/nn/linear.h"

namespace lockstep::convert {

std::optional<HfFormat> hf_format_from_name(std::string_view name) {
  for (const auto& r : kHfFormats)
    if (r.name == name) return r.format;
  return std::nullopt;
}

std::string hf_format_names() {
  std::string s;
  for (const auto& r : kHfFormats) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

HfFormat hf_format_or_throw(std::string_view name) {
  if (auto f = hf_format_from_name(name)) return *f;
  throw ExportError(fmt::format("unknown format '{}' (formats: {})", name, hf_format_names()));
}

namespace {

bool nvfp4_family(HfFormat f) {
  return f == HfFormat::kModeloptNvfp4 || f == HfFormat::kCompressedTensorsNvfp4;
}

std::string site_path(const model::LinearSite& s) {
  return s.cls == ModuleClass::kLmHead ? "lm_head" : module_path(s.layer, s.cls);
}

std::string operand_text(const QuantSpec& o) {
  if (!is_quantized(o.format)) return std::string(format_name(o.format));
  std::string t = fmt::format("{} {}", format_name(o.format), scaling_name(o.scaling));
  if (o.format != Format::kNvfp4 && o.elem == ElemCodec::kE5M2) t += " e5m2";
  if (o.block2d) t += " block2d";
  if (o.hadamard) t += " hadamard";
  return t;
}

std::string strip_weight(const std::string& hf) {
  constexpr std::string_view kSuffix = ".weight";
  if (hf.size() > kSuffix.size() && hf.ends_with(kSuffix))
    return hf.substr(0, hf.size() - kSuffix.size());
  return hf;
}

// The reason the format cannot hold this quantized weight, or "" when it can.
std::string weight_problem(HfFormat f, const QuantSpec& w, int64_t cols) {
  const HfFormatInfo& fi = hf_format_info(f);
  if (w.format != fi.weight_format)
    return fmt::format(
        "the recipe quantizes its weight as {}; {} holds {} weights (and bf16 "
        "layers, listed as excluded)",
        operand_text(w), fi.name,
        f == HfFormat::kFp8Block ? "fp8 block_128x128"
                                 : std::string(format_name(fi.weight_format)));
  switch (w.format) {
    case Format::kNvfp4:
      if (w.scaling == Scaling::kPerRow)
        return fmt::format(
            "its weight has per-row outer scales (one amax per output row); {} "
            "holds one global scale per tensor ({}); use a recipe with per_tensor "
            "or per_group weights",
            fi.name, f == HfFormat::kModeloptNvfp4 ? "weight_scale_2" : "weight_global_scale");
      if (w.hadamard)
        return "its weight is Hadamard-transformed along K, which serving engines do not undo";
      if (w.stochastic) return "its weight is stochastically rounded (a gradient-only option)";
      break;
    case Format::kMxfp8:
      if (w.elem == ElemCodec::kE5M2) return "its weight has E5M2 elements; mxfp8 stores E4M3";
      break;
    case Format::kFp8:
      if (w.scaling != Scaling::kBlock128x128)
        return fmt::format(
            "its weight is fp8 {}; fp8-block holds 128x128 blocks (weight_scale_inv "
            "per block)",
            scaling_name(w.scaling));
      if (w.elem == ElemCodec::kE5M2) return "its weight has E5M2 elements; fp8-block stores E4M3";
      break;
    default:
      break;
  }
  if (f != HfFormat::kFp8Block && cols % fi.block_cols != 0)
    return fmt::format("its in_features K = {} is not a multiple of the {}-element block", cols,
                       fi.block_cols);
  return "";
}

// What the format declares for the activations of a quantized module: "w4a16", "w4a4", "" (the
// format's only declaration, for mxfp8 / fp8-block), or an error text starting with '!'.
std::string activation_kind(HfFormat f, const QuantSpec& a, bool weights_only) {
  if (nvfp4_family(f)) {
    if (weights_only || a.format == Format::kBf16) return "w4a16";
    if (a.format == Format::kNvfp4 && !a.hadamard) return "w4a4";
    return fmt::format(
        "!its activations are {}; {} declares nvfp4 or bf16 activations (pass "
        "--weights-only to declare the weights alone)",
        operand_text(a), hf_format_name(f));
  }
  if (weights_only) return "";
  if (f == HfFormat::kMxfp8 && a.format == Format::kMxfp8 && a.elem == ElemCodec::kE4M3) return "";
  if (f == HfFormat::kFp8Block && a.format == Format::kFp8 && a.scaling == Scaling::kBlock1x128)
    return "";
  return fmt::format(
      "!its activations are {}; {} declares {} activations (pass --weights-only to "
      "declare the weights alone and let the engine choose)",
      operand_text(a), hf_format_name(f),
      f == HfFormat::kMxfp8 ? "dynamic mxfp8 e4m3" : "dynamic fp8 1x128-block");
}

std::vector<TensorSpec> quantized_specs(HfFormat f, const HfModule& m, bool w4a4) {
  const std::string& p = m.prefix;
  const int64_t n = m.rows, k = m.cols;
  switch (f) {
    case HfFormat::kModeloptNvfp4: {
      std::vector<TensorSpec> s{{p + ".weight", DType::kU8, {n, k / 2}},
                                {p + ".weight_scale", DType::kF8E4M3, {n, k / 16}},
                                {p + ".weight_scale_2", DType::kF32, {}}};
      if (w4a4) s.push_back({p + ".input_scale", DType::kF32, {}});
      return s;
    }
    case HfFormat::kCompressedTensorsNvfp4: {
      std::vector<TensorSpec> s{{p + ".weight_packed", DType::kU8, {n, k / 2}},
                                {p + ".weight_scale", DType::kF8E4M3, {n, k / 16}},
                                {p + ".weight_global_scale", DType::kF32, {1}}};
      if (w4a4) s.push_back({p + ".input_global_scale", DType::kF32, {1}});
      return s;
    }
    case HfFormat::kMxfp8:
      return {{p + ".weight", DType::kF8E4M3, {n, k}},
              {p + ".weight_scale", DType::kU8, {n, k / 32}}};
    case HfFormat::kFp8Block:
      return {{p + ".weight", DType::kF8E4M3, {n, k}},
              {p + ".weight_scale_inv", DType::kF32, {(n + 127) / 128, (k + 127) / 128}}};
    default:
      throw std::logic_error("format");
  }
}

}  // namespace

ExportPlan plan_export(const model::ModelConfig& c, const Recipe& recipe,
                       const HfExportOptions& opt) {
  ExportPlan out;
  out.config = c;
  out.recipe = recipe;
  out.opt = opt;
  out.plan = resolve_model(recipe, int(c.num_hidden_layers));
  const HfFormat f = opt.format;
  if (size_t(f) >= kHfFormats.size()) throw ExportError("unknown export format");

  std::map<std::string, model::LinearSite> sites;
  std::optional<model::LinearSite> tied_head;
  for (const model::LinearSite& s : model::linear_sites(c)) {
    if (s.cls == ModuleClass::kLmHead && s.name == "embed")
      tied_head = s;
    else
      sites.emplace(s.name, s);
  }
  if (tied_head) {
    const LinearSpec head = model::site_spec(out.plan, *tied_head);
    const QuantSpec& w = head[Gemm::kFprop].b;
    if (is_quantized(w.format))
      throw ExportError(fmt::format(
          "lm_head: the recipe quantizes the head ({}), but it is tied to the embedding "
          "(tie_word_embeddings true); {} cannot quantize a head that shares the embedding's bf16 "
          "tensor",
          operand_text(w), hf_format_name(f)));
  }

  std::string act_kind, act_site;
  int64_t quantized = 0;
  std::set<std::string> ignored;
  for (const HfLayoutEntry& e : model::hf_layout(c)) {
    ExportUnit u;
    u.name = e.name;
    auto it = sites.find(e.name);
    if (it == sites.end()) {
      u.pieces = e.pieces;
      for (const HfPiece& p : e.pieces) u.specs.push_back({p.hf, DType::kBF16, p.hf_shape});
      out.units.push_back(std::move(u));
      continue;
    }
    const model::LinearSite& s = it->second;
    const LinearSpec spec = model::site_spec(out.plan, s);
    const QuantSpec& w = spec[Gemm::kFprop].b;
    const std::string path = site_path(s);
    u.linear = true;
    u.site = s;
    u.quantized = is_quantized(w.format);
    if (w.format == Format::kF32)
      throw ExportError(fmt::format(
          "{}: the recipe keeps its weight in f32 (the unrounded test format); {} holds bf16 and "
          "{} layers",
          path, hf_format_name(f), format_name(hf_format_info(f).weight_format)));
    const int64_t groups = s.groups, per_group = e.shape[0] / groups, cols = e.shape[1];
    const nn::LinearDims dims = nn::LinearDims::of(per_group, cols, spec);
    for (const HfPiece& p : e.pieces) {
      HfModule m;
      m.prefix = strip_weight(p.hf);
      m.group = p.row0 / per_group;
      m.row0 = p.row0 % per_group;
      m.rows = p.hf_shape[0];
      m.cols = p.hf_shape[1];
      u.modules.push_back(std::move(m));
    }
    if (!u.quantized) {
      for (const HfModule& m : u.modules) {
        ignored.insert(m.prefix);
        u.specs.push_back({m.prefix + ".weight", DType::kBF16, {m.rows, m.cols}});
      }
      if (s.cls == ModuleClass::kExpertsFc1 || s.cls == ModuleClass::kExpertsFc2)
        if (groups > 1) ignored.insert(fmt::format("model.layers.{}.mlp.experts", s.layer));
      out.units.push_back(std::move(u));
      continue;
    }
    if (const std::string why = weight_problem(f, w, cols); !why.empty())
      throw ExportError(fmt::format("{}: {}", path, why));
    if (f == HfFormat::kFp8Block) {
      // Each 128-row block of a module must lie inside one 128-row tile of the quantized weight.
      for (const HfModule& m : u.modules)
        for (int64_t r = 0; r < m.rows; r += 128) {
          const int64_t first = m.group * dims.out_padded + m.row0 + r;
          const int64_t last = first + std::min<int64_t>(128, m.rows - r) - 1;
          if (first / 128 != last / 128)
            throw ExportError(fmt::format(
                "{}: {} starts at row {} of the fused weight, so its 128-row blocks straddle the "
                "quantizer's 128x128 tiles; fp8-block needs each module's blocks inside one tile",
                path, m.prefix, m.row0));
        }
    }
    const std::string kind = activation_kind(f, spec[Gemm::kFprop].a, opt.weights_only);
    if (kind.starts_with("!")) throw ExportError(fmt::format("{}: {}", path, kind.substr(1)));
    if (!act_site.empty() && kind != act_kind)
      throw ExportError(fmt::format(
          "{} declares {} and {} declares {}: {} has one activation scheme per checkpoint (pass "
          "--weights-only to declare the weights alone)",
          act_site, act_kind, path, kind, hf_format_name(f)));
    act_kind = kind;
    act_site = path;
    ++quantized;
    for (const HfModule& m : u.modules)
      for (TensorSpec& t : quantized_specs(f, m, kind == "w4a4")) u.specs.push_back(std::move(t));
    out.units.push_back(std::move(u));
  }
  if (quantized == 0)
    throw ExportError(fmt::format(
        "recipe '{}' quantizes no linear layer of this model: there is nothing for {} to hold "
        "(a bf16 model needs no export format)",
        recipe.name, hf_format_name(f)));
  out.activations_quantized = act_kind == "w4a4";
  if (out.activations_quantized && !opt.input_amax)
    throw ExportError(fmt::format(
        "{}: the recipe quantizes activations to nvfp4 with scales computed per batch or per "
        "token, but {} stores one static activation scale per layer: give --input-amax A (the "
        "activation amax that scale stands for) or --weights-only (W4A16)",
        act_site, hf_format_name(f)));
  if (opt.input_amax && !out.activations_quantized)
    throw ExportError(
        "--input-amax applies to NVFP4 checkpoints with quantized activations (W4A4); this export "
        "declares none");
  if (opt.input_amax && !(*opt.input_amax > 0.0f && std::isfinite(*opt.input_amax)))
    throw ExportError(
        fmt::format("--input-amax {} must be a positive finite number", *opt.input_amax));
  // A tied head is the embedding: nothing to list, nothing to write.
  out.ignore.assign(ignored.begin(), ignored.end());
  return out;
}

}  // namespace lockstep::convert
