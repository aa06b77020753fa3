// Python bindings of the GEMM entries: qgemm (D = A W^T of quantized or dense operands) and
// grouped_qgemm (MoE groups, offsets on the host or the operands' device), with the epilogue.
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>

#include "bindings.h"
#include "bridge.h"
#include "lockstep/gemm/qgemm.h"

namespace lockstep::py {
namespace {

// One GEMM side: a QTensor handle or an array (kept alive for the call).
struct Side {
  const QTensor* q = nullptr;
  Tensor t;
  GemmArg arg() const { return q ? GemmArg(*q) : GemmArg(t); }
};

Side side_from(nb::handle h, const char* what) {
  Side s;
  QTensor* q = nullptr;
  if (nb::try_cast<QTensor*>(h, q) && q != nullptr) {
    s.q = q;
  } else {
    s.t = tensor_from(h, what);
  }
  return s;
}

Copy parse_copy(const std::string& s, const char* what) {
  if (s == "rowwise") return Copy::kRowwise;
  if (s == "colwise") return Copy::kColwise;
  throw ArgError(fmt::format("{}: must be 'rowwise' or 'colwise', not '{}'", what, s));
}

Tensor optional_tensor(nb::handle h, const char* what) {
  if (h.is_none()) return {};
  return tensor_from(h, what);
}

struct GemmArgs {
  std::string out_dtype = "f32", order = "batch_invariant", a_copy = "rowwise", w_copy = "rowwise",
              kernel = "auto";
  float alpha = 1.0f;
  bool swiglu = false, row_amax = false;
  int64_t max_group_rows = -1;
};

GemmConfig make_config(const GemmArgs& g, nb::handle bias, nb::handle router_prob,
                       nb::handle group_rows, uint64_t stream, Device device, const char* what) {
  GemmConfig c;
  c.out_dtype = dtype_from_string(g.out_dtype, what);
  if (g.order == "fast") {
    c.order = GemmOrder::kFast;
  } else if (g.order != "batch_invariant") {
    throw ArgError(
        fmt::format("{}: order must be 'batch_invariant' or 'fast', not '{}'", what, g.order));
  }
  c.a_copy = parse_copy(g.a_copy, "qgemm: a_copy");
  c.w_copy = parse_copy(g.w_copy, "qgemm: w_copy");
  auto k = gemm_kernel_from_name(g.kernel);
  if (!k) throw ArgError(fmt::format("{}: unknown kernel '{}'", what, g.kernel));
  c.kernel = *k;
  c.epilogue.alpha = g.alpha;
  c.epilogue.bias = optional_tensor(bias, "qgemm: bias");
  c.epilogue.swiglu = g.swiglu;
  c.epilogue.router_prob = optional_tensor(router_prob, "qgemm: router_prob");
  c.epilogue.row_amax = g.row_amax;
  c.group_rows = optional_tensor(group_rows, "grouped_qgemm: group_rows");
  c.max_group_rows = g.max_group_rows;
  c.stream = stream_for(stream, device, what);
  return c;
}

nb::tuple result_tuple(const GemmResult& r) {
  return nb::make_tuple(to_array(r.d), to_array(r.row_amax),
                        std::string(gemm_kernel_name(r.kernel)));
}

nb::tuple qgemm_py(nb::handle a, nb::handle w, const GemmArgs& g, nb::handle bias,
                   nb::handle router_prob, uint64_t stream) {
  const Side sa = side_from(a, "qgemm: a"), sw = side_from(w, "qgemm: w");
  const GemmConfig c =
      make_config(g, bias, router_prob, nb::none(), stream, sa.arg().device(), "qgemm");
  GemmResult r;
  {
    nb::gil_scoped_release nogil;
    r = qgemm(sa.arg(), sw.arg(), c);
  }
  return result_tuple(r);
}

nb::tuple grouped_qgemm_py(nb::handle a, nb::handle offsets, nb::handle w, const GemmArgs& g,
                           nb::handle bias, nb::handle router_prob, nb::handle group_rows,
                           uint64_t stream) {
  const Side sa = side_from(a, "grouped_qgemm: a"), sw = side_from(w, "grouped_qgemm: w");
  const Tensor offs = tensor_from(offsets, "grouped_qgemm: offsets");
  const GemmConfig c =
      make_config(g, bias, router_prob, group_rows, stream, sa.arg().device(), "grouped_qgemm");
  GemmResult r;
  {
    nb::gil_scoped_release nogil;
    r = grouped_qgemm(sa.arg(), offs, sw.arg(), c);
  }
  return result_tuple(r);
}

}  // namespace

void bind_gemm(nb::module_& m) {
  nb::class_<GemmArgs>(m, "GemmArgs")
      .def(nb::init<>())
      .def_rw("out_dtype", &GemmArgs::out_dtype)
      .def_rw("order", &GemmArgs::order)
      .def_rw("a_copy", &GemmArgs::a_copy)
      .def_rw("w_copy", &GemmArgs::w_copy)
      .def_rw("kernel", &GemmArgs::kernel)
      .def_rw("alpha", &GemmArgs::alpha)
      .def_rw("swiglu", &GemmArgs::swiglu)
      .def_rw("row_amax", &GemmArgs::row_amax)
      .def_rw("max_group_rows", &GemmArgs::max_group_rows);
  m.def("qgemm", &qgemm_py, nb::arg("a"), nb::arg("w"), nb::arg("config"),
        nb::arg("bias").none() = nb::none(), nb::arg("router_prob").none() = nb::none(),
        nb::arg("stream") = 0, "D = A W^T; returns (d, row_amax or None, kernel name)");
  m.def("grouped_qgemm", &grouped_qgemm_py, nb::arg("a"), nb::arg("offsets"), nb::arg("w"),
        nb::arg("config"), nb::arg("bias").none() = nb::none(),
        nb::arg("router_prob").none() = nb::none(), nb::arg("group_rows").none() = nb::none(),
        nb::arg("stream") = 0, "Grouped (MoE) GEMM; returns (d, row_amax or None, kernel name)");
}

}  // namespace lockstep::py
