// unit_tensors and the quantization configs (convert/export.h): the converter's operand of one
// lockstep weight cut into its Hugging Face modules, with each format's names, dtypes, outer-scale
// convention (ModelOpt weight_scale_2 = S_dec, compressed-tensors weight_global_scale = S_enc) and
// scale grids; the configs that tell serving stacks what the files hold.
#include <fmt/format.h>

#include <cstring>

#include "lockstep/convert/export.h"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/codecs.h"
#include "lockstep/version.h"

namespace lockstep::convert {
namespace {

using json = Json;

Tensor host(const Tensor& t) { return t.is_cpu() ? t.contiguous() : t.to(Device::cpu()); }

// Rows [r0, r0 + n), the first `bytes` bytes of each, of a host 2-D tensor of row stride
// `stride` bytes, as a new tensor of `dtype` and `shape`.
Tensor cut_rows(const Tensor& src, int64_t stride, int64_t r0, int64_t n, int64_t bytes,
                DType dtype, std::vector<int64_t> shape) {
  Tensor out = Tensor::empty(dtype, std::move(shape));
  const auto* s = static_cast<const std::byte*>(src.raw());
  auto* d = static_cast<std::byte*>(out.raw());
  for (int64_t r = 0; r < n; ++r) std::memcpy(d + r * bytes, s + (r0 + r) * stride, size_t(bytes));
  return out;
}

Tensor scalar_f32(float v, std::vector<int64_t> shape) {
  Tensor t(DType::kF32, std::move(shape));
  *t.ptr<float>() = v;
  return t;
}

struct Slicer {
  const QTensor& q;
  int64_t per_group;  // padded rows of one group
  int64_t row(const HfModule& m) const { return m.group * per_group + m.row0; }
};

void nvfp4_module(const ExportPlan& plan, const QTensor& q, const Slicer& sl, const HfModule& m,
                  std::vector<NamedTensor>& out) {
  if (q.scale_layout != ScaleLayout::kCompact)
    throw std::logic_error("export: weight block scales must be compact");
  const int64_t r0 = sl.row(m), n = m.rows, k = m.cols;
  const int64_t dom = rowwise_domain_of(q, r0);
  if (n > 0 && rowwise_domain_of(q, r0 + n - 1) != dom)
    throw ExportError(
        fmt::format("{}: its rows span two outer domains of the quantized weight", m.prefix));
  const float amax = q.rowwise.amax.ptr<float>()[dom];
  const num::TwoLevelOuter o = num::two_level_outer(amax, num::kE2M1Max);
  const Tensor data = cut_rows(q.rowwise.data, q.cols / 2, r0, n, k / 2, DType::kU8, {n, k / 2});
  const Tensor scales =
      cut_rows(q.rowwise.block_scale, q.cols / 16, r0, n, k / 16, DType::kF8E4M3, {n, k / 16});
  const bool ct = plan.opt.format == HfFormat::kCompressedTensorsNvfp4;
  std::optional<num::TwoLevelOuter> in;
  if (plan.activations_quantized) in = num::two_level_outer(*plan.opt.input_amax, num::kE2M1Max);
  if (ct) {
    out.push_back({m.prefix + ".weight_packed", data});
    out.push_back({m.prefix + ".weight_scale", scales});
    out.push_back({m.prefix + ".weight_global_scale", scalar_f32(o.s_enc, {1})});
    if (in) out.push_back({m.prefix + ".input_global_scale", scalar_f32(in->s_enc, {1})});
  } else {
    out.push_back({m.prefix + ".weight", data});
    out.push_back({m.prefix + ".weight_scale", scales});
    out.push_back({m.prefix + ".weight_scale_2", scalar_f32(o.s_dec, {})});
    if (in) out.push_back({m.prefix + ".input_scale", scalar_f32(in->s_dec, {})});
  }
}

void mxfp8_module(const QTensor& q, const Slicer& sl, const HfModule& m,
                  std::vector<NamedTensor>& out) {
  if (q.scale_layout != ScaleLayout::kCompact)
    throw std::logic_error("export: weight block scales must be compact");
  const int64_t r0 = sl.row(m), n = m.rows, k = m.cols;
  out.push_back(
      {m.prefix + ".weight", cut_rows(q.rowwise.data, q.cols, r0, n, k, DType::kF8E4M3, {n, k})});
  out.push_back({m.prefix + ".weight_scale", cut_rows(q.rowwise.block_scale, q.cols / 32, r0, n,
                                                      k / 32, DType::kU8, {n, k / 32})});
}

void fp8_block_module(const QTensor& q, const Slicer& sl, const HfModule& m,
                      std::vector<NamedTensor>& out) {
  const int64_t r0 = sl.row(m), n = m.rows, k = m.cols;
  out.push_back(
      {m.prefix + ".weight", cut_rows(q.rowwise.data, q.cols, r0, n, k, DType::kF8E4M3, {n, k})});
  const int64_t nbr = (n + 127) / 128, nbc = (k + 127) / 128, tiles_c = q.rowwise.scale_cols;
  Tensor inv(DType::kF32, {nbr, nbc});
  const float* src = q.rowwise.scale_inv.ptr<float>();
  float* dst = inv.ptr<float>();
  for (int64_t i = 0; i < nbr; ++i)
    for (int64_t j = 0; j < nbc; ++j) dst[i * nbc + j] = src[(r0 + 128 * i) / 128 * tiles_c + j];
  out.push_back({m.prefix + ".weight_scale_inv", inv});
}

}  // namespace

std::vector<NamedTensor> unit_tensors(const ExportPlan& plan, const ExportUnit& u,
                                      const nn::Operand* op, const Tensor* dense) {
  std::vector<NamedTensor> out;
  if (!u.linear) {
    if (!dense) throw std::logic_error("unit_tensors: a dense unit needs its tensor");
    const std::vector<float> v = to_f32(host(*dense));
    const int64_t cols = dense->dim() == 2 ? dense->cols() : 1;
    for (const HfPiece& p : u.pieces) {
      const int64_t n = p.hf_shape[0] * (p.hf_shape.size() == 2 ? p.hf_shape[1] : 1);
      out.push_back(
          {p.hf, from_f32(std::span<const float>(v).subspan(size_t(p.row0 * cols), size_t(n)),
                          p.hf_shape, DType::kBF16)});
    }
    return out;
  }
  if (!op || !op->defined())
    throw std::logic_error("unit_tensors: a linear unit needs its operand");
  if (!u.quantized) {
    const Tensor t = host(op->t.dtype() == DType::kBF16 ? op->t : cast(op->t, DType::kBF16));
    const int64_t per_group = t.rows() / u.site.groups;
    for (const HfModule& m : u.modules)
      out.push_back(
          {m.prefix + ".weight", cut_rows(t, t.cols() * 2, m.group * per_group + m.row0, m.rows,
                                          m.cols * 2, DType::kBF16, {m.rows, m.cols})});
    return out;
  }
  if (!op->quantized() || !op->q.has_rowwise())
    throw std::logic_error(fmt::format("unit_tensors: '{}' has no quantized rowwise copy", u.name));
  QTensor q = op->q.device().is_cpu() ? op->q : op->q.to(Device::cpu());
  for (QData* d : {&q.rowwise})
    for (Tensor* t : {&d->data, &d->block_scale, &d->amax, &d->scale_inv})
      if (t->defined()) *t = t->contiguous();
  const Slicer sl{q, q.rows / u.site.groups};
  for (const HfModule& m : u.modules) {
    switch (plan.opt.format) {
      case HfFormat::kModeloptNvfp4:
      case HfFormat::kCompressedTensorsNvfp4:
        nvfp4_module(plan, q, sl, m, out);
        break;
      case HfFormat::kMxfp8:
        mxfp8_module(q, sl, m, out);
        break;
      case HfFormat::kFp8Block:
        fp8_block_module(q, sl, m, out);
        break;
      default:
        throw std::logic_error("format");
    }
  }
  return out;
}

json quantization_config(const ExportPlan& plan) {
  const json ignore = plan.ignore;
  switch (plan.opt.format) {
    case HfFormat::kModeloptNvfp4:
      return {{"quant_method", "modelopt"},
              {"quant_algo", plan.activations_quantized ? "NVFP4" : "W4A16_NVFP4"},
              {"group_size", 16},
              {"kv_cache_scheme", nullptr},
              {"ignore", ignore},
              {"producer", {{"name", "lockstep"}, {"version", lockstep_source_revision()}}}};
    case HfFormat::kMxfp8:
      return {{"quant_method", "modelopt"},
              {"quant_algo", "MXFP8"},
              {"group_size", 32},
              {"kv_cache_scheme", nullptr},
              {"ignore", ignore},
              {"producer", {{"name", "lockstep"}, {"version", lockstep_source_revision()}}}};
    case HfFormat::kCompressedTensorsNvfp4: {
      auto fp4_args = [](bool dynamic_local) {
        json a = {{"num_bits", 4},
                  {"type", "float"},
                  {"symmetric", true},
                  {"group_size", 16},
                  {"strategy", "tensor_group"},
                  {"block_structure", nullptr},
                  {"actorder", nullptr},
                  {"observer", "minmax"},
                  {"observer_kwargs", json::object()}};
        a["dynamic"] = dynamic_local ? json("local") : json(false);
        return a;
      };
      json group = {{"targets", {"Linear"}},
                    {"weights", fp4_args(false)},
                    {"input_activations", plan.activations_quantized ? fp4_args(true) : json()},
                    {"output_activations", nullptr},
                    {"format", "nvfp4-pack-quantized"}};
      return {{"quant_method", "compressed-tensors"},
              {"format", "nvfp4-pack-quantized"},
              {"quantization_status", "compressed"},
              {"config_groups", {{"group_0", group}}},
              {"ignore", ignore},
              {"kv_cache_scheme", nullptr},
              {"global_compression_ratio", nullptr},
              {"sparsity_config", json::object()}};
    }
    case HfFormat::kFp8Block:
      return {{"quant_method", "fp8"},          {"fmt", "e4m3"},
              {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}},
              {"ignored_layers", ignore},       {"modules_to_not_convert", ignore}};
    default:
      throw std::logic_error("format");
  }
}

json hf_quant_config(const ExportPlan& plan) {
  if (plan.opt.format != HfFormat::kModeloptNvfp4 && plan.opt.format != HfFormat::kMxfp8)
    return nullptr;
  const json q = quantization_config(plan);
  json quant = {{"quant_algo", q["quant_algo"]},
                {"kv_cache_quant_algo", nullptr},
                {"exclude_modules", plan.ignore}};
  if (plan.opt.format == HfFormat::kModeloptNvfp4) quant["group_size"] = 16;
  return {{"producer", q["producer"]}, {"quantization", quant}};
}

}  // namespace lockstep::convert
