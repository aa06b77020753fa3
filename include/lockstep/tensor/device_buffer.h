// DeviceBuffer: an RAII owner of one cudaMalloc allocation (bytes), and CUDA_CHECK, which turns a
// failed CUDA call into a std::runtime_error naming the call, the error and file:line.
// Only CUDA-enabled code includes this header (it needs cuda_runtime.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                           ") in " + what + " at " + file + ":" + std::to_string(line));
}

}  // namespace lockstep::cuda

#define LOCKSTEP_CUDA_CHECK(call)                                                            \
  do {                                                                                       \
    cudaError_t lockstep_err_ = (call);                                                      \
    if (lockstep_err_ != cudaSuccess)                                                        \
      ::lockstep::cuda::throw_cuda_error(lockstep_err_, #call, __FILE__, __LINE__);          \
  } while (0)
#ifndef CUDA_CHECK
#define CUDA_CHECK(call) LOCKSTEP_CUDA_CHECK(call)
#endif
// After a kernel launch: launch-configuration errors now, execution errors at the next sync.
#define LOCKSTEP_CUDA_CHECK_LAUNCH() LOCKSTEP_CUDA_CHECK(cudaGetLastError())

namespace lockstep::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { resize(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }

  // Logical size `bytes`; reallocates only when the capacity is too small (contents are lost then).
  void resize(size_t bytes) {
    if (bytes > cap_) {
      release();
      LOCKSTEP_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
      cap_ = bytes;
    }
    size_ = bytes;
  }
  void release() noexcept {
    if (ptr_) cudaFree(ptr_);  // never throws from a destructor
    ptr_ = nullptr;
    size_ = cap_ = 0;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void* get() { return ptr_; }
  const void* get() const { return ptr_; }
  template <class T>
  T* as() { return static_cast<T*>(ptr_); }
  template <class T>
  const T* as() const { return static_cast<const T*>(ptr_); }

  template <class T>
  void upload(std::span<const T> host, cudaStream_t s = nullptr) {
    resize(host.size_bytes());
    if (!host.empty()) LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(ptr_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, s));
  }
  template <class T>
  std::vector<T> download(cudaStream_t s = nullptr) const {
    std::vector<T> out(size_ / sizeof(T));
    if (!out.empty()) {
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(out.data(), ptr_, out.size() * sizeof(T), cudaMemcpyDeviceToHost, s));
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return out;
  }
  // Fill every byte with `byte` (poisoning: 0xFF makes every fp32 a NaN and every code 0xFF).
  void fill(uint8_t byte, cudaStream_t s = nullptr) {
    if (size_) LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(ptr_, byte, size_, s));
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

}  // namespace lockstep::cuda
