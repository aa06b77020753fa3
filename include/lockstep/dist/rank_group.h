// RankGroup: the N ranks of one process that a data-parallel learner runs on, each a thread with
// its own Communicator. run(fn) runs fn on every rank at once and returns when all have returned,
// so a caller writes one rank's work and the group supplies the threads, the devices and the
// transport: one rank on the calling thread, the fake transport (threads on the CPU), or NCCL
// (one thread per GPU, the communicators made once and kept).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "lockstep/dist/communicator.h"

namespace lockstep::dist {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int size() const = 0;
  // The device of rank r's tensors (the communicator's device).
  virtual Device device(int rank) const = 0;
  // "1 rank (cpu)", "4 ranks, fake transport (threads, cpu)", "2 ranks, NCCL (cuda:0, cuda:1)".
  virtual std::string describe() const = 0;
  // Runs fn(comm) on every rank concurrently (rank r's thread has rank r's device current) and
  // returns when every rank has returned. A rank that throws ends the call: the lowest rank's own
  // error is rethrown (the fake transport also unblocks the others' collectives; see
  // make_nccl_rank_group for NCCL).
  virtual void run(const std::function<void(Communicator&)>& fn) = 0;
};

// One rank, run on the calling thread, with a one-rank communicator on `device` (its collectives
// copy or do nothing): the single-device learner through the same code as N ranks.
std::unique_ptr<RankGroup> make_solo_rank_group(Device device);

// `size` ranks as threads on the CPU over the fake transport (a fresh group of threads per run()).
std::unique_ptr<RankGroup> make_fake_rank_group(int size);

// One rank per device (CUDA devices, distinct), NCCL communicators made once here (concurrently,
// one thread per rank, as ncclCommInitRank requires) and reused by every run(). Throws when NCCL
// is not compiled in or cannot be loaded. A rank that throws while the others wait in a
// collective cannot unblock them (lockstep does not call ncclCommAbort): the process must end.
std::unique_ptr<RankGroup> make_nccl_rank_group(std::span<const Device> devices);

}  // namespace lockstep::dist
