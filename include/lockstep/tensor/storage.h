// Storage: one allocation on one device, shared by every Tensor view of it. Host memory is
// 64-byte aligned; CUDA memory comes from the device's stream-ordered memory pool
// (cudaMallocAsync with the pool kept, so steady-state allocations never reach cudaMalloc) and is
// returned with cudaFreeAsync on the stream it was allocated on. A Storage can also wrap host
// memory lockstep did not allocate (a memory-mapped file), kept alive by an owner object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "lockstep/tensor/device.h"

namespace lockstep {

class Storage {
 public:
  // `bytes` of uninitialised memory on `device`, ordered on `stream` (CUDA). Throws
  // std::runtime_error naming the device and size when the allocation fails or the device is not
  // available in this build.
  static std::shared_ptr<Storage> allocate(size_t bytes, Device device, Stream stream = {});
  // `bytes` of host memory at `ptr` that this Storage does not allocate or free: `owner` keeps
  // them valid (e.g. a memory-mapped file whose deleter unmaps it) and is released with the last
  // Storage sharing it. Several Storages may share one owner (one per tensor of a mapped file).
  static std::shared_ptr<Storage> wrap_host(void* ptr, size_t bytes,
                                            std::shared_ptr<const void> owner);
  // `bytes` of page-locked host memory for copies with `device` (cudaMallocHost): a copy between
  // it and the device needs no staging through pageable memory, so a host-to-device copy returns
  // at once and a device-to-host one as soon as the bytes land. Plain host memory when `device`
  // is the CPU. Throws std::runtime_error when the allocation fails.
  static std::shared_ptr<Storage> allocate_pinned(size_t bytes, Device device);
  // The same for memory on any device (a CUDA buffer another framework allocated, handed over
  // through DLPack): lockstep reads and writes it in place and never frees it.
  static std::shared_ptr<Storage> wrap(void* ptr, size_t bytes, Device device,
                                       std::shared_ptr<const void> owner);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  Device device() const { return device_; }
  // The stream the memory is freed on. A tensor used on other streams must be synchronised with
  // this one before its last reference goes away.
  Stream stream() const { return stream_; }

 private:
  Storage(void* ptr, size_t bytes, Device device, Stream stream)
      : ptr_(ptr), bytes_(bytes), device_(device), stream_(stream) {}
  void* ptr_ = nullptr;
  std::shared_ptr<const void> owner_;  // set for wrapped memory, which ~Storage does not free
  size_t bytes_ = 0;
  Device device_;
  Stream stream_;
};

// Byte copies between any two devices, ordered on `stream`; a copy whose destination is host
// memory and whose source is device memory returns only when the bytes are there.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                Stream stream = {});
// copy_bytes without its wait: a device-to-host copy is complete once the work queued on `stream`
// up to it has run (synchronize, or a StreamEvent recorded after it). For pinned host memory
// (Storage::allocate_pinned); a copy from or to pageable memory may wait anyway.
void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, Stream stream = {});
// Copies `rows` rows of `width` bytes between two buffers of one device (row starts `dst_pitch` and
// `src_pitch` bytes apart), ordered on `stream`: the 2-D block copy under padding, cropping and
// column splits and concatenations.
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
             size_t rows, Device device, Stream stream = {});
// Fills `bytes` at `dst` with `value` (ordered on `stream` on CUDA).
void fill_bytes(void* dst, Device device, uint8_t value, size_t bytes, Stream stream = {});
// Waits until every operation queued on `stream` has finished (no-op on the CPU).
void synchronize(Device device, Stream stream = {});

// Test hooks, process-wide. poison: every new device allocation is filled with 0xFF (ordered on
// its stream) so that an output byte an op never writes shows up as a NaN / 0xFF code.
// device_to_host_copies: the number of copy_bytes calls from device to host memory so far (a
// sequence of device ops asserts it stays unchanged: no hidden round trip through the host).
void set_poison_device_allocations(bool on);
int64_t device_to_host_copies();

}  // namespace lockstep
