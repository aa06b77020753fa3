// Python bindings of the quantizers: quantize (plain and grouped), dequantize, the QTensor handle
// with its parts as DLPack arrays, and QTensor / tensor files in the contract's safetensors naming.
#include <fmt/format.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "bridge.h"
#include "lockstep/quant/qtensor_io.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::py {
namespace {

Format parse_format(std::string_view s) {
  auto f = format_from_name(s);
  if (!f || !is_quantized(*f))
    throw ArgError(fmt::format("quantize: unknown format '{}' (nvfp4, mxfp8 or fp8)", s));
  return *f;
}

Scaling parse_scaling(std::string_view s, std::string_view what) {
  if (auto v = scaling_from_name(s)) return *v;
  throw ArgError(
      fmt::format("{}: unknown scaling '{}' (per_tensor, per_row, per_group, "
                  "block_1x32, block_1x128, block_128x128)",
                  what, s));
}

const QData& part_copy(const QTensor& q, std::string_view part, std::string_view* field) {
  constexpr std::string_view kCol = "_colwise";
  if (part.size() > kCol.size() && part.substr(part.size() - kCol.size()) == kCol) {
    *field = part.substr(0, part.size() - kCol.size());
    return q.colwise;
  }
  *field = part;
  return q.rowwise;
}

Tensor part_tensor(const QTensor& q, std::string_view part) {
  std::string_view field;
  const QData& c = part_copy(q, part, &field);
  if (field == "data") return c.data;
  if (field == "block_scale") return c.block_scale;
  if (field == "amax") return c.amax;
  if (field == "scale_inv") return c.scale_inv;
  throw ArgError(
      fmt::format("QTensor: no part '{}' (data, block_scale, amax, scale_inv, each "
                  "also with _colwise)",
                  part));
}

std::vector<std::string> part_names(const QTensor& q) {
  std::vector<std::string> out;
  for (const char* copy : {"", "_colwise"})
    for (const char* field : {"data", "block_scale", "amax", "scale_inv"}) {
      const std::string name = std::string(field) + copy;
      if (part_tensor(q, name).defined()) out.push_back(name);
    }
  return out;
}

std::vector<int64_t> host_offsets(nb::handle offsets, std::string_view what) {
  std::vector<int64_t> out;
  if (offsets.is_none()) return out;
  if (nb::isinstance<nb::list>(offsets) || nb::isinstance<nb::tuple>(offsets)) {
    for (nb::handle h : offsets) out.push_back(nb::cast<int64_t>(h));
    return out;
  }
  Tensor t = tensor_from(offsets, what);
  if (!t.is_cpu() || t.dim() != 1 || t.dtype() != DType::kI64)
    throw ArgError(
        fmt::format("{}: group offsets must be a list of ints or a 1-D int64 host "
                    "array, not {}",
                    what, t.describe()));
  auto v = t.data<int64_t>();
  return {v.begin(), v.end()};
}

QTensor quantize_py(nb::handle x, const std::string& format, std::optional<std::string> scaling,
                    bool block2d, bool rowwise, bool colwise, bool stochastic, uint64_t seed,
                    uint32_t rng_stream, bool pow2, float eps, const std::string& elem,
                    bool hadamard, const std::string& scale_layout, nb::handle offsets,
                    uint64_t stream, const std::string& name, std::optional<std::string> as_dtype) {
  const std::string what = "quantize: " + name;
  QuantConfig cfg;
  cfg.format = parse_format(format);
  cfg.scaling = scaling ? parse_scaling(*scaling, what) : default_scaling(cfg.format);
  if (elem == "e5m2") {
    cfg.elem = ElemCodec::kE5M2;
  } else if (elem != "e4m3") {
    throw ArgError(fmt::format("{}: elem must be 'e4m3' or 'e5m2', not '{}'", what, elem));
  }
  if (scale_layout == "swizzled") {
    cfg.scale_layout = ScaleLayout::kSwizzled;
  } else if (scale_layout != "compact") {
    throw ArgError(fmt::format("{}: scale_layout must be 'compact' or 'swizzled', not '{}'", what,
                               scale_layout));
  }
  cfg.block2d = block2d;
  cfg.rowwise = rowwise;
  cfg.colwise = colwise;
  cfg.stochastic = stochastic;
  cfg.seed = seed;
  cfg.rng_stream = rng_stream;
  cfg.pow2 = pow2;
  cfg.eps = eps;
  cfg.hadamard = hadamard;
  const std::vector<int64_t> offs = host_offsets(offsets, what + " offsets");
  const Tensor t = tensor_from(x, what, as_dtype);
  if (t.dim() != 2)
    throw ArgError(
        fmt::format("{}: {} is not 2-D [rows, cols] (reshape it to rows of the "
                    "reduction dimension first)",
                    what, t.describe()));
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
    throw ArgError(
        fmt::format("{}: {} has dtype {}; quantize reads float32, bfloat16 or "
                    "float16 (float16 on the CPU only)",
                    what, t.describe(), dtype_name(t.dtype())));
  cfg.stream = stream_for(stream, t.device(), what);
  nb::gil_scoped_release nogil;
  if (!offs.empty() || cfg.scaling == Scaling::kPerGroup)
    return quantize_grouped(t, offs, cfg, name);
  return quantize(t, cfg, name);
}

nb::object dequantize_py(const QTensor& q, const std::string& dtype, const std::string& copy,
                         uint64_t stream) {
  DequantConfig dc;
  dc.dtype = dtype_from_string(dtype, "dequantize: dtype");
  if (dc.dtype != DType::kF32 && dc.dtype != DType::kBF16)
    throw ArgError(fmt::format("dequantize: dtype must be f32 or bf16, not '{}'", dtype));
  if (copy == "colwise") {
    dc.copy = Copy::kColwise;
  } else if (copy != "rowwise") {
    throw ArgError(fmt::format("dequantize: copy must be 'rowwise' or 'colwise', not '{}'", copy));
  }
  if (!q.copy(dc.copy).defined())
    throw ArgError(fmt::format("dequantize: {} has no {} copy (quantize with {}=True)",
                               q.describe(), copy, copy));
  dc.stream = stream_for(stream, q.device(), "dequantize");
  Tensor out;
  {
    nb::gil_scoped_release nogil;
    out = dequantize(q, dc);
    if (q.hadamard) {  // back from the transformed domain, as `lockstep dequantize` does
      std::vector<float> v = to_f32(out.to(Device::cpu()));
      undo_hadamard(v, q.rows, q.cols, dc.copy);
      out = from_f32(v, {q.rows, q.cols}, dc.dtype);
    }
  }
  return to_array(out);
}

// Tensors and QTensors into one safetensors file (atomic write), quantized ones in the contract's
// naming; tensors on a GPU are copied to the host first.
void save_file_py(const std::string& path, nb::dict tensors,
                  const std::map<std::string, std::string>& metadata) {
  SafetensorsFile file;
  for (auto [k, v] : tensors) {
    const std::string name = nb::cast<std::string>(k);
    if (name.empty()) throw ArgError("save_file: a tensor name is empty");
    QTensor* q = nullptr;
    if (nb::try_cast<QTensor*>(v, q) && q != nullptr) {
      add_qtensor(file, name, q->to(Device::cpu()), q->source_dtype);
    } else {
      file.tensors.push_back({name, tensor_from(v, "save_file: " + name).to(Device::cpu())});
    }
  }
  for (const auto& [k, v] : metadata) file.metadata[k] = v;
  nb::gil_scoped_release nogil;
  write_safetensors(path, file);
}

nb::tuple load_file_py(const std::string& path, const std::string& device) {
  const Device dev = device_from_string(device, "load_file");
  SafetensorsFile file;
  {
    nb::gil_scoped_release nogil;
    file = read_safetensors(path);
  }
  nb::dict out;
  const std::vector<std::string> qnames = quantized_tensor_names(file);
  for (const std::string& n : qnames) out[n.c_str()] = nb::cast(read_qtensor(file, n).to(dev));
  for (const NamedTensor& nt : file.tensors)
    if (!is_qtensor_part(file, nt.name)) out[nt.name.c_str()] = to_array(nt.tensor.to(dev));
  nb::dict md;
  for (const auto& [k, v] : file.metadata) md[k.c_str()] = v;
  return nb::make_tuple(out, md);
}

}  // namespace

void bind_quant(nb::module_& m) {
  nb::class_<QTensor>(m, "QTensor",
                      "A quantized 2-D tensor (CONTRACT.md): rowwise and columnwise copies")
      .def_prop_ro("format", [](const QTensor& q) { return std::string(format_name(q.format)); })
      .def_prop_ro("scaling", [](const QTensor& q) { return std::string(scaling_name(q.scaling)); })
      .def_prop_ro("elem",
                   [](const QTensor& q) { return q.elem == ElemCodec::kE5M2 ? "e5m2" : "e4m3"; })
      .def_prop_ro("block2d", [](const QTensor& q) { return q.block2d; })
      .def_prop_ro("hadamard", [](const QTensor& q) { return q.hadamard; })
      .def_prop_ro("scale_layout",
                   [](const QTensor& q) {
                     return q.scale_layout == ScaleLayout::kSwizzled ? "swizzled" : "compact";
                   })
      .def_prop_ro("rows", [](const QTensor& q) { return q.rows; })
      .def_prop_ro("cols", [](const QTensor& q) { return q.cols; })
      .def_prop_ro("source_dtype",
                   [](const QTensor& q) { return std::string(dtype_name(q.source_dtype)); })
      .def_prop_ro("device", [](const QTensor& q) { return q.device().str(); })
      .def_prop_ro("group_offsets", [](const QTensor& q) { return q.group_offsets; })
      .def_prop_ro("has_rowwise", &QTensor::has_rowwise)
      .def_prop_ro("has_colwise", &QTensor::has_colwise)
      .def(
          "part",
          [](const QTensor& q, const std::string& name) { return to_array(part_tensor(q, name)); },
          nb::arg("name"), "One part as a DLPack array (None when absent)")
      .def("parts", &part_names, "Names of the parts present")
      .def("_part_ptr",
           [](const QTensor& q, const std::string& name) {
             return reinterpret_cast<uintptr_t>(part_tensor(q, name).raw());
           })
      .def(
          "to",
          [](const QTensor& q, const std::string& device, uint64_t stream) {
            const Device d = device_from_string(device, "QTensor.to");
            const Stream s = stream_for(stream, d.is_cuda() ? d : q.device(), "QTensor.to");
            nb::gil_scoped_release nogil;
            return q.to(d, s);
          },
          nb::arg("device"), nb::arg("stream") = 0)
      .def("describe", &QTensor::describe);

  m.def("quantize", &quantize_py, nb::arg("x"), nb::arg("format"), nb::arg("scaling") = nb::none(),
        nb::arg("block2d") = false, nb::arg("rowwise") = true, nb::arg("colwise") = false,
        nb::arg("stochastic") = false, nb::arg("seed") = 0, nb::arg("rng_stream") = 0,
        nb::arg("pow2") = false, nb::arg("eps") = 0.0f, nb::arg("elem") = "e4m3",
        nb::arg("hadamard") = false, nb::arg("scale_layout") = "compact",
        nb::arg("offsets") = nb::none(), nb::arg("stream") = 0, nb::arg("name") = "x",
        nb::arg("as_dtype") = nb::none(),
        "Quantize a 2-D float32 / bfloat16 / float16 array where it lives (CONTRACT.md)");
  m.def("dequantize", &dequantize_py, nb::arg("q"), nb::arg("dtype") = "f32",
        nb::arg("copy") = "rowwise", nb::arg("stream") = 0);
  m.def("save_file", &save_file_py, nb::arg("path"), nb::arg("tensors"),
        nb::arg("metadata") = std::map<std::string, std::string>{});
  m.def("load_file", &load_file_py, nb::arg("path"), nb::arg("device") = "cpu");
}

}  // namespace lockstep::py
