// Device graphs and owned streams (tensor/graph.h) over the CUDA runtime's stream capture.
#include "lockstep/tensor/graph.h"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#if defined(__GNUG__)
#include <cxxabi.h>

#include <cstdlib>
#endif

#if defined(LOCKSTEP_HAVE_CUDA)
#include "cuda_util.h"
#endif

namespace lockstep {

#if defined(LOCKSTEP_HAVE_CUDA)

OwnedStream::OwnedStream(Device device) : device_(device) {
  if (!device.is_cuda())
    throw std::invalid_argument(fmt::format("OwnedStream: {} is not a CUDA device", device.str()));
  cuda::DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaStreamCreate(&s));
  stream_.handle = s;
}

OwnedStream::~OwnedStream() {
  // Work still queued finishes first; the handle is released once it has.
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_.handle));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
  cudaGetLastError();
}

StreamEvent::StreamEvent(Device device) : device_(device) {
  if (!device.is_cuda())
    throw std::invalid_argument(fmt::format("StreamEvent: {} is not a CUDA device", device.str()));
  cuda::DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
}

StreamEvent::~StreamEvent() { cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }

void StreamEvent::record(Stream stream) {
  cuda::DeviceGuard guard(device_);
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda::cu(stream)));
}

void StreamEvent::synchronize() const {
  LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

bool stream_capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cuda::cu(stream), &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

bool device_graphs_available(Device device) {
  if (!device.is_cuda()) return false;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return device.index < n;
}

namespace {

// A kernel's name without its namespace qualifiers' templates and its parameter list:
// "void lockstep::ops::cuda::(anonymous namespace)::gather_kernel(float const*, ...)" ->
// "gather_kernel".
std::string short_kernel_name(const char* mangled) {
  if (!mangled) return "(unnamed)";  // a kernel the runtime cannot name (a driver-API launch)
  std::string name = mangled;
#if defined(__GNUG__)
  int rc = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &rc);
  if (rc == 0 && d) name = d;
  std::free(d);
#endif
  // Drop the parameter list and template arguments (outermost parentheses / angle brackets).
  std::string out;
  int depth = 0;
  for (const char ch : name) {
    if (ch == '(' || ch == '<') ++depth;
    if (depth == 0) out += ch;
    if ((ch == ')' || ch == '>') && depth > 0) --depth;
  }
  const size_t colon = out.rfind("::"), space = out.rfind(' ');
  const size_t cut = colon == std::string::npos ? space : colon + 1;
  return cut == std::string::npos ? out : out.substr(cut + 1);
}

GraphNodes count_nodes(cudaGraph_t graph) {
  GraphNodes n;
  size_t count = 0;
  if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) {
    cudaGetLastError();
    return n;
  }
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0 && cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) {
    cudaGetLastError();
    return n;
  }
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    cudaGraphNodeGetType(node, &type);
    if (type == cudaGraphNodeTypeKernel) {
      ++n.kernels;
      cudaKernelNodeParams p{};
      const char* name = nullptr;
      if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess ||
          cudaFuncGetName(&name, p.func) != cudaSuccess)
        name = nullptr;
      cudaGetLastError();
      ++n.by_kernel[short_kernel_name(name)];
    } else if (type == cudaGraphNodeTypeMemcpy) {
      ++n.copies;
    } else if (type == cudaGraphNodeTypeMemset) {
      ++n.memsets;
    } else if (type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree) {
      ++n.allocs;
    } else {
      ++n.other;
    }
  }
  return n;
}

}  // namespace

struct DeviceGraph::Impl {
  Device device;
  GraphNodes nodes;
  cudaGraphExec_t exec = nullptr;
  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

void DeviceGraph::capture(Device device, Stream stream, const std::function<void()>& work) {
  impl_.reset();
  if (!device.is_cuda())
    throw std::invalid_argument(
        fmt::format("DeviceGraph::capture: {} is not a CUDA device", device.str()));
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::cu(stream);
  if (!s)
    throw std::invalid_argument(
        "DeviceGraph::capture: the legacy default stream cannot be captured");
  // Relaxed: calls that are not stream work (a cudaFuncSetAttribute, a device query) may run while
  // recording; stream work on any other stream still ends the capture with an error.
  LOCKSTEP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    StreamGuard on(Stream{s});
    work();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(s, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->nodes = count_nodes(graph);
  const cudaError_t err = cudaGraphInstantiate(&impl->exec, graph, 0);
  cudaGraphDestroy(graph);
  LOCKSTEP_CUDA_CHECK(err);
  impl_ = std::move(impl);
}

void DeviceGraph::replay(Stream stream) const {
  if (!impl_) throw std::logic_error("DeviceGraph::replay: nothing was captured");
  cuda::DeviceGuard guard(impl_->device);
  LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(impl_->exec, cuda::cu(stream)));
}

#else

OwnedStream::OwnedStream(Device device) : device_(device) {
  throw std::runtime_error(fmt::format(
      "OwnedStream: {} needs a CUDA build of lockstep (configure with -DLOCKSTEP_CUDA=ON)",
      device.str()));
}
OwnedStream::~OwnedStream() = default;
StreamEvent::StreamEvent(Device device) : device_(device) {
  throw std::runtime_error(fmt::format(
      "StreamEvent: {} needs a CUDA build of lockstep (configure with -DLOCKSTEP_CUDA=ON)",
      device.str()));
}
StreamEvent::~StreamEvent() = default;
void StreamEvent::record(Stream) {}
void StreamEvent::synchronize() const {}
bool stream_capturing(Stream) { return false; }
bool device_graphs_available(Device) { return false; }

struct DeviceGraph::Impl {
  GraphNodes nodes;
};

void DeviceGraph::capture(Device device, Stream, const std::function<void()>&) {
  throw std::runtime_error(fmt::format(
      "DeviceGraph: {} needs a CUDA build of lockstep (configure with -DLOCKSTEP_CUDA=ON)",
      device.str()));
}
void DeviceGraph::replay(Stream) const {
  throw std::logic_error("DeviceGraph::replay: nothing was captured");
}

#endif

DeviceGraph::DeviceGraph() = default;
DeviceGraph::~DeviceGraph() = default;
DeviceGraph::DeviceGraph(DeviceGraph&&) noexcept = default;
DeviceGraph& DeviceGraph::operator=(DeviceGraph&&) noexcept = default;
bool DeviceGraph::defined() const { return impl_ != nullptr; }
const GraphNodes& DeviceGraph::nodes() const {
  static const GraphNodes none;
  return impl_ ? impl_->nodes : none;
}

}  // namespace lockstep
