// Python bindings of the nn modules: handles over nn::Linear and nn::GroupedLinear, built from
// arrays the Python side owns (weight, gradient accumulator; no copies) and a recipe, so that
// lockstep.torch's autograd functions run exactly the C++ modules' forward and backward, on the
// caller's stream.
#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "bindings.h"
#include "bridge.h"
#include "lockstep/nn/grouped_linear.h"
#include "lockstep/nn/linear.h"

namespace lockstep::py {

LinearSpec module_spec(const Recipe& r, const std::string& cls, int layer, int layers);

namespace {

Tensor weight_of(nb::handle h, const std::string& what) {
  Tensor w = tensor_from(h, what);
  if (w.dim() != 2 || (w.dtype() != DType::kF32 && w.dtype() != DType::kF64))
    throw ArgError(
        fmt::format("{}: {} must be a 2-D float32 (or float64) master weight", what, w.describe()));
  return w;
}

Tensor grad_of(nb::handle h, const Tensor& w, const std::string& what) {
  if (h.is_none()) return {};
  Tensor g = tensor_from(h, what);
  if (g.shape() != w.shape() || g.dtype() != w.dtype() || g.device() != w.device())
    throw ArgError(
        fmt::format("{}: {} must match the weight {}", what, g.describe(), w.describe()));
  return g;
}

Tensor activation(nb::handle h, const std::string& what) {
  Tensor x = tensor_from(h, what);
  if (x.dim() != 2 || (x.dtype() != DType::kF32 && x.dtype() != DType::kF64))
    throw ArgError(
        fmt::format("{}: {} must be a 2-D float32 array [tokens, features] (float64 "
                    "with f32 recipes)",
                    what, x.describe()));
  return x;
}

// Group offsets I64 [groups + 1]: a list of ints (a host tensor) or an int64 array on the host or
// the activations' device (no host round trip where the module does not need one).
Tensor group_offsets(nb::handle h, const std::string& what) {
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    std::vector<int64_t> v;
    for (nb::handle e : h) v.push_back(nb::cast<int64_t>(e));
    return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}, DType::kI64);
  }
  Tensor t = tensor_from(h, what);
  if (t.dim() != 1 || t.dtype() != DType::kI64)
    throw ArgError(fmt::format("{}: {} must be 1-D int64 [groups + 1]", what, t.describe()));
  return t;
}

GemmOrder parse_order(const std::string& s) {
  if (s == "batch_invariant") return GemmOrder::kBatchInvariant;
  if (s == "fast") return GemmOrder::kFast;
  throw ArgError(fmt::format("gemm order must be 'batch_invariant' or 'fast', not '{}'", s));
}

// Runs f (a module's forward or backward) without the GIL with `stream` as the thread's current
// lockstep stream, so every op, GEMM and allocation underneath is ordered on the caller's stream.
template <class F>
nb::object on_stream(const Tensor& t, uint64_t stream, const std::string& what, F&& f) {
  const Stream s = stream_for(stream, t.device(), what);
  Tensor out;
  {
    nb::gil_scoped_release nogil;
    StreamGuard on(s);
    out = f();
  }
  return to_array(out);
}

nb::object operand_part(const nn::Operand& o) {
  if (o.quantized()) return nb::cast(o.q);
  return to_array(o.t);
}

}  // namespace

void bind_nn(nb::module_& m) {
  nb::class_<nn::Linear>(m, "Linear", "nn::Linear: y = x W^T in the recipe's formats")
      .def(
          "__init__",
          [](nn::Linear* self, const std::string& name, nb::handle weight, nb::handle grad,
             const Recipe& recipe, const std::string& cls, int layer, int layers,
             uint32_t rng_stream) {
            Tensor w = weight_of(weight, name + ".weight");
            Tensor g = grad_of(grad, w, name + ".grad");
            new (self) nn::Linear(name, w, g, module_spec(recipe, cls, layer, layers), rng_stream);
          },
          nb::arg("name"), nb::arg("weight"), nb::arg("grad").none(), nb::arg("recipe"),
          nb::arg("module_class") = "", nb::arg("layer") = -1, nb::arg("layers") = 1,
          nb::arg("rng_stream") = 0)
      .def_static(
          "inference",
          [](const std::string& name, nb::handle weight, const Recipe& recipe,
             const std::string& cls, int layer, int layers) {
            const Tensor w = weight_of(weight, name + ".weight");
            const LinearSpec spec = module_spec(recipe, cls, layer, layers);
            nn::Operand op = nn::prepare_fprop_weight(w, spec, name + ".weight", false);
            return nn::Linear::from_operand(name, std::move(op), w.rows(), w.cols(), spec);
          },
          nb::arg("name"), nb::arg("weight"), nb::arg("recipe"), nb::arg("module_class") = "",
          nb::arg("layer") = -1, nb::arg("layers") = 1,
          "A forward-only module over the weight prepared once (the master is not kept)")
      .def(
          "forward",
          [](nn::Linear& l, nb::handle x, bool save, uint64_t stream) {
            const Tensor t = activation(x, l.name() + ".input");
            return on_stream(t, stream, l.name() + ".input", [&] { return l.forward(t, save); });
          },
          nb::arg("x"), nb::arg("save") = true, nb::arg("stream") = 0)
      .def(
          "backward",
          [](nn::Linear& l, nb::handle dy, uint64_t stream) {
            const Tensor t = activation(dy, l.name() + ".grad_output");
            return on_stream(t, stream, l.name() + ".grad_output", [&] { return l.backward(t); });
          },
          nb::arg("dy"), nb::arg("stream") = 0)
      .def("set_grad_seed", &nn::Linear::set_grad_seed, nb::arg("seed"))
      .def(
          "set_gemm_order",
          [](nn::Linear& l, const std::string& o) { l.set_gemm_order(parse_order(o)); },
          nb::arg("order"))
      .def("weights_changed", &nn::Linear::weights_changed)
      .def("saved_bytes", &nn::Linear::saved_bytes)
      .def("clear_saved", &nn::Linear::clear_saved)
      .def_prop_ro("name", &nn::Linear::name)
      .def_prop_ro("spec_json_text", [](const nn::Linear& l) { return to_json(l.spec()).dump(); })
      .def(
          "fprop_weight", [](nn::Linear& l) { return operand_part(l.fprop_weight()); },
          "The weight operand the forward reads (a QTensor, or a dense array for bf16 / f32)");

  nb::class_<nn::GroupedLinear>(m, "GroupedLinear",
                                "nn::GroupedLinear: one [N, K] weight per group (MoE experts)")
      .def(
          "__init__",
          [](nn::GroupedLinear* self, const std::string& name, nb::handle weight, nb::handle grad,
             int64_t groups, const Recipe& recipe, const std::string& cls, int layer, int layers,
             uint32_t rng_stream) {
            Tensor w = weight_of(weight, name + ".weight");
            Tensor g = grad_of(grad, w, name + ".grad");
            if (groups < 1 || w.rows() % groups != 0)
              throw ArgError(fmt::format("{}: weight {} does not split into {} groups of rows",
                                         name, w.describe(), groups));
            new (self) nn::GroupedLinear(name, w, g, groups,
                                         module_spec(recipe, cls, layer, layers), rng_stream);
          },
          nb::arg("name"), nb::arg("weight"), nb::arg("grad").none(), nb::arg("groups"),
          nb::arg("recipe"), nb::arg("module_class") = "", nb::arg("layer") = -1,
          nb::arg("layers") = 1, nb::arg("rng_stream") = 0)
      .def(
          "forward",
          [](nn::GroupedLinear& l, nb::handle x, nb::handle offsets, bool save, uint64_t stream) {
            const Tensor t = activation(x, "grouped_linear.input");
            const Tensor offs = group_offsets(offsets, "grouped_linear.offsets");
            return on_stream(t, stream, "grouped_linear.input",
                             [&] { return l.forward(t, offs, save); });
          },
          nb::arg("x"), nb::arg("offsets"), nb::arg("save") = true, nb::arg("stream") = 0)
      .def(
          "backward",
          [](nn::GroupedLinear& l, nb::handle dy, uint64_t stream) {
            const Tensor t = activation(dy, "grouped_linear.grad_output");
            return on_stream(t, stream, "grouped_linear.grad_output",
                             [&] { return l.backward(t); });
          },
          nb::arg("dy"), nb::arg("stream") = 0)
      .def("set_grad_seed", &nn::GroupedLinear::set_grad_seed, nb::arg("seed"))
      .def(
          "set_gemm_order",
          [](nn::GroupedLinear& l, const std::string& o) { l.set_gemm_order(parse_order(o)); },
          nb::arg("order"))
      .def("saved_bytes", &nn::GroupedLinear::saved_bytes)
      .def("clear_saved", &nn::GroupedLinear::clear_saved)
      .def_prop_ro("groups", &nn::GroupedLinear::groups)
      .def_prop_ro("spec_json_text",
                   [](const nn::GroupedLinear& l) { return to_json(l.spec()).dump(); });
}

}  // namespace lockstep::py
