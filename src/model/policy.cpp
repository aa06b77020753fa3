// The converter (model/policy.h): learner masters -> the sampler's prepared weights, with a
// checksum the sampler verifies.
#include "lockstep/model/policy.h"

#include <fmt/format.h>

#include "lockstep/nn/grouped_linear.h"
#include "lockstep/recipe/registry.h"

namespace lockstep::model {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

void fnv(uint64_t& h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= kFnvPrime;
  }
}
void fnv_str(uint64_t& h, const std::string& s) {
  const uint64_t n = s.size();
  fnv(h, &n, sizeof n);
  fnv(h, s.data(), s.size());
}
void fnv_tensor(uint64_t& h, const Tensor& t) {
  if (!t.defined()) {
    fnv_str(h, "-");
    return;
  }
  const Tensor c = t.contiguous();
  fnv_str(h, std::string(dtype_name(c.dtype())) + shape_string(c.shape()));
  fnv(h, c.raw(), c.nbytes());
}

}  // namespace

size_t PolicyVersion::nbytes() const {
  size_t n = 0;
  for (const auto& [k, t] : dense) n += t.nbytes();
  for (const auto& [k, o] : operands) n += o.nbytes();
  return n;
}

uint64_t policy_checksum(const PolicyVersion& p) {
  uint64_t h = kFnvOffset;
  fnv(h, &p.version, sizeof p.version);
  fnv_str(h, p.recipe.name);
  for (const auto& [name, t] : p.dense) {
    fnv_str(h, name);
    fnv_tensor(h, t);
  }
  for (const auto& [name, o] : p.operands) {
    fnv_str(h, name);
    if (!o.quantized()) {
      fnv_tensor(h, o.t);
      continue;
    }
    for (const QData* d : {&o.q.rowwise, &o.q.colwise})
      for (const Tensor* t : {&d->data, &d->block_scale, &d->amax, &d->scale_inv})
        fnv_tensor(h, *t);
  }
  return h;
}

PolicyVersion export_policy(const ModelWeights& w, const Recipe& recipe, int64_t version,
                            const ExportOptions& opt) {
  PolicyVersion p;
  p.version = version;
  p.recipe = opt.force_bf16 ? builtin_recipe_or_throw("bf16", "export_policy").recipe : recipe;
  p.config = w.config;
  const ModelPlan plan = resolve_model(p.recipe, int(w.config.num_hidden_layers));
  std::map<std::string, bool> is_linear;
  for (const LinearSite& s : linear_sites(w.config)) {
    const LinearSpec spec = site_spec(plan, s);
    auto found = w.tensors.find(s.name);
    if (found == w.tensors.end())
      throw std::invalid_argument(fmt::format("export_policy: missing weight '{}'", s.name));
    const Tensor& t = found->second;
    const std::string key = s.cls == ModuleClass::kLmHead ? "lm_head" : s.name;
    if (s.groups > 1)
      p.operands[key] = nn::prepare_grouped_fprop_weight(t, s.groups, spec, key, false);
    else
      p.operands[key] = nn::prepare_fprop_weight(t, spec, key, false);
    p.dims[key] = {t.rows() / s.groups, t.cols()};
    if (s.name != "embed") is_linear[s.name] = true;
  }
  for (const auto& [name, t] : w.tensors)
    if (!is_linear.count(name)) p.dense[name] = cast(t, DType::kF32);
  p.checksum = policy_checksum(p);
  return p;
}

DecoderWeights decoder_weights(const PolicyVersion& p) {
  DecoderWeights d;
  d.config = p.config;
  d.plan = resolve_model(p.recipe, int(p.config.num_hidden_layers));
  d.tensors = p.dense;
  d.operands = p.operands;
  d.operand_dims = p.dims;
  return d;
}

}  // namespace lockstep::model
