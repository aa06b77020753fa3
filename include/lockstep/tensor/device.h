// Where tensors live and ops run: Device ("cpu", "cuda:N"), Stream (an opaque CUDA stream handle,
// so headers above the tensor layer never include CUDA), and what this build and machine offer
// (for `lockstep doctor`, provenance and choosing a default device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static constexpr Device cpu() { return Device{DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int i = 0) { return Device{DeviceType::kCuda, i}; }
  constexpr bool is_cpu() const { return type == DeviceType::kCpu; }
  constexpr bool is_cuda() const { return type == DeviceType::kCuda; }
  constexpr bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// "cpu", "cuda" (= cuda:0), "cuda:N"; nullopt for anything else.
std::optional<Device> parse_device(std::string_view name);

// A CUDA stream (cudaStream_t) carried through CPU-only headers; the null handle is the legacy
// default stream. CPU ops ignore it.
struct Stream {
  void* handle = nullptr;
};

// The stream of the calling thread that work runs on when a call names none (a null Stream in a
// config or argument): the legacy default stream unless a StreamGuard set another. The learner
// and the sampler set theirs once, so every op, quantizer, GEMM and allocation underneath them is
// ordered on one stream (and can be captured into a CUDA graph) without passing it everywhere.
Stream current_stream();
// `s` when it names a stream, else the current stream.
inline Stream resolve_stream(Stream s) { return s.handle ? s : current_stream(); }
class StreamGuard {
 public:
  explicit StreamGuard(Stream s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

struct GpuInfo {
  int index = 0;
  std::string name;  // "NVIDIA H200"
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
  size_t memory_bytes = 0;
  int sm_count = 0;
};

struct DeviceReport {
  bool cuda_compiled = false;    // built with -DLOCKSTEP_CUDA=ON
  std::string compiled_archs;    // "90a"
  int cuda_runtime_version = 0;  // cudaRuntimeGetVersion, 0 when unavailable
  int cuda_driver_version = 0;   // cudaDriverGetVersion, 0 when no driver
  std::vector<GpuInfo> gpus;     // empty when none is visible
  std::string error;             // why no GPU is usable, when none is
  int omp_threads = 1;           // CPU threads OpenMP will use
};

// Never throws: a machine without a GPU or driver gives a report saying so.
DeviceReport query_devices();

// Throws std::runtime_error naming the reason when `d` cannot run in this build / machine.
void require_device(Device d);

// The device a `--device` choice means: "cpu", "cuda" / "cuda:N" (checked with require_device),
// or "auto": cuda:0 when this build has CUDA and a GPU is visible, else the CPU. Throws
// std::invalid_argument for any other spelling and std::runtime_error when the device is missing.
Device select_device(std::string_view choice);

// Free and total bytes of a CUDA device's memory (cudaMemGetInfo); {0, 0} for the CPU.
std::pair<size_t, size_t> device_memory(Device d);

// Makes `d` the calling thread's current CUDA device (cudaSetDevice), where kernels on the legacy
// default stream run: a thread that works on one GPU (a data-parallel rank) calls it first. No-op
// for the CPU; std::runtime_error naming the device when it cannot be selected.
void set_thread_device(Device d);

}  // namespace lockstep
