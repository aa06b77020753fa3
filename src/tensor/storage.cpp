// Storage allocation and byte copies on the host and, in CUDA builds, on the device through the
// stream-ordered memory pool (see storage.h).
#include "lockstep/tensor/storage.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <new>
#include <stdexcept>

#if defined(LOCKSTEP_HAVE_CUDA)
#include <cuda_runtime.h>

#include <mutex>
#endif

namespace lockstep {
namespace {

constexpr std::align_val_t kHostAlign{64};
std::atomic<bool> g_poison{false};
std::atomic<int64_t> g_d2h{0};

#if defined(LOCKSTEP_HAVE_CUDA)
cudaStream_t cu(Stream s) { return static_cast<cudaStream_t>(resolve_stream(s).handle); }

void check(cudaError_t err, const char* what, Device d, size_t bytes) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(fmt::format("CUDA error {} ({}) in {} on {} ({} bytes)",
                                         cudaGetErrorName(err), cudaGetErrorString(err), what,
                                         d.str(), bytes));
  }
}

// Keep freed blocks in each device's default pool (release threshold = max), so that repeated
// allocations of the same sizes are served from the pool instead of the driver.
void keep_pool(int device) {
  static std::once_flag flags[64];
  if (device < 0 || device >= 64) return;
  std::call_once(flags[device], [device] {
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      uint64_t threshold = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    cudaGetLastError();
  });
}

// Makes `d` the current CUDA device for the duration of a call.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device d) {
    cudaGetDevice(&prev_);
    if (prev_ != d.index) check(cudaSetDevice(d.index), "cudaSetDevice", d, 0);
  }
  ~DeviceGuard() {
    int cur = -1;
    cudaGetDevice(&cur);
    if (cur != prev_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
};
#else
[[noreturn]] void no_cuda(Device d) {
  throw std::runtime_error("device " + d.str() +
                           " needs a CUDA build of lockstep (configure with -DLOCKSTEP_CUDA=ON)");
}
#endif

}  // namespace

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device, Stream stream) {
  if (device.is_cpu()) {
    void* p = bytes == 0 ? nullptr : ::operator new(bytes, kHostAlign, std::nothrow);
    if (bytes != 0 && !p)
      throw std::runtime_error(fmt::format("out of host memory allocating {} bytes", bytes));
    return std::shared_ptr<Storage>(new Storage(p, bytes, device, {}));
  }
#if defined(LOCKSTEP_HAVE_CUDA)
  DeviceGuard guard(device);
  keep_pool(device.index);
  void* p = nullptr;
  if (bytes != 0) check(cudaMallocAsync(&p, bytes, cu(stream)), "cudaMallocAsync", device, bytes);
  if (bytes != 0 && g_poison.load(std::memory_order_relaxed))
    check(cudaMemsetAsync(p, 0xFF, bytes, cu(stream)), "cudaMemsetAsync", device, bytes);
  return std::shared_ptr<Storage>(new Storage(p, bytes, device, resolve_stream(stream)));
#else
  (void)stream;
  no_cuda(device);
#endif
}

std::shared_ptr<Storage> Storage::allocate_pinned(size_t bytes, Device device) {
  if (device.is_cpu() || bytes == 0) return allocate(bytes, Device::cpu());
#if defined(LOCKSTEP_HAVE_CUDA)
  DeviceGuard guard(device);
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes), "cudaMallocHost", device, bytes);
  std::shared_ptr<const void> owner(p, [](const void* q) { cudaFreeHost(const_cast<void*>(q)); });
  return wrap_host(p, bytes, std::move(owner));
#else
  no_cuda(device);
#endif
}

std::shared_ptr<Storage> Storage::wrap_host(void* ptr, size_t bytes,
                                            std::shared_ptr<const void> owner) {
  return wrap(ptr, bytes, Device::cpu(), std::move(owner));
}

std::shared_ptr<Storage> Storage::wrap(void* ptr, size_t bytes, Device device,
                                       std::shared_ptr<const void> owner) {
  if (bytes != 0 && (ptr == nullptr || owner == nullptr))
    throw std::invalid_argument(
        fmt::format("Storage::wrap: {} bytes need a non-null pointer and owner", bytes));
  auto s = std::shared_ptr<Storage>(new Storage(ptr, bytes, device, {}));
  s->owner_ = std::move(owner);
  return s;
}

Storage::~Storage() {
  if (!ptr_ || owner_) return;  // wrapped memory is released by its owner
  if (device_.is_cpu()) {
    ::operator delete(ptr_, kHostAlign);
    return;
  }
#if defined(LOCKSTEP_HAVE_CUDA)
  int prev = 0;
  cudaGetDevice(&prev);
  if (prev != device_.index) cudaSetDevice(device_.index);
  cudaFreeAsync(ptr_, cu(stream_));  // never throws from a destructor
  cudaGetLastError();
  if (prev != device_.index) cudaSetDevice(prev);
#endif
}

namespace {

void copy_bytes_impl(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                     Stream stream, bool wait) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (dst_device.is_cpu()) g_d2h.fetch_add(1, std::memory_order_relaxed);
#if defined(LOCKSTEP_HAVE_CUDA)
  const Device on = dst_device.is_cuda() ? dst_device : src_device;
  DeviceGuard guard(on);
  if (dst_device.is_cpu() || src_device.is_cpu()) {
    // A recorded copy would read or write this host memory when the graph runs, long after the
    // caller's buffer is gone: work that is captured keeps its data on the device.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(cu(stream), &status), "cudaStreamIsCapturing", on, bytes);
    if (status != cudaStreamCaptureStatusNone)
      throw std::logic_error(fmt::format(
          "a {}-byte copy between host and {} was asked for while the stream is being captured "
          "into a device graph",
          bytes, on.str()));
  }
  cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                        : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                              : cudaMemcpyDeviceToDevice;
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    check(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, cu(stream)),
          "cudaMemcpyPeerAsync", on, bytes);
  } else {
    check(cudaMemcpyAsync(dst, src, bytes, kind, cu(stream)), "cudaMemcpyAsync", on, bytes);
  }
  if (dst_device.is_cpu() && wait)
    check(cudaStreamSynchronize(cu(stream)), "cudaStreamSynchronize", on, bytes);
#else
  (void)stream;
  (void)wait;
  no_cuda(dst_device.is_cuda() ? dst_device : src_device);
#endif
}

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                Stream stream) {
  copy_bytes_impl(dst, dst_device, src, src_device, bytes, stream, true);
}

void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, Stream stream) {
  copy_bytes_impl(dst, dst_device, src, src_device, bytes, stream, false);
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
             size_t rows, Device device, Stream stream) {
  if (width == 0 || rows == 0) return;
  if (device.is_cpu()) {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<std::byte*>(dst) + r * dst_pitch,
                  static_cast<const std::byte*>(src) + r * src_pitch, width);
    return;
  }
#if defined(LOCKSTEP_HAVE_CUDA)
  DeviceGuard guard(device);
  check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                          cu(stream)),
        "cudaMemcpy2DAsync", device, width * rows);
#else
  (void)dst_pitch;
  (void)src_pitch;
  (void)stream;
  no_cuda(device);
#endif
}

void fill_bytes(void* dst, Device device, uint8_t value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(dst, value, bytes);
    return;
  }
#if defined(LOCKSTEP_HAVE_CUDA)
  DeviceGuard guard(device);
  check(cudaMemsetAsync(dst, value, bytes, cu(stream)), "cudaMemsetAsync", device, bytes);
#else
  (void)stream;
  no_cuda(device);
#endif
}

void synchronize(Device device, Stream stream) {
  if (device.is_cpu()) return;
#if defined(LOCKSTEP_HAVE_CUDA)
  DeviceGuard guard(device);
  check(cudaStreamSynchronize(cu(stream)), "cudaStreamSynchronize", device, 0);
#else
  (void)stream;
  no_cuda(device);
#endif
}

void set_poison_device_allocations(bool on) { g_poison.store(on, std::memory_order_relaxed); }
int64_t device_to_host_copies() { return g_d2h.load(std::memory_order_relaxed); }

}  // namespace lockstep
