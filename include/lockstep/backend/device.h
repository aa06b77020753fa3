// Where ops run: the device enum every dispatch point takes, and what this build and machine
// offer (for `lockstep doctor` and for choosing a default device).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

enum class Device : uint8_t { kCpu, kCuda };

std::string_view device_name(Device d);
std::optional<Device> device_from_name(std::string_view name);  // "cpu", "cuda"

struct GpuInfo {
  int index = 0;
  std::string name;        // "NVIDIA H200"
  int cc_major = 0;        // compute capability
  int cc_minor = 0;
  size_t memory_bytes = 0;
  int sm_count = 0;
};

struct DeviceReport {
  bool cuda_compiled = false;           // built with -DLOCKSTEP_CUDA=ON
  std::string compiled_archs;           // "90a"
  int cuda_runtime_version = 0;         // cudaRuntimeGetVersion, 0 when unavailable
  int cuda_driver_version = 0;          // cudaDriverGetVersion, 0 when no driver
  std::vector<GpuInfo> gpus;            // empty when none is visible
  std::string error;                    // why no GPU is usable, when none is
  int omp_threads = 1;                  // CPU threads OpenMP will use
};

// Never throws: a machine without a GPU or driver gives a report saying so.
DeviceReport query_devices();

// Throws std::runtime_error naming the reason when `d` cannot run in this build / machine.
void require_device(Device d);

}  // namespace lockstep
