// Host-side helpers of the CUDA backends, private to src/ (tensor layer, used by quant and gemm):
// the CUDA error check, the stream and device of a call, scratch memory from the stream-ordered
// pool, and small host arrays uploaded through a kernel's parameters (never a host wait).
// Only CUDA builds include this header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/tensor/tensor.h"

namespace lockstep::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file,
                                          int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ") in " + what + " at " + file + ":" +
                           std::to_string(line));
}

}  // namespace lockstep::cuda

// Turns a failed CUDA call into a std::runtime_error naming the call, the error and file:line.
#define LOCKSTEP_CUDA_CHECK(call)                                                   \
  do {                                                                              \
    cudaError_t lockstep_err_ = (call);                                             \
    if (lockstep_err_ != cudaSuccess)                                               \
      ::lockstep::cuda::throw_cuda_error(lockstep_err_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: launch-configuration errors now, execution errors at the next sync.
#define LOCKSTEP_CUDA_CHECK_LAUNCH() LOCKSTEP_CUDA_CHECK(cudaGetLastError())

namespace lockstep::cuda {

// A call's stream: the one it names, else the thread's current stream (tensor/device.h).
inline cudaStream_t cu(Stream s) { return static_cast<cudaStream_t>(resolve_stream(s).handle); }

// Makes `d` the current CUDA device for the lifetime of the guard (kernels launch on the current
// device; the tensors of a call live on theirs).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device d) {
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != d.index) LOCKSTEP_CUDA_CHECK(cudaSetDevice(d.index));
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// Scratch memory of one call: pool tensors allocated on the call's stream and returned to the pool
// (stream-ordered, after every kernel the call queued) when the Scratch goes out of scope. Pointers
// are 256-byte aligned.
class Scratch {
 public:
  Scratch(Device device, Stream stream) : device_(device), stream_(stream) {}
  void* bytes(size_t n) {
    held_.push_back(Tensor::empty(DType::kU8, {int64_t(n == 0 ? 1 : n)}, device_, stream_));
    return held_.back().raw();
  }
  template <class T>
  T* get(size_t count) {
    return static_cast<T*>(bytes(count * sizeof(T)));
  }
  // Keeps `t` alive until the scratch goes (for tensors made by the call); returns its address.
  void* keep(Tensor t) {
    held_.push_back(std::move(t));
    return held_.back().raw();
  }
  Device device() const { return device_; }
  Stream stream() const { return stream_; }

 private:
  Device device_;
  Stream stream_;
  std::vector<Tensor> held_;
};

// `words` 32-bit words from the host written to `dst` (device memory) by kernels whose launch
// parameters carry them (4000 bytes per launch), ordered on `stream`: the host never waits and the
// host array may be freed on return.
void upload_words(const uint32_t* words, size_t count, void* dst, cudaStream_t stream);

// A device tensor [n] of dtype I64 / I32 / F32 holding `values`, through upload_words.
template <class T>
Tensor upload_values(std::span<const T> values, DType dtype, Device device, Stream stream) {
  static_assert(sizeof(T) % 4 == 0, "32-bit words");
  Tensor t = Tensor::empty(dtype, {int64_t(values.size())}, device, stream);
  t.check_elem_size(sizeof(T));
  upload_words(reinterpret_cast<const uint32_t*>(values.data()), values.size() * sizeof(T) / 4,
               t.raw(), cu(stream));
  return t;
}
inline Tensor upload_i64(std::span<const int64_t> v, Device d, Stream s) {
  return upload_values<int64_t>(v, DType::kI64, d, s);
}

}  // namespace lockstep::cuda
