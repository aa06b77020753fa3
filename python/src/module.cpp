// The _lockstep extension module: version, build facts, error types and test hooks, then the
// bindings of each area (bindings.h). Python code imports it through the `lockstep` package.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "bindings.h"
#include "bridge.h"
#include "lockstep/gemm/qgemm.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/recipe.h"
#include "lockstep/tensor/device.h"
#include "lockstep/tensor/safetensors.h"
#include "lockstep/tensor/storage.h"
#include "lockstep/version.h"

namespace nb = nanobind;
using namespace lockstep;

NB_MODULE(_lockstep, m) {
  m.doc() = "lockstep: one precision contract (NVFP4, MXFP8, FP8), bit-identical on CPU and GPU";
  m.attr("__version__") = LOCKSTEP_VERSION;
  m.attr("revision") = lockstep_source_revision();
#if defined(LOCKSTEP_HAVE_CUDA)
  m.attr("cuda_compiled") = true;
#else
  m.attr("cuda_compiled") = false;
#endif

  // Every caller error of the library is a ValueError subclass naming the tensor and the rule.
  nb::exception<py::ArgError> error(m, "Error", PyExc_ValueError);
  // Any other std::invalid_argument of the library (shapes, offsets, options) is a caller error
  // too. Registered before the specific types, which are tried first.
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const std::invalid_argument& e) {
          PyErr_SetString(static_cast<PyObject*>(type), e.what());
        }
      },
      error.ptr());
  nb::exception<QuantError>(m, "QuantError", error);
  nb::exception<GemmError>(m, "GemmError", error);
  nb::exception<RecipeError>(m, "RecipeError", error);
  nb::exception<SafetensorsError>(m, "FileError", error);

  m.def("device_to_host_copies", &device_to_host_copies,
        "Device-to-host byte copies lockstep made so far in this process (test hook)");
  m.def("set_poison_device_allocations", &set_poison_device_allocations, nb::arg("on"));
  m.def(
      "_data_ptr",
      [](nb::handle x) {
        const Tensor t = py::tensor_from(x, "_data_ptr: x");
        return reinterpret_cast<uintptr_t>(t.raw());
      },
      "The address lockstep reads for x (test hook: equal to x's own data pointer)");
  m.def(
      "_roundtrip", [](nb::handle x) { return py::to_array(py::tensor_from(x, "_roundtrip: x")); },
      "x through the bridge and back (test hook: the same memory)");
  m.def(
      "_dtype_name",
      [](nb::handle x) {
        return std::string(dtype_name(py::tensor_from(x, "_dtype_name: x").dtype()));
      },
      "The lockstep dtype of an array (safetensors spelling)");
  m.def(
      "_view_as",
      [](nb::handle x, const std::string& dtype) {
        return py::to_array(py::tensor_from(x, "_view_as: x", dtype));
      },
      "x's bytes as another dtype of the same element size (no copy)");
  m.def(
      "synchronize",
      [](const std::string& device, uint64_t stream) {
        const Device d = py::device_from_string(device, "synchronize");
        nb::gil_scoped_release nogil;
        synchronize(d, Stream{reinterpret_cast<void*>(stream)});
      },
      nb::arg("device"), nb::arg("stream") = 0);

  // The C++ side of the Python overhead benchmark (bench/python_overhead.py): `iters` calls of
  // lockstep::quantize on x from a C++ loop, then a synchronize; seconds per call.
  m.def(
      "_time_quantize_cpp",
      [](nb::handle x, const std::string& format, const std::string& scaling, int iters,
         uint64_t stream) {
        const Tensor t = py::tensor_from(x, "_time_quantize_cpp: x");
        QuantConfig cfg;
        cfg.format = *format_from_name(format);
        cfg.scaling = *scaling_from_name(scaling);
        cfg.stream = Stream{reinterpret_cast<void*>(stream)};
        nb::gil_scoped_release nogil;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) (void)quantize(t, cfg, "x");
        synchronize(t.device(), cfg.stream);
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        return dt.count() / iters;
      },
      nb::arg("x"), nb::arg("format"), nb::arg("scaling"), nb::arg("iters"), nb::arg("stream") = 0);

  py::bind_quant(m);
  py::bind_gemm(m);
  py::bind_recipe(m);
  py::bind_rl(m);
  py::bind_nn(m);
  py::bind_model(m);
}
