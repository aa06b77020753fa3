// Device work recorded once and replayed as one launch (a CUDA graph), and the stream it runs on.
// The sampler replays a captured decode step per batch size instead of launching its few hundred
// kernels one by one; what a replay computes is what the same calls compute when run directly (the
// same kernels with the same arguments), so results are bit-identical either way.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "lockstep/tensor/device.h"

namespace lockstep {

// A CUDA stream created for its owner (ordered with the legacy default stream, so tensors made
// elsewhere on that stream are safe to read on it). Throws on a CPU device or a build without CUDA.
class OwnedStream {
 public:
  explicit OwnedStream(Device device);
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }
  Device device() const { return device_; }

 private:
  Device device_;
  Stream stream_;
};

// A point in a stream's work: record() marks everything queued on the stream so far, and
// synchronize() returns once that has run (while later work may still be queued or running).
// Throws on a CPU device or a build without CUDA.
class StreamEvent {
 public:
  explicit StreamEvent(Device device);
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(Stream stream);
  void synchronize() const;

 private:
  Device device_;
  void* event_ = nullptr;
};

// True while work queued on `stream` (resolved as tensor/device.h does) is being recorded rather
// than run. Always false without CUDA.
bool stream_capturing(Stream stream);

// Whether device graphs can run on `device` in this build (a CUDA build and a CUDA device).
bool device_graphs_available(Device device);

// What a recorded graph holds, counted by node type; kernels also by name (demangled, template
// and parameter lists dropped). Each node is one launch the GPU front end schedules in a replay,
// so the count bounds how short a step of small kernels can be.
// `allocs` counts memory allocation and free nodes (the step's temporaries, allocated and freed
// in the stream-ordered pool while it was recorded).
struct GraphNodes {
  int64_t kernels = 0, copies = 0, memsets = 0, allocs = 0, other = 0;
  std::map<std::string, int64_t> by_kernel;
  int64_t total() const { return kernels + copies + memsets + allocs + other; }
};

class DeviceGraph {
 public:
  DeviceGraph();
  ~DeviceGraph();
  DeviceGraph(DeviceGraph&&) noexcept;
  DeviceGraph& operator=(DeviceGraph&&) noexcept;

  // Records what `work` queues on `stream` (made the thread's current stream for the call)
  // without running it. `work` must free every device tensor it allocates before it returns and
  // must not copy between host and device (copy_bytes refuses that during a capture). Throws,
  // leaving the graph undefined, when the work cannot be recorded.
  void capture(Device device, Stream stream, const std::function<void()>& work);
  // Runs the recorded work on `stream`, ordered like any other call on it.
  void replay(Stream stream) const;
  bool defined() const;
  // The recorded graph's nodes (all zero when nothing was captured).
  const GraphNodes& nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep
