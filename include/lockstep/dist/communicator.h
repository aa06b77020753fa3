// Communicator: the collectives the multi-GPU trainer needs (sum, gather, broadcast, barrier)
// among `size` ranks, behind one interface with two transports: an in-process fake (ranks as
// threads on the CPU, deterministic, for tests and for CPU-only machines) and NCCL (dist/nccl.h).
// Every collective is blocking and must be called by every rank of the group in the same order
// with tensors of the same dtype and shape.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/tensor/tensor.h"

namespace lockstep::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the tensors given to the collectives must live (cpu for the fake transport, the rank's
  // GPU for NCCL).
  virtual Device device() const = 0;
  // "fake transport, rank 1 of 4 (threads, cpu)".
  virtual std::string describe() const = 0;

  // t: F32, contiguous, on device(), the same shape on every rank. Every rank's t becomes the sum
  // over ranks. The fake transport adds in rank order 0, 1, ..., size-1 (a left fold, one rounding
  // per addition); NCCL picks its own order (see docs/multi-gpu.md): use reduce_gradients
  // (dist/grad_reduce.h) where the bits must not depend on the rank count.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // in: contiguous, on device(), the same dtype and shape on every rank; out: contiguous, the same
  // dtype, size() * in.numel() elements. out holds rank 0's `in`, then rank 1's, ... (bytes only,
  // no arithmetic, so the result is exact whatever the transport).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // t: contiguous, on device(), the same dtype and shape on every rank. Every rank's t becomes
  // the bytes of root's t.
  virtual void broadcast(Tensor& t, int root) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // This rank failed and takes no further part: release what would keep the other ranks waiting
  // for it (NCCL: ncclCommAbort of this rank's communicator). Called on the rank's own thread.
  virtual void abort_rank() {}
};

// Test hooks of the fake transport: called on a receiving rank right after a broadcast copied the
// root's bytes into its tensor (`call` counts that rank's broadcasts from 0), so a test can
// corrupt what arrives and check the receiver refuses it.
struct FakeTransportOptions {
  std::function<void(int rank, int64_t call, Tensor& received)> on_broadcast_received;
};

// A group of `size` fake communicators sharing one in-process transport; communicator r must be
// used by one thread only (rank r). Throws std::invalid_argument for size < 1.
std::vector<std::unique_ptr<Communicator>> make_fake_group(int size, FakeTransportOptions opt = {});

// Runs fn(comm) for every rank of a fake group, one thread per rank, and returns when all have
// returned. A rank that throws leaves the group: the others' next collective throws instead of
// waiting for it. Rethrows the lowest rank's exception, preferring an error a rank raised itself
// over the "left the group" errors it caused in the others.
void run_fake_ranks(int size, const std::function<void(Communicator&)>& fn,
                    FakeTransportOptions opt = {});

}  // namespace lockstep::dist
