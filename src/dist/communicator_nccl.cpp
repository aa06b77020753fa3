// The NCCL transport (dist/nccl.h). libnccl is opened with dlopen and its entry points looked up
// once, so the library links no NCCL and a machine without it fails only when a communicator is
// asked for. Without LOCKSTEP_HAVE_NCCL the entry points throw, naming why.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "lockstep/dist/nccl.h"

#if defined(LOCKSTEP_HAVE_NCCL)
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <vector>
#endif

namespace lockstep::dist {

// Once per process: setenv while another thread reads the environment (a rank thread inside
// ncclCommInitRank) is a data race, and every rank thread calls this before its communicator.
void force_nvls_off() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
    ::setenv("NVSHMEM_DISABLE_NVLS", "1", /*overwrite=*/1);
    ::setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", /*overwrite=*/1);
  });
}

void NcclAbort::raise(int rank, const std::string& what) {
  const std::lock_guard lock(m_);
  if (raised_.load(std::memory_order_relaxed)) return;
  reason_ = fmt::format("rank {} failed: {}", rank, what);
  raised_.store(true, std::memory_order_release);
}

std::string NcclAbort::reason() const {
  const std::lock_guard lock(m_);
  return reason_;
}

#if defined(LOCKSTEP_HAVE_NCCL)

namespace {

// The NCCL entry points lockstep calls, resolved from the loaded library.
struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const NcclApi& nccl_api() {
  static std::once_flag once;
  static NcclApi api;
  static std::string error;
  std::call_once(once, [] {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("LOCKSTEP_NCCL_LIBRARY"); env && *env) paths.push_back(env);
#if defined(LOCKSTEP_NCCL_LIBRARY_PATH)
    paths.push_back(LOCKSTEP_NCCL_LIBRARY_PATH);
#endif
    paths.push_back("libnccl.so.2");
    void* lib = nullptr;
    std::string tried;
    for (const std::string& p : paths) {
      lib = ::dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      tried += fmt::format("\n  {}: {}", p, ::dlerror());
    }
    if (!lib) {
      error = "cannot load libnccl (set LOCKSTEP_NCCL_LIBRARY to its path):" + tried;
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      if (!fn && error.empty()) error = fmt::format("libnccl has no symbol {}", name);
    };
    sym(api.get_unique_id, "ncclGetUniqueId");
    sym(api.comm_init_rank, "ncclCommInitRank");
    sym(api.comm_destroy, "ncclCommDestroy");
    sym(api.comm_abort, "ncclCommAbort");
    sym(api.all_reduce, "ncclAllReduce");
    sym(api.all_gather, "ncclAllGather");
    sym(api.broadcast, "ncclBroadcast");
    sym(api.error_string, "ncclGetErrorString");
  });
  if (!error.empty()) throw std::runtime_error(error);
  return api;
}

void check_nccl(ncclResult_t r, std::string_view what) {
  if (r != ncclSuccess)
    throw std::runtime_error(fmt::format("{}: {}", what, nccl_api().error_string(r)));
}
void check_cuda(cudaError_t e, std::string_view what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclUniqueId& id, int rank, int size, Device device,
                   std::shared_ptr<NcclAbort> abort)
      : rank_(rank), size_(size), device_(device), abort_(std::move(abort)) {
    if (!device.is_cuda())
      throw std::invalid_argument(fmt::format(
          "NCCL communicator: rank {} needs a CUDA device, got {}", rank, device.str()));
    if (size < 1 || rank < 0 || rank >= size)
      throw std::invalid_argument(
          fmt::format("NCCL communicator: rank {} is not in a group of {}", rank, size));
    force_nvls_off();
    const NcclApi& api = nccl_api();
    check_cuda(cudaSetDevice(device.index), fmt::format("cudaSetDevice({})", device.index));
    ncclUniqueId uid;
    static_assert(sizeof uid == sizeof id.bytes, "ncclUniqueId is 128 bytes");
    std::memcpy(&uid, id.bytes.data(), sizeof uid);
    check_nccl(api.comm_init_rank(&comm_, size, uid, rank),
               fmt::format("ncclCommInitRank (rank {} of {}, {})", rank, size, device.str()));
  }
  ~NcclCommunicator() override {
    if (comm_) nccl_api().comm_destroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  std::string describe() const override {
    return fmt::format("NCCL, rank {} of {} ({})", rank_, size_, device_.str());
  }

  void all_reduce_sum(Tensor& t) override {
    check(t, "all_reduce_sum");
    enter("ncclAllReduce");
    if (t.dtype() != DType::kF32)
      throw std::invalid_argument(fmt::format("all_reduce_sum: {} is not F32", t.describe()));
    finish(nccl_api().all_reduce(t.raw(), t.raw(), size_t(t.numel()), ncclFloat32, ncclSum, comm_,
                                 stream()),
           "ncclAllReduce");
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check(in, "all_gather (in)");
    check(out, "all_gather (out)");
    enter("ncclAllGather");
    if (out.dtype() != in.dtype() || out.numel() != in.numel() * size_)
      throw std::invalid_argument(fmt::format("all_gather: out {} cannot hold {} copies of in {}",
                                              out.describe(), size_, in.describe()));
    finish(nccl_api().all_gather(in.raw(), out.raw(), in.nbytes(), ncclUint8, comm_, stream()),
           "ncclAllGather");
  }
  void broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    enter("ncclBroadcast");
    finish(nccl_api().broadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, comm_, stream()),
           "ncclBroadcast");
  }
  void barrier() override {
    Tensor one(DType::kF32, {1}, device_);
    all_reduce_sum(one);
  }

 private:
  void check(const Tensor& t, std::string_view op) const {
    if (!t.defined() || t.device() != device_ || !t.is_contiguous())
      throw std::invalid_argument(fmt::format("{}: rank {} needs a contiguous tensor on {}, got {}",
                                              op, rank_, device_.str(),
                                              t.defined() ? t.describe() : "an undefined tensor"));
  }
  static cudaStream_t stream() { return static_cast<cudaStream_t>(current_stream().handle); }
  void finish(ncclResult_t r, std::string_view what) {
    check_nccl(r, fmt::format("{} (rank {} of {})", what, rank_, size_));
    if (!abort_) {
      check_cuda(cudaStreamSynchronize(stream()), fmt::format("{} (rank {})", what, rank_));
      return;
    }
    // Wait without spinning, and give up when another rank of the group failed: then no rank
    // would ever complete this collective.
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream());
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, fmt::format("{} (rank {})", what, rank_));
      if (abort_->raised()) give_up(what);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Aborts this rank's communicator (its kernels stop waiting for the others) and throws.
  [[noreturn]] void give_up(std::string_view what) {
    if (comm_) nccl_api().comm_abort(comm_);
    comm_ = nullptr;
    throw GroupAbortedError(fmt::format("{} (rank {} of {}): the group was aborted because {}",
                                        what, rank_, size_, abort_->reason()));
  }
  void enter(std::string_view what) {
    if (abort_ && abort_->raised()) give_up(what);
    if (!comm_) throw GroupAbortedError(fmt::format("{}: rank {} was aborted", what, rank_));
  }

 public:
  void abort_rank() override {
    if (comm_) nccl_api().comm_abort(comm_);
    comm_ = nullptr;
  }

 private:
  int rank_, size_;
  Device device_;
  std::shared_ptr<NcclAbort> abort_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_compiled() { return true; }

NcclUniqueId nccl_unique_id() {
  ncclUniqueId uid;
  check_nccl(nccl_api().get_unique_id(&uid), "ncclGetUniqueId");
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), &uid, sizeof uid);
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId& id, int rank, int size,
                                                     Device device,
                                                     std::shared_ptr<NcclAbort> abort) {
  return std::make_unique<NcclCommunicator>(id, rank, size, device, std::move(abort));
}

#else  // no NCCL in this build

namespace {
[[noreturn]] void no_nccl() {
  throw std::runtime_error(
      "this lockstep was built without NCCL (it needs -DLOCKSTEP_CUDA=ON and the NCCL header; "
      "give CMake NCCL_ROOT, e.g. python's site-packages/nvidia/nccl)");
}
}  // namespace

bool nccl_compiled() { return false; }
NcclUniqueId nccl_unique_id() { no_nccl(); }
std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId&, int, int, Device,
                                                     std::shared_ptr<NcclAbort>) {
  no_nccl();
}

#endif

}  // namespace lockstep::dist
