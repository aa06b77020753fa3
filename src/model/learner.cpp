// The learner (model/learner.h): masters, gradients and AdamW moments as maps of host tensors in
// name order (the fixed order of the gradient norm and of the checkpoint), a decoder over views of
// the masters, and the log-prob / entropy head with temperature.
#include "lockstep/model/learner.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/file_io.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::model {

ModelPlan plan_for(const ModelConfig& c, const Recipe& r, std::span<const CodeOverride> code) {
  return resolve_model(r, int(c.num_hidden_layers), code);
}

struct Learner::Impl {
  ModelWeights w;
  std::map<std::string, Tensor> grads, m, v;
  std::map<std::string, Tensor> amax;  // F32 [domains] per master: its amax after the last step
  std::map<std::string, int64_t> amax_domains;  // masters with more than one amax domain
  Recipe recipe;
  LearnerConfig cfg;
  ModelPlan plan;
  std::unique_ptr<Decoder> dec;
  int64_t version = 0;
  int64_t steps = 0;  // AdamW steps taken (the bias-correction count)
  // Kept by forward for backward.
  Tensor scaled_logits, targets;
  ops::TokenLogprobs lp;
  bool has_forward = false;

  void build() {
    grads.clear();
    for (auto& [name, t] : w.tensors) {
      grads[name] = Tensor(t.dtype(), t.shape(), t.device());
      if (!m.count(name)) m[name] = Tensor(t.dtype(), t.shape(), t.device());
      if (!v.count(name)) v[name] = Tensor(t.dtype(), t.shape(), t.device());
    }
    plan = plan_for(w.config, recipe, cfg.code_overrides);
    DecoderWeights dw;
    dw.config = w.config;
    dw.plan = plan;
    dw.tensors = w.tensors;  // views: the optimizer updates them in place
    dw.grads = grads;
    dec = std::make_unique<Decoder>(std::move(dw));
    dec->set_kv_dtype(cfg.kv);
  }
};

Learner::Learner(ModelWeights weights, Recipe recipe, LearnerConfig cfg)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (cfg.dtype != DType::kF32 && cfg.dtype != DType::kF64)
    throw std::invalid_argument("learner: dtype must be F32 or F64");
  if (cfg.dtype == DType::kF64 && !cfg.device.is_cpu())
    throw std::invalid_argument("learner: F64 (the gradient-check path) runs on the CPU only");
  require_device(cfg.device);
  if (!(cfg.temperature > 0.0))
    throw std::invalid_argument(
        fmt::format("learner: temperature {} must be > 0", cfg.temperature));
  m.w.config = weights.config;
  for (auto& [name, t] : weights.tensors)
    m.w.tensors[name] = cast(t.to(Device::cpu()), cfg.dtype).clone().to(cfg.device);
  m.recipe = std::move(recipe);
  m.cfg = std::move(cfg);
  m.build();
}

Learner::~Learner() = default;

namespace {
Tensor scaled(const Tensor& logits, double temperature) {
  return temperature == 1.0 ? logits : ops::scale(logits, 1.0 / temperature);
}
}  // namespace

LearnerOutput Learner::forward(const Tensor& tokens, std::span<const int64_t> cu,
                               const Tensor& targets, const Routing* replay, Routing* record) {
  Impl& m = *impl_;
  if (targets.numel() != tokens.numel())
    throw std::invalid_argument(
        fmt::format("learner: {} targets for {} tokens", targets.numel(), tokens.numel()));
  if (targets.dtype() != DType::kI32 || !targets.is_cpu())
    throw std::invalid_argument(
        fmt::format("learner: targets must be an I32 host tensor, got {}", targets.describe()));
  {
    const Tensor t = targets.contiguous();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (t.ptr<int32_t>()[i] < 0 || t.ptr<int32_t>()[i] >= m.w.config.vocab_size)
        throw std::invalid_argument(fmt::format(
            "learner: target {} at position {} is out of range for the vocabulary of {} tokens",
            t.ptr<int32_t>()[i], i, m.w.config.vocab_size));
  }
  const Tensor logits = m.dec->forward(tokens, cu, m.cfg.mode, /*save=*/true, replay, record);
  m.scaled_logits = scaled(logits, m.cfg.temperature);
  m.targets = targets.contiguous().to(m.cfg.device);
  m.lp = ops::token_logprobs(m.scaled_logits, m.targets);
  m.has_forward = true;
  return {m.lp.logp.to(Device::cpu()), m.lp.entropy.to(Device::cpu())};
}

Tensor Learner::logits(const Tensor& tokens, std::span<const int64_t> cu, const Routing* replay) {
  return impl_->dec->forward(tokens, cu, impl_->cfg.mode, /*save=*/false, replay);
}

void Learner::backward(const Tensor& dlogp, const Tensor& dentropy) {
  Impl& m = *impl_;
  if (!m.has_forward) throw std::logic_error("learner: backward without a forward");
  const Device dev = m.cfg.device;
  const Tensor ds = ops::token_logprobs_backward(m.scaled_logits, m.targets, m.lp,
                                                 dlogp.defined() ? dlogp.to(dev) : Tensor(),
                                                 dentropy.defined() ? dentropy.to(dev) : Tensor());
  // Philox seed of this step's stochastic rounding: the learner seed mixed with the step count.
  m.dec->set_grad_seed(m.cfg.seed ^ (uint64_t(m.steps + 1) * 0x9E3779B97F4A7C15ull));
  m.dec->backward(scaled(ds, m.cfg.temperature));
  m.has_forward = false;
  m.scaled_logits = m.targets = Tensor();
  m.lp = {};
}

StepStats Learner::step() {
  Impl& m = *impl_;
  StepStats st;
  std::vector<Tensor> gs;
  for (auto& [name, g] : m.grads) gs.push_back(g);
  st.grad_norm = ops::grad_norm(gs);
  if (!std::isfinite(st.grad_norm)) {
    st.skipped = true;
  } else {
    double coef = 1.0;
    if (m.cfg.max_grad_norm > 0.0) {
      coef = m.cfg.max_grad_norm / (st.grad_norm + 1e-6);
      st.clipped = coef < 1.0;
    }
    const double gscale = st.clipped ? coef : 1.0;
    for (auto& [name, p] : m.w.tensors)
      ops::adamw_step(p, m.grads.at(name), m.m.at(name), m.v.at(name), m.cfg.adamw, m.steps + 1,
                      gscale, &m.amax[name],
                      m.amax_domains.count(name) ? m.amax_domains.at(name) : 1);
    ++m.steps;
    ++m.version;
    m.dec->weights_changed();
  }
  zero_grad();
  st.version = m.version;
  return st;
}

void Learner::set_lr(double lr) {
  if (!std::isfinite(lr) || lr < 0.0)
    throw std::invalid_argument(fmt::format("learner: lr {} must be finite and >= 0", lr));
  impl_->cfg.adamw.lr = lr;
}

void Learner::weights_changed() {
  impl_->dec->weights_changed();
  impl_->amax.clear();  // the amax of the last step no longer describes the masters
}

void Learner::set_weight_amax_domains(const std::map<std::string, int64_t>& domains) {
  Impl& m = *impl_;
  for (const auto& [name, d] : domains) {
    const auto it = m.w.tensors.find(name);
    if (it == m.w.tensors.end())
      throw std::invalid_argument(
          fmt::format("learner: amax domains for '{}', which is not a master weight", name));
    if (d < 1 || it->second.rows() % d != 0)
      throw std::invalid_argument(
          fmt::format("learner: {} amax domains for '{}' {}: the count must be >= 1 and divide "
                      "its rows",
                      d, name, it->second.describe()));
  }
  m.amax_domains = domains;
  m.amax.clear();
}

void Learner::zero_grad() {
  for (auto& [name, g] : impl_->grads) g.fill_bytes(0);
}

int64_t Learner::gradient_numel() const {
  int64_t n = 0;
  for (const auto& [name, g] : impl_->grads) n += g.numel();
  return n;
}

Tensor Learner::gradient_flat() const {
  const Impl& m = *impl_;
  if (m.cfg.dtype != DType::kF32)
    throw std::logic_error("learner: gradient_flat needs an F32 learner");
  Tensor flat = Tensor::empty(DType::kF32, {gradient_numel()}, m.cfg.device);
  int64_t off = 0;
  for (const auto& [name, g] : m.grads) {
    flat.slice_rows(off, off + g.numel()).copy_from(g.contiguous().view({g.numel()}));
    off += g.numel();
  }
  return flat;
}

void Learner::set_gradient_flat(const Tensor& flat) {
  Impl& m = *impl_;
  if (!flat.defined() || flat.dtype() != DType::kF32 || flat.numel() != gradient_numel() ||
      !flat.is_contiguous())
    throw std::invalid_argument(fmt::format(
        "learner: set_gradient_flat needs a contiguous F32 tensor of {} elements, got {}",
        gradient_numel(), flat.defined() ? flat.describe() : std::string("an undefined tensor")));
  const Tensor src = flat.view({flat.numel()});
  int64_t off = 0;
  for (auto& [name, g] : m.grads) {
    g.copy_from(src.slice_rows(off, off + g.numel()).view(g.shape()));
    off += g.numel();
  }
}

const ModelWeights& Learner::weights() const { return impl_->w; }
const std::map<std::string, Tensor>& Learner::weight_amax() const { return impl_->amax; }
const std::map<std::string, Tensor>& Learner::grads() const { return impl_->grads; }
const Recipe& Learner::recipe() const { return impl_->recipe; }
const ModelPlan& Learner::plan() const { return impl_->plan; }
const LearnerConfig& Learner::config() const { return impl_->cfg; }
int64_t Learner::version() const { return impl_->version; }
size_t Learner::saved_bytes() const { return impl_->dec->saved_bytes(); }

namespace {

Json learner_settings_json(const LearnerConfig& c) {
  Json j;
  j["lr"] = c.adamw.lr;
  j["beta1"] = c.adamw.beta1;
  j["beta2"] = c.adamw.beta2;
  j["eps"] = c.adamw.eps;
  j["weight_decay"] = c.adamw.weight_decay;
  j["max_grad_norm"] = c.max_grad_norm;
  j["mode"] = std::string(exec_mode_name(c.mode));
  j["temperature"] = c.temperature;
  j["seed"] = c.seed;
  j["dtype"] = std::string(dtype_name(c.dtype));
  j["kv"] = c.kv == KvDtype::kFp8E4M3 ? "fp8" : "bf16";
  Json ov = Json::array();
  for (const CodeOverride& o : c.code_overrides)
    ov.push_back({{"pattern", o.pattern}, {"spec", o.spec ? to_json(*o.spec) : Json(nullptr)}});
  j["code_overrides"] = ov;
  return j;
}

LearnerConfig learner_settings_from_json(const Json& j, const std::string& where) {
  LearnerConfig c;
  c.adamw.lr = j.at("lr").get<double>();
  c.adamw.beta1 = j.at("beta1").get<double>();
  c.adamw.beta2 = j.at("beta2").get<double>();
  c.adamw.eps = j.at("eps").get<double>();
  c.adamw.weight_decay = j.at("weight_decay").get<double>();
  c.max_grad_norm = j.at("max_grad_norm").get<double>();
  c.mode = j.at("mode").get<std::string>() == "fast" ? ExecMode::kFast : ExecMode::kDeterministic;
  c.temperature = j.at("temperature").get<double>();
  c.seed = j.at("seed").get<uint64_t>();
  c.dtype = j.at("dtype").get<std::string>() == dtype_name(DType::kF64) ? DType::kF64 : DType::kF32;
  // A checkpoint without "kv" rounds K / V to bf16.
  const std::string kv = j.value("kv", std::string("bf16"));
  if (kv != "bf16" && kv != "fp8")
    throw std::invalid_argument(
        fmt::format("{}: learner 'kv' is '{}' (known: bf16, fp8)", where, kv));
  c.kv = kv == "fp8" ? KvDtype::kFp8E4M3 : KvDtype::kBf16;
  for (const Json& o : j.at("code_overrides")) {
    CodeOverride co;
    co.pattern = o.at("pattern").get<std::string>();
    if (!o.at("spec").is_null()) co.spec = linear_from_json(o.at("spec"), LinearSpec{}, where);
    c.code_overrides.push_back(co);
  }
  return c;
}

}  // namespace

void Learner::save_checkpoint(const std::string& dir) const {
  const Impl& m = *impl_;
  std::filesystem::create_directories(dir);
  SafetensorsFile f;
  for (const char* kind : {"param", "adam_m", "adam_v"}) {
    const auto& src = std::string(kind) == "param"    ? m.w.tensors
                      : std::string(kind) == "adam_m" ? m.m
                                                      : m.v;
    for (const auto& [name, t] : src)
      f.tensors.push_back({std::string(kind) + "." + name, t.to(Device::cpu())});
  }
  f.metadata["lockstep.checkpoint"] = "learner";
  write_safetensors((std::filesystem::path(dir) / "learner.safetensors").string(), f);
  Json j;
  j["format"] = "lockstep.learner.v1";
  j["config"] = config_to_json(m.w.config);
  j["recipe"] = to_json(m.recipe);
  j["version"] = m.version;
  j["steps"] = m.steps;
  j["learner"] = learner_settings_json(m.cfg);
  write_file_atomic(std::filesystem::path(dir) / "learner.json", j.dump(2) + "\n");
}

std::unique_ptr<Learner> Learner::load_checkpoint(const std::string& dir, Device device) {
  const std::filesystem::path jp = std::filesystem::path(dir) / "learner.json";
  std::string text;
  try {
    text = read_input_file(jp.string());  // regular files only: a FIFO or device is refused
  } catch (const InputPathError& e) {
    throw std::invalid_argument(fmt::format("learner checkpoint: cannot read {}", e.what()));
  }
  Json j;
  try {
    j = parse_json(text);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("learner checkpoint {}: {}", jp.string(), e.what()));
  }
  const std::string where = jp.string();
  ModelWeights w;
  w.config = config_from_json(j.at("config"), where);
  const Recipe recipe = recipe_from_json(j.at("recipe"), where);
  LearnerConfig cfg = learner_settings_from_json(j.at("learner"), where);
  cfg.device = device;
  const SafetensorsFile f =
      read_safetensors((std::filesystem::path(dir) / "learner.safetensors").string());
  std::map<std::string, Tensor> moments_m, moments_v;
  for (const NamedTensor& nt : f.tensors) {
    const std::string& n = nt.name;
    if (n.rfind("param.", 0) == 0)
      w.tensors[n.substr(6)] = nt.tensor;
    else if (n.rfind("adam_m.", 0) == 0)
      moments_m[n.substr(7)] = nt.tensor;
    else if (n.rfind("adam_v.", 0) == 0)
      moments_v[n.substr(7)] = nt.tensor;
  }
  auto l = std::make_unique<Learner>(std::move(w), recipe, cfg);
  Impl& m = *l->impl_;
  for (auto& [name, t] : m.w.tensors) {
    if (!moments_m.count(name) || !moments_v.count(name))
      throw std::invalid_argument(
          fmt::format("learner checkpoint {}: no AdamW moments for '{}'", dir, name));
    m.m.at(name).copy_from(moments_m.at(name));
    m.v.at(name).copy_from(moments_v.at(name));
  }
  m.version = j.at("version").get<int64_t>();
  m.steps = j.at("steps").get<int64_t>();
  return l;
}

}  // namespace lockstep::model
