// Device names and the device report; the CUDA parts are compiled only with LOCKSTEP_HAVE_CUDA.
#include "lockstep/backend/device.h"

#include <omp.h>

#include <stdexcept>

#if defined(LOCKSTEP_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace lockstep {

std::string_view device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

std::optional<Device> device_from_name(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
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
  if (d == Device::kCpu) return;
  DeviceReport r = query_devices();
  if (r.gpus.empty()) throw std::runtime_error("--device cuda is not available: " + r.error);
}

}  // namespace lockstep
