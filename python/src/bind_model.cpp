// Python bindings of the model layer: model directories and presets (ModelWeights), the learner
// (log-probs and entropy of packed sequences, backward, AdamW steps, policy export), policy
// versions and the sampler (generate, teacher-forced score): enough to drive an RL loop from
// Python and to compare lockstep's log-probs with another engine's on the same tokens.
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <vector>

#include "bindings.h"
#include "bridge.h"
#include "lockstep/model/config.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/model/weights.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/device.h"

namespace lockstep::py {
namespace {

using model::ModelWeights;

Tensor token_ids(nb::handle h, const std::string& what) {
  Tensor t = tensor_from(h, what);
  if (t.dim() != 1 || t.dtype() != DType::kI32)
    throw ArgError(
        fmt::format("{}: {} must be a 1-D int32 array of token ids", what, t.describe()));
  return t.to(Device::cpu());
}

std::vector<int64_t> seqlens(nb::handle h, const std::string& what) {
  std::vector<int64_t> out;
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    for (nb::handle v : h) out.push_back(nb::cast<int64_t>(v));
    return out;
  }
  const Tensor t = tensor_from(h, what).to(Device::cpu());
  if (t.dim() != 1 || (t.dtype() != DType::kI64 && t.dtype() != DType::kI32))
    throw ArgError(
        fmt::format("{}: {} must be 1-D int32 / int64 [sequences + 1]", what, t.describe()));
  if (t.dtype() == DType::kI64) {
    auto v = t.data<int64_t>();
    return {v.begin(), v.end()};
  }
  auto v = t.data<int32_t>();
  return {v.begin(), v.end()};
}

Tensor optional_f32(nb::handle h, const std::string& what) {
  if (h.is_none()) return {};
  Tensor t = tensor_from(h, what);
  if (t.dim() != 1 || t.dtype() != DType::kF32)
    throw ArgError(fmt::format("{}: {} must be a 1-D float32 array", what, t.describe()));
  return t.to(Device::cpu());
}

model::KvDtype kv_of(const std::string& s) {
  if (s == "bf16") return model::KvDtype::kBf16;
  if (s == "fp8") return model::KvDtype::kFp8E4M3;
  throw ArgError(fmt::format("Sampler: kv_cache must be 'bf16' or 'fp8', not '{}'", s));
}

}  // namespace

void bind_model(nb::module_& m) {
  nb::class_<ModelWeights>(m, "ModelWeights", "A model's config and F32 master weights")
      .def_static(
          "load", [](const std::string& dir) { return model::load_model_dir(dir); }, nb::arg("dir"),
          "A Hugging Face style model directory (config.json + safetensors)")
      .def_static(
          "init",
          [](const std::optional<std::string>& preset,
             const std::optional<std::string>& config_json, uint64_t seed) {
            if (preset.has_value() == config_json.has_value())
              throw ArgError("ModelWeights.init: give exactly one of preset or config");
            const model::ModelConfig c =
                preset ? model::preset(*preset)
                       : model::config_from_json(parse_json(*config_json), "config");
            return model::init_weights(c, seed);
          },
          nb::arg("preset").none() = nb::none(), nb::arg("config_json").none() = nb::none(),
          nb::arg("seed") = 0)
      .def_static("presets", &model::preset_names)
      .def(
          "save",
          [](const ModelWeights& w, const std::string& dir, const std::string& dtype) {
            const DType d = dtype_from_string(dtype, "ModelWeights.save: dtype");
            nb::gil_scoped_release nogil;
            model::save_model_dir(w, dir, d);
          },
          nb::arg("dir"), nb::arg("dtype") = "f32")
      .def_prop_ro("config_json_text",
                   [](const ModelWeights& w) { return model::config_to_json(w.config).dump(); })
      .def("names",
           [](const ModelWeights& w) {
             std::vector<std::string> out;
             for (const auto& [k, v] : w.tensors) out.push_back(k);
             return out;
           })
      .def(
          "tensor", [](const ModelWeights& w, const std::string& n) { return to_array(w.at(n)); },
          nb::arg("name"), "A weight in lockstep's layout (the same memory: writes are seen)");

  nb::class_<model::PolicyVersion>(m, "PolicyVersion", "The sampler's copy of a weight version")
      .def_prop_ro("version", [](const model::PolicyVersion& p) { return p.version; })
      .def_prop_ro("recipe", [](const model::PolicyVersion& p) { return p.recipe.name; })
      .def_prop_ro("checksum", [](const model::PolicyVersion& p) { return p.checksum; })
      .def_prop_ro("nbytes", &model::PolicyVersion::nbytes);
  m.def(
      "export_policy",
      [](const ModelWeights& w, const Recipe& r, int64_t version, bool force_bf16) {
        model::ExportOptions o;
        o.force_bf16 = force_bf16;
        nb::gil_scoped_release nogil;
        return model::export_policy(w, r, version, o);
      },
      nb::arg("weights"), nb::arg("recipe"), nb::arg("version") = 0, nb::arg("force_bf16") = false);

  nb::class_<model::Learner>(m, "Learner", "Log-probs, backward and AdamW over packed sequences")
      .def(
          "__init__",
          [](model::Learner* self, const ModelWeights& w, const Recipe& r, bool deterministic,
             double temperature, double lr, double weight_decay, double max_grad_norm,
             uint64_t seed) {
            model::LearnerConfig c;
            c.mode = deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
            c.temperature = temperature;
            c.adamw.lr = lr;
            c.adamw.weight_decay = weight_decay;
            c.max_grad_norm = max_grad_norm;
            c.seed = seed;
            // The learner updates its masters in place: it gets its own copy of the bytes.
            ModelWeights own = w;
            for (auto& [name, t] : own.tensors) t = t.clone();
            new (self) model::Learner(std::move(own), r, c);
          },
          nb::arg("weights"), nb::arg("recipe"), nb::arg("deterministic") = true,
          nb::arg("temperature") = 1.0, nb::arg("lr") = 1e-3, nb::arg("weight_decay") = 0.0,
          nb::arg("max_grad_norm") = 1.0, nb::arg("seed") = 0)
      .def(
          "forward",
          [](model::Learner& l, nb::handle tokens, nb::handle cu, nb::handle targets) {
            const Tensor ids = token_ids(tokens, "Learner.forward: tokens");
            const Tensor tg = token_ids(targets, "Learner.forward: targets");
            const std::vector<int64_t> c = seqlens(cu, "Learner.forward: cu_seqlens");
            model::LearnerOutput out;
            {
              nb::gil_scoped_release nogil;
              out = l.forward(ids, c, tg);
            }
            return nb::make_tuple(to_array(out.logp), to_array(out.entropy));
          },
          nb::arg("tokens"), nb::arg("cu_seqlens"), nb::arg("targets"))
      .def(
          "logits",
          [](model::Learner& l, nb::handle tokens, nb::handle cu) {
            const Tensor ids = token_ids(tokens, "Learner.logits: tokens");
            const std::vector<int64_t> c = seqlens(cu, "Learner.logits: cu_seqlens");
            Tensor out;
            {
              nb::gil_scoped_release nogil;
              out = l.logits(ids, c);
            }
            return to_array(out);
          },
          nb::arg("tokens"), nb::arg("cu_seqlens"))
      .def(
          "backward",
          [](model::Learner& l, nb::handle dlogp, nb::handle dentropy) {
            const Tensor a = optional_f32(dlogp, "Learner.backward: dlogp");
            const Tensor b = optional_f32(dentropy, "Learner.backward: dentropy");
            nb::gil_scoped_release nogil;
            l.backward(a, b);
          },
          nb::arg("dlogp").none(), nb::arg("dentropy").none() = nb::none())
      .def("step",
           [](model::Learner& l) {
             model::StepStats s;
             {
               nb::gil_scoped_release nogil;
               s = l.step();
             }
             nb::dict d;
             d["grad_norm"] = s.grad_norm;
             d["clipped"] = s.clipped;
             d["skipped"] = s.skipped;
             d["version"] = s.version;
             return d;
           })
      .def("zero_grad", &model::Learner::zero_grad)
      .def_prop_ro("version", &model::Learner::version)
      .def(
          "weights", [](const model::Learner& l) { return l.weights(); },
          "The current masters (ModelWeights sharing the learner's memory)")
      .def(
          "export_policy",
          [](const model::Learner& l, bool force_bf16) {
            model::ExportOptions o;
            o.force_bf16 = force_bf16;
            nb::gil_scoped_release nogil;
            return model::export_policy(l.weights(), l.recipe(), l.version(), o);
          },
          nb::arg("force_bf16") = false)
      .def("save_checkpoint", &model::Learner::save_checkpoint, nb::arg("dir"))
      .def_static(
          "load_checkpoint",
          [](const std::string& dir, const std::string& device) {
            return model::Learner::load_checkpoint(dir, select_device(device));
          },
          nb::arg("dir"), nb::arg("device") = "cpu");

  nb::class_<model::Sampler>(m, "Sampler", "KV-cache decode with continuous batching")
      .def(
          "__init__",
          [](model::Sampler* self, double temperature, double top_p, int64_t top_k, int64_t max_new,
             uint64_t seed, const std::string& kv, int64_t max_batch, std::optional<int64_t> eos) {
            model::SamplerConfig c;
            c.temperature = temperature;
            c.top_p = top_p;
            c.top_k = top_k;
            c.max_new = max_new;
            c.seed = seed;
            c.kv = kv_of(kv);
            c.max_batch = max_batch;
            c.eos = eos;
            new (self) model::Sampler(c);
          },
          nb::arg("temperature") = 1.0, nb::arg("top_p") = 1.0, nb::arg("top_k") = 0,
          nb::arg("max_new") = 16, nb::arg("seed") = 0, nb::arg("kv_cache") = "bf16",
          nb::arg("max_batch") = 64, nb::arg("eos").none() = nb::none())
      .def(
          "load_policy",
          [](model::Sampler& s, const model::PolicyVersion& p, int64_t version,
             const std::string& recipe) { s.load_policy(p, version, recipe); },
          nb::arg("policy"), nb::arg("expected_version"), nb::arg("expected_recipe") = "")
      .def_prop_ro("version", &model::Sampler::version)
      .def(
          "generate",
          [](model::Sampler& s, const std::vector<std::vector<int32_t>>& prompts,
             std::optional<std::vector<uint32_t>> streams) {
            if (streams && streams->size() != prompts.size())
              throw ArgError(fmt::format("Sampler.generate: {} streams for {} prompts",
                                         streams->size(), prompts.size()));
            std::vector<model::SampleRequest> req(prompts.size());
            for (size_t i = 0; i < prompts.size(); ++i) {
              req[i].prompt = prompts[i];
              req[i].stream = streams ? (*streams)[i] : uint32_t(i);
            }
            std::vector<model::SampleResult> res;
            {
              nb::gil_scoped_release nogil;
              res = s.generate(req);
            }
            nb::list out;
            for (const model::SampleResult& r : res) {
              nb::dict d;
              d["tokens"] = r.tokens;
              d["logprobs"] = r.logprobs;
              d["eos"] = r.eos;
              out.append(d);
            }
            return out;
          },
          nb::arg("prompts"), nb::arg("streams").none() = nb::none())
      .def(
          "score",
          [](model::Sampler& s, const std::vector<int32_t>& prompt,
             const std::vector<int32_t>& continuation) {
            nb::gil_scoped_release nogil;
            return s.score(prompt, continuation);
          },
          nb::arg("prompt"), nb::arg("continuation"));
}

}  // namespace lockstep::py
