// The three RankGroup kinds (dist/rank_group.h): one rank on the calling thread, fake-transport
// threads on the CPU, and NCCL ranks as threads with one GPU each.
#include "lockstep/dist/rank_group.h"

#include <fmt/format.h>

#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include "lockstep/dist/nccl.h"

namespace lockstep::dist {
namespace {

// The one-rank group's communicator: every collective of a group of one is a copy or nothing.
class SoloCommunicator final : public Communicator {
 public:
  explicit SoloCommunicator(Device d) : device_(d) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return device_; }
  std::string describe() const override { return fmt::format("one rank ({})", device_.str()); }
  void all_reduce_sum(Tensor& t) override { check(t, "all_reduce_sum"); }
  void all_gather(const Tensor& in, Tensor& out) override {
    check(in, "all_gather (in)");
    check(out, "all_gather (out)");
    if (out.dtype() != in.dtype() || out.numel() != in.numel())
      throw std::invalid_argument(
          fmt::format("all_gather: out {} cannot hold in {}", out.describe(), in.describe()));
    out.copy_from(in.view(out.shape()));
  }
  void broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    if (root != 0)
      throw std::invalid_argument(fmt::format("broadcast: root {} in a group of one", root));
  }
  void barrier() override {}

 private:
  void check(const Tensor& t, std::string_view op) const {
    if (!t.defined() || t.device() != device_ || !t.is_contiguous())
      throw std::invalid_argument(
          fmt::format("{}: the one rank needs a contiguous tensor on {}, got {}", op, device_.str(),
                      t.defined() ? t.describe() : std::string("an undefined tensor")));
  }
  Device device_;
};

class SoloGroup final : public RankGroup {
 public:
  explicit SoloGroup(Device d) : comm_(d) {}
  int size() const override { return 1; }
  Device device(int) const override { return comm_.device(); }
  std::string describe() const override { return fmt::format("1 rank ({})", comm_.device().str()); }
  void run(const std::function<void(Communicator&)>& fn) override { fn(comm_); }

 private:
  SoloCommunicator comm_;
};

class FakeGroup final : public RankGroup {
 public:
  explicit FakeGroup(int n) : n_(n) {
    if (n < 1)
      throw std::invalid_argument(fmt::format("fake rank group: {} ranks, needs 1 or more", n));
  }
  int size() const override { return n_; }
  Device device(int) const override { return Device::cpu(); }
  std::string describe() const override {
    return fmt::format("{} ranks, fake transport (threads, cpu)", n_);
  }
  void run(const std::function<void(Communicator&)>& fn) override { run_fake_ranks(n_, fn); }

 private:
  int n_;
};

// Runs body(r) on one new thread per rank, joins them all, then rethrows the lowest rank's
// exception.
void on_rank_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          body(r);
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

class NcclGroup final : public RankGroup {
 public:
  explicit NcclGroup(std::span<const Device> devices) : devices_(devices.begin(), devices.end()) {
    const int n = int(devices_.size());
    if (n < 1) throw std::invalid_argument("NCCL rank group: no devices");
    for (int r = 0; r < n; ++r) {
      if (!devices_[size_t(r)].is_cuda())
        throw std::invalid_argument(fmt::format("NCCL rank group: rank {} is on {}, not a GPU", r,
                                                devices_[size_t(r)].str()));
      for (int q = 0; q < r; ++q)
        if (devices_[size_t(q)] == devices_[size_t(r)])
          throw std::invalid_argument(fmt::format("NCCL rank group: ranks {} and {} are both on {}",
                                                  q, r, devices_[size_t(r)].str()));
    }
    const NcclUniqueId id = nccl_unique_id();
    abort_ = std::make_shared<NcclAbort>();
    comms_.resize(size_t(n));
    // ncclCommInitRank blocks until every rank of the group has called it: one thread per rank.
    on_rank_threads(n, [&](int r) {
      set_thread_device(devices_[size_t(r)]);
      comms_[size_t(r)] = make_nccl_communicator(id, r, n, devices_[size_t(r)], abort_);
    });
  }
  int size() const override { return int(devices_.size()); }
  Device device(int rank) const override { return devices_.at(size_t(rank)); }
  std::string describe() const override {
    std::string list;
    for (const Device& d : devices_) list += (list.empty() ? "" : ", ") + d.str();
    return fmt::format("{} ranks, NCCL ({})", devices_.size(), list);
  }
  // A rank that throws aborts its communicator and raises the group's abort, so the others stop
  // waiting for it in their collectives (GroupAbortedError); the first failure is rethrown.
  void run(const std::function<void(Communicator&)>& fn) override {
    if (abort_->raised())
      throw GroupAbortedError("NCCL rank group: aborted earlier because " + abort_->reason());
    try {
      on_rank_threads(size(), [&](int r) {
        set_thread_device(devices_[size_t(r)]);
        try {
          fn(*comms_[size_t(r)]);
        } catch (const GroupAbortedError&) {
          throw;
        } catch (const std::exception& e) {
          abort_->raise(r, e.what());
          comms_[size_t(r)]->abort_rank();
          throw;
        } catch (...) {
          abort_->raise(r, "an exception that is not a std::exception");
          comms_[size_t(r)]->abort_rank();
          throw;
        }
      });
    } catch (const GroupAbortedError&) {
      // A rank lower than the one that failed gave up first in rank order: the cause is the
      // failure the group recorded.
      throw std::runtime_error("NCCL rank group: " + abort_->reason());
    }
  }

 private:
  std::vector<Device> devices_;
  std::shared_ptr<NcclAbort> abort_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace

std::unique_ptr<RankGroup> make_solo_rank_group(Device device) {
  return std::make_unique<SoloGroup>(device);
}

std::unique_ptr<RankGroup> make_fake_rank_group(int size) {
  return std::make_unique<FakeGroup>(size);
}

std::unique_ptr<RankGroup> make_nccl_rank_group(std::span<const Device> devices) {
  return std::make_unique<NcclGroup>(devices);
}

}  // namespace lockstep::dist
