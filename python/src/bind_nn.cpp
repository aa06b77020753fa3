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

// nn::GroupedLinear with any group sizes: a training forward needs each group's rows padded to
// nn::group_row_multiple (the wgrad GEMM reduces over them; the MoE block pads its routed rows the
// same way), so the handle moves each group's rows into a zero-padded buffer, runs the module
// there, and moves the real rows of the result back; the backward does the same with dy and dx.
// Zero rows add nothing to dW and change no block's scale, so the real rows' bits are those of a
// caller that had padded itself.
struct PaddedGroupedLinear : nn::GroupedLinear {
  using nn::GroupedLinear::GroupedLinear;
  std::vector<int64_t> from, to;  // the caller's offsets and the padded ones (empty: no padding)
};

// Rows of each group of x [R, C] (starting at from[g]) written at to[g] of a [to.back(), C]
// buffer, min(group sizes) rows per group, the rows past them zero; ordered on the thread's
// current stream.
Tensor move_groups(const Tensor& x, const std::vector<int64_t>& from,
                   const std::vector<int64_t>& to) {
  const Stream s = current_stream();
  Tensor out = Tensor::empty(x.dtype(), {to.back(), x.cols()}, x.device(), s);
  bool padded = false;  // a destination group longer than its source: zero rows to write
  for (size_t g = 0; g + 1 < from.size(); ++g)
    padded = padded || to[g + 1] - to[g] > from[g + 1] - from[g];
  if (padded) fill_bytes(out.raw(), out.device(), 0, out.nbytes(), s);
  const size_t row = size_t(x.cols()) * dtype_size(x.dtype());
  for (size_t g = 0; g + 1 < from.size(); ++g) {
    const int64_t n = std::min(from[g + 1] - from[g], to[g + 1] - to[g]);
    if (n > 0)
      copy_bytes(static_cast<uint8_t*>(out.raw()) + size_t(to[g]) * row, out.device(),
                 static_cast<const uint8_t*>(x.raw()) + size_t(from[g]) * row, x.device(),
                 size_t(n) * row, s);
  }
  return out;
}

// The padded offsets of a training forward, or {} when the groups need none (or the offsets are
// malformed: the module's own checks then name the problem).
std::vector<int64_t> padded_offsets(const std::vector<int64_t>& from, int64_t groups, int64_t rows,
                                    int64_t multiple) {
  if (int64_t(from.size()) != groups + 1 || from.front() != 0 || from.back() != rows) return {};
  std::vector<int64_t> to{0};
  for (size_t g = 0; g + 1 < from.size(); ++g) {
    const int64_t n = from[g + 1] - from[g];
    if (n < 0) return {};
    to.push_back(to.back() + (n + multiple - 1) / multiple * multiple);
  }
  return to == from ? std::vector<int64_t>{} : to;
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

  nb::class_<PaddedGroupedLinear>(m, "GroupedLinear",
                                  "nn::GroupedLinear: one [N, K] weight per group (MoE experts); "
                                  "any group sizes (training pads each group's rows)")
      .def(
          "__init__",
          [](PaddedGroupedLinear* self, const std::string& name, nb::handle weight, nb::handle grad,
             int64_t groups, const Recipe& recipe, const std::string& cls, int layer, int layers,
             uint32_t rng_stream) {
            Tensor w = weight_of(weight, name + ".weight");
            Tensor g = grad_of(grad, w, name + ".grad");
            if (groups < 1 || w.rows() % groups != 0)
              throw ArgError(fmt::format("{}: weight {} does not split into {} groups of rows",
                                         name, w.describe(), groups));
            new (self) PaddedGroupedLinear(name, w, g, groups,
                                           module_spec(recipe, cls, layer, layers), rng_stream);
          },
          nb::arg("name"), nb::arg("weight"), nb::arg("grad").none(), nb::arg("groups"),
          nb::arg("recipe"), nb::arg("module_class") = "", nb::arg("layer") = -1,
          nb::arg("layers") = 1, nb::arg("rng_stream") = 0)
      .def(
          "forward",
          [](PaddedGroupedLinear& l, nb::handle x, nb::handle offsets, bool save, uint64_t stream) {
            const Tensor t = activation(x, "grouped_linear.input");
            const Tensor offs = group_offsets(offsets, "grouped_linear.offsets");
            return on_stream(t, stream, "grouped_linear.input", [&] {
              l.from.clear();
              l.to.clear();
              if (save && t.dim() == 2 && offs.dim() == 1) {
                const Tensor h = offs.device().is_cpu() ? offs : offs.to(Device::cpu());
                const std::span<const int64_t> v = h.data<int64_t>();
                std::vector<int64_t> from(v.begin(), v.end());
                std::vector<int64_t> to =
                    padded_offsets(from, l.groups(), t.rows(), nn::group_row_multiple(l.spec()));
                if (!to.empty()) {
                  const Tensor y = l.forward(
                      move_groups(t, from, to),
                      Tensor::from_vector<int64_t>(to, {int64_t(to.size())}, DType::kI64), true);
                  l.from = std::move(from);
                  l.to = std::move(to);
                  return move_groups(y, l.to, l.from);
                }
              }
              return l.forward(t, offs, save);
            });
          },
          nb::arg("x"), nb::arg("offsets"), nb::arg("save") = true, nb::arg("stream") = 0)
      .def(
          "backward",
          [](PaddedGroupedLinear& l, nb::handle dy, uint64_t stream) {
            const Tensor t = activation(dy, "grouped_linear.grad_output");
            return on_stream(t, stream, "grouped_linear.grad_output", [&] {
              if (l.to.empty()) return l.backward(t);
              if (t.rows() != l.from.back())
                throw ArgError(
                    fmt::format("grouped_linear.grad_output: {} has {} rows; the forward had {}",
                                t.describe(), t.rows(), l.from.back()));
              return move_groups(l.backward(move_groups(t, l.from, l.to)), l.to, l.from);
            });
          },
          nb::arg("dy"), nb::arg("stream") = 0)
      .def(
          "set_grad_seed", [](PaddedGroupedLinear& l, uint64_t s) { l.set_grad_seed(s); },
          nb::arg("seed"))
      .def(
          "set_gemm_order",
          [](PaddedGroupedLinear& l, const std::string& o) { l.set_gemm_order(parse_order(o)); },
          nb::arg("order"))
      .def("saved_bytes", [](const PaddedGroupedLinear& l) { return l.saved_bytes(); })
      .def("clear_saved", [](PaddedGroupedLinear& l) { l.clear_saved(); })
      .def_prop_ro("groups", [](const PaddedGroupedLinear& l) { return l.groups(); })
      .def_prop_ro("spec_json_text",
                   [](const PaddedGroupedLinear& l) { return to_json(l.spec()).dump(); });
}

}  // namespace lockstep::py
