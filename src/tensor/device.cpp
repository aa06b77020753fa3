// Device names and the device report; the CUDA parts are compiled only with LOCKSTEP_HAVE_CUDA.
#include "lockstep/tensor/device.h"

#include <fmt/format.h>
#include <omp.h>

#include <charconv>
#include <stdexcept>

#if defined(LOCKSTEP_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace lockstep {

namespace {
thread_local Stream t_current_stream;
}  // namespace

Stream current_stream() { return t_current_stream; }
StreamGuard::StreamGuard(Stream s) : prev_(t_current_stream) { t_current_stream = s; }
StreamGuard::~StreamGuard() { t_current_stream = prev_; }

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

std::optional<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  if (name.starts_with("cuda:")) {
    std::string_view num = name.substr(5);
    int i = -1;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), i);
    if (ec == std::errc() && p == num.data() + num.size() && i >= 0) return Device::cuda(i);
  }
  return std::nullopt;
}

DeviceReport query_devices() {
  DeviceReport r;
  r.omp_threads = omp_get_max_threads();
#if defined(LOCKSTEP_HAVE_CUDA)
  r.cuda_compiled = true;
  r.compiled_archs = LOCKSTEP_CUDA_ARCHS;
  cudaRuntimeGetVersion(&r.cuda_runtime_version);
  cudaDriverGetVersion(&r.cuda_driver_version);
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    r.error = cudaGetErrorString(err);
    cudaGetLastError();
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    r.gpus.push_back(GpuInfo{i, p.name, p.major, p.minor, p.totalGlobalMem, p.multiProcessorCount});
  }
  if (r.gpus.empty()) r.error = "no CUDA device visible";
#else
  r.error = "built without CUDA (configure with -DLOCKSTEP_CUDA=ON)";
#endif
  return r;
}

void require_device(Device d) {
  if (d.is_cpu()) return;
  DeviceReport r = query_devices();
  if (r.gpus.empty())
    throw std::runtime_error("device " + d.str() + " is not available: " + r.error);
  if (d.index >= int(r.gpus.size()))
    throw std::runtime_error(fmt::format("device {} is not available: {} CUDA device(s) visible",
                                         d.str(), r.gpus.size()));
}

}  // namespace lockstep

namespace lockstep {

Device select_device(std::string_view choice) {
  if (choice == "auto") {
    const DeviceReport r = query_devices();
    return r.cuda_compiled && !r.gpus.empty() ? Device::cuda(0) : Device::cpu();
  }
  const std::optional<Device> d = parse_device(choice);
  if (!d)
    throw std::invalid_argument(
        fmt::format("unknown device '{}' (expected cpu, cuda, cuda:N or auto)", choice));
  require_device(*d);
  return *d;
}

void set_thread_device(Device d) {
  if (d.is_cpu()) return;
#if defined(LOCKSTEP_HAVE_CUDA)
  if (const cudaError_t err = cudaSetDevice(d.index); err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(
        fmt::format("cudaSetDevice({}): {}", d.str(), cudaGetErrorString(err)));
  }
#else
  require_device(d);  // throws: built without CUDA
#endif
}

std::pair<size_t, size_t> device_memory(Device d) {
  if (d.is_cpu()) return {0, 0};
#if defined(LOCKSTEP_HAVE_CUDA)
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(d.index);
  size_t free = 0, total = 0;
  const cudaError_t err = cudaMemGetInfo(&free, &total);
  cudaSetDevice(prev);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(
        fmt::format("cudaMemGetInfo on {}: {}", d.str(), cudaGetErrorString(err)));
  }
  return {free, total};
#else
  require_device(d);
  return {0, 0};
#endif
}

}  // namespace lockstep
