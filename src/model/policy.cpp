// The converter (model/policy.h): learner masters -> the sampler's prepared weights, with a
// checksum the sampler verifies, the amax an optimizer step supplies, and versions that only move
// forward.
#include "lockstep/model/policy.h"

#include <fmt/format.h>

#include "lockstep/nn/grouped_linear.h"
#include "lockstep/nn/linear.h"
#include "lockstep/numerics/digest64.h"
#include "lockstep/ops/layout.h"
#include "lockstep/quant/given_amax.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/digest.h"

namespace lockstep::model {
namespace {

// NVFP4 per_tensor / per_group: the outer domains a caller's amax can stand for.
bool takes_amax(const QuantSpec& w) {
  return w.format == Format::kNvfp4 && !w.hadamard && !w.stochastic &&
         (w.scaling == Scaling::kPerTensor || w.scaling == Scaling::kPerGroup);
}

// q / k / v rows of a layer's fused qkv weight quantized as three domains.
bool split_qkv(const LinearSite& s, const QuantSpec& w, const ExportOptions& opt) {
  return !opt.fuse_scales && s.cls == ModuleClass::kQkv && takes_amax(w);
}

std::vector<int64_t> qkv_offsets(const ModelConfig& c, int64_t rows_to) {
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  return {0, q, q + kv, rows_to};
}

std::string policy_operand_key(const LinearSite& s) {
  return s.cls == ModuleClass::kLmHead ? "lm_head" : s.name;
}

}  // namespace

size_t PolicyVersion::nbytes() const {
  size_t n = 0;
  for (const auto& [k, t] : dense) n += t.nbytes();
  for (const auto& [k, o] : operands) n += o.nbytes();
  return n;
}

uint64_t policy_checksum(const PolicyVersion& p) {
  // The fields in order (docs/model.md, "The policy checksum"); a field is a value, or the digest
  // of a tensor's bytes, computed for all tensors at once where they live (device tensors by a
  // kernel: only their 8-byte sums come back to the host).
  struct Field {
    uint64_t value = 0;
    int64_t tensor = -1;  // >= 0: the digest of tensors[tensor]
  };
  std::vector<Field> fields;
  std::vector<Tensor> tensors;
  auto text = [&](std::string_view s) { fields.push_back({bytes_digest64(s)}); };
  auto tensor = [&](const Tensor& t) {
    if (!t.defined()) {
      text("-");
      return;
    }
    text(std::string(dtype_name(t.dtype())) + shape_string(t.shape()));
    fields.push_back({0, int64_t(tensors.size())});
    tensors.push_back(t);
  };
  fields.push_back({uint64_t(p.version)});
  text(to_json(p.recipe).dump());
  text(config_to_json(p.config).dump());
  fields.push_back({p.options.fuse_scales ? 1u : 0u});
  for (const auto& [name, t] : p.dense) {
    text(name);
    tensor(t);
  }
  for (const auto& [name, o] : p.operands) {
    text(name);
    if (!o.quantized()) {
      tensor(o.t);
      continue;
    }
    for (const QData* d : {&o.q.rowwise, &o.q.colwise})
      for (const Tensor* t : {&d->data, &d->block_scale, &d->amax, &d->scale_inv}) tensor(*t);
  }
  const std::vector<uint64_t> digests = tensor_digests64(tensors);
  uint64_t h = num::kDigestSeed;
  for (const Field& f : fields)
    h = num::digest_absorb(h, f.tensor >= 0 ? digests[size_t(f.tensor)] : f.value);
  return h;
}

std::optional<std::vector<int64_t>> weight_amax_domains(const ModelConfig& c, const ModelPlan& plan,
                                                        const LinearSite& site,
                                                        const ExportOptions& opt) {
  const LinearSpec spec = site_spec(plan, site);
  const QuantSpec& w = spec[Gemm::kFprop].b;
  if (!takes_amax(w)) return std::nullopt;
  const int64_t rows = site.cls == ModuleClass::kLmHead ? c.vocab_size : [&] {
    for (const auto& [name, shape] : weight_shapes(c))
      if (name == site.name) return shape[0];
    throw std::invalid_argument(fmt::format("weight_amax_domains: no weight '{}'", site.name));
  }();
  if (split_qkv(site, w, opt)) return qkv_offsets(c, rows);
  std::vector<int64_t> o{0};
  if (site.groups > 1 && w.scaling == Scaling::kPerGroup)
    for (int64_t g = 1; g <= site.groups; ++g) o.push_back(rows / site.groups * g);
  else
    o.push_back(rows);
  return o;
}

std::map<std::string, int64_t> weight_amax_domain_counts(const ModelConfig& c, const Recipe& recipe,
                                                         const ExportOptions& opt) {
  std::map<std::string, int64_t> out;
  if (opt.force_bf16) return out;
  const ModelPlan plan = resolve_model(recipe, int(c.num_hidden_layers));
  for (const LinearSite& s : linear_sites(c)) {
    const auto o = weight_amax_domains(c, plan, s, opt);
    if (!o) continue;
    const int64_t d = int64_t(o->size()) - 1, each = o->back() / d;
    bool equal = true;
    for (int64_t i = 0; i < d; ++i) equal = equal && (*o)[size_t(i + 1)] - (*o)[size_t(i)] == each;
    if (equal) out[s.name] = d;
  }
  return out;
}

WeightAmax usable_weight_amax(const WeightAmax& amax, const ModelConfig& c, const Recipe& recipe,
                              const ExportOptions& opt) {
  WeightAmax out;
  for (const auto& [name, d] : weight_amax_domain_counts(c, recipe, opt))
    if (const auto it = amax.find(name); it != amax.end() && it->second.numel() == d)
      out[name] = it->second;
  return out;
}

nn::Operand convert_weight(const Tensor& w, const ModelConfig& c, const ModelPlan& plan,
                           const LinearSite& s, const ExportOptions& opt, const Tensor* amax) {
  const LinearSpec spec = site_spec(plan, s);
  const QuantSpec& ws = spec[Gemm::kFprop].b;
  const std::string key = policy_operand_key(s);
  const bool split = split_qkv(s, ws, opt);
  if (amax && !takes_amax(ws))
    throw std::invalid_argument(
        fmt::format("convert '{}': an amax was supplied, but its weight spec ({} {}) takes none",
                    s.name, format_name(ws.format), scaling_name(ws.scaling)));
  if (!amax && !split) {
    if (s.groups > 1) return nn::prepare_grouped_fprop_weight(w, s.groups, spec, key, false);
    return nn::prepare_fprop_weight(w, spec, key, false);
  }
  // The learner's padding and domains (nn::prepare_*_fprop_weight and make_operand), with the
  // domain amax given or, for separate q / k / v, three domains.
  const nn::LinearDims d = nn::LinearDims::of(w.rows() / s.groups, w.cols(), spec);
  QuantConfig qc(ws);
  std::vector<int64_t> off;
  Tensor wp;
  if (s.groups > 1) {
    wp = ops::pad_groups(w, s.groups, d.out_padded, d.in_padded);
    for (int64_t g = 0; g <= s.groups; ++g) off.push_back(g * d.out_padded);
  } else {
    wp = ops::pad2d(w, d.out_padded, d.in_padded);
    if (split) {
      off = qkv_offsets(c, d.out_padded);
      qc.scaling = Scaling::kPerGroup;
    } else if (ws.scaling == Scaling::kPerGroup) {
      off = {0, d.out_padded};  // a dense tensor is one group (make_operand)
    }
  }
  nn::Operand op;
  if (amax) {
    const int64_t want = nvfp4_outer_domains(off, qc.scaling);
    if (amax->numel() != want)
      throw std::invalid_argument(
          fmt::format("convert '{}': {} amax value(s) supplied, the weight has {} outer domain(s)",
                      s.name, amax->numel(), want));
    op.q = quantize_with_amax(wp, off, *amax, qc, key);
  } else {
    op.q = quantize_grouped(wp, off, qc, key);
  }
  if (s.groups == 1 && !split && ws.scaling == Scaling::kPerGroup) op.q = group_view(op.q, 0);
  return op;
}

PolicyVersion export_policy(const ModelWeights& w, const Recipe& recipe, int64_t version,
                            const ExportOptions& opt, const WeightAmax* amax) {
  PolicyVersion p;
  p.version = version;
  p.recipe = opt.force_bf16 ? builtin_recipe_or_throw("bf16", "export_policy").recipe : recipe;
  p.config = w.config;
  p.options = opt;
  const ModelPlan plan = resolve_model(p.recipe, int(w.config.num_hidden_layers));
  std::map<std::string, bool> is_linear;
  for (const LinearSite& s : linear_sites(w.config)) {
    auto found = w.tensors.find(s.name);
    if (found == w.tensors.end())
      throw std::invalid_argument(fmt::format("export_policy: missing weight '{}'", s.name));
    const Tensor& t = found->second;
    const std::string key = policy_operand_key(s);
    const Tensor* a = nullptr;
    if (amax && !opt.force_bf16)
      if (auto it = amax->find(s.name);
          it != amax->end() && takes_amax(site_spec(plan, s)[Gemm::kFprop].b))
        a = &it->second;
    p.operands[key] = convert_weight(t, w.config, plan, s, opt, a);
    p.dims[key] = {t.rows() / s.groups, t.cols()};
    if (s.name != "embed") is_linear[s.name] = true;
  }
  for (const auto& [name, t] : w.tensors)
    if (!is_linear.count(name)) p.dense[name] = cast(t, DType::kF32);
  p.checksum = policy_checksum(p);
  return p;
}

PolicyConverter::PolicyConverter(Recipe recipe, ExportOptions opt)
    : recipe_(std::move(recipe)), opt_(opt) {}

PolicyVersion PolicyConverter::convert(const ModelWeights& weights, int64_t version,
                                       const WeightAmax* amax) {
  if (last_ && version <= *last_)
    throw PolicyError(
        fmt::format("converter: version {} refused: versions only move forward (the last was {})",
                    version, *last_));
  PolicyVersion p = export_policy(weights, recipe_, version, opt_, amax);
  last_ = version;
  return p;
}

DecoderWeights decoder_weights(const PolicyVersion& p, Device device) {
  DecoderWeights d;
  d.config = p.config;
  d.plan = resolve_model(p.recipe, int(p.config.num_hidden_layers));
  d.operand_dims = p.dims;
  if (device.is_cpu()) {
    d.tensors = p.dense;
    d.operands = p.operands;
    return d;
  }
  for (const auto& [name, t] : p.dense) d.tensors[name] = t.to(device);
  for (const auto& [name, op] : p.operands) {
    nn::Operand o;
    if (op.t.defined()) o.t = op.t.to(device);
    if (op.quantized()) o.q = op.q.to(device);
    d.operands[name] = std::move(o);
  }
  return d;
}

}  // namespace lockstep::model
