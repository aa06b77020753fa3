// The NCCL transport of dist::Communicator: one rank per GPU of one host (threads or processes),
// built when CMake finds the NCCL header with the CUDA backend. libnccl is loaded at run time
// (dlopen), so lockstep binaries start on machines without it and only a multi-GPU run needs it.
// NVLink multicast (NVLS) stays off: force_nvls_off() sets NCCL_NVLS_ENABLE=0 (and the NVSHMEM and
// PyTorch switches) before any communicator is made, and the CLI calls it at start so every
// process it starts inherits it.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "lockstep/dist/communicator.h"

namespace lockstep::dist {

// Turns NVLink multicast off in this process's environment, replacing any values:
// NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (for libraries
// a process started from lockstep may load). NVLS changes the reduction algorithm NCCL picks and
// needs multicast-capable drivers, and the shared GPU hosts lockstep is developed on require it
// off; lockstep never uses it. The variables are set once per process (the first call), before any
// thread reads them.
void force_nvls_off();

// Whether this build has the NCCL transport (CUDA backend and the NCCL header found by CMake).
bool nccl_compiled();

// The id every rank of one group passes to make_nccl_communicator: made once (by rank 0) and
// handed to the others (shared memory between threads, a pipe or file between processes).
struct NcclUniqueId {
  std::array<char, 128> bytes{};
};
// Throws std::runtime_error when NCCL is not compiled in or libnccl cannot be loaded (the message
// names the paths tried: LOCKSTEP_NCCL_LIBRARY, the library found at configure time,
// libnccl.so.2 on the loader's path).
NcclUniqueId nccl_unique_id();

// The failure of one rank of a group, seen by the others (NcclAbort::raise): a rank that throws
// raises it, and every rank waiting in or entering a collective then aborts its own communicator
// (ncclCommAbort, so no kernel waits for the failed rank) and throws GroupAbortedError naming the
// first failure. Shared by the communicators of one group.
struct GroupAbortedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
class NcclAbort {
 public:
  // Records the first failure (later ones are kept out: they are its consequences).
  void raise(int rank, const std::string& what);
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  std::string reason() const;

 private:
  std::atomic<bool> raised_{false};
  mutable std::mutex m_;
  std::string reason_;
};

// Rank `rank` of `size` on CUDA device `device` (ncclCommInitRank after force_nvls_off). The
// collectives run on the thread's current stream (tensor/device.h) and return once it finished;
// with `abort`, a collective waits by polling the stream (sleeping 50 us between polls, never
// spinning) and gives up as described above once another rank raised it.
// all_reduce_sum is ncclAllReduce: NCCL chooses the order of the additions (docs/multi-gpu.md).
std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId& id, int rank, int size,
                                                     Device device,
                                                     std::shared_ptr<NcclAbort> abort = nullptr);

}  // namespace lockstep::dist
