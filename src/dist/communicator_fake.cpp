// The in-process fake transport (dist/communicator.h): ranks are threads sharing one slot table
// and a barrier that ranks can leave. A collective posts the rank's tensor, waits for every rank,
// reads the others' tensors in rank order, and waits again before anyone may reuse its tensor. Sums
// are a left fold in rank order, so results are the same bits on every run and every rank.
#include <fmt/format.h>

#include <climits>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "lockstep/dist/communicator.h"
#include "lockstep/ops/tensor_ops.h"

namespace lockstep::dist {
namespace {

// Raised in the ranks that are still in a collective when another rank left the group.
class GroupLeftError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The shared state of one group: the slot table and a barrier that ranks can leave (a mutex and a
// condition variable; each completed wait is one phase).
struct FakeShared {
  FakeShared(int n, FakeTransportOptions o)
      : size(n),
        opt(std::move(o)),
        slot(size_t(n)),
        left_after(size_t(n), INT64_MAX),
        left_why(size_t(n)),
        expected(n) {}
  const int size;
  const FakeTransportOptions opt;
  std::vector<const Tensor*> slot;  // each rank's tensor of the current collective

  // Waits until every rank still in the group has arrived (`done`: the caller's count of phases
  // with this one), then throws when a rank left the group without taking part in this phase.
  void arrive_and_wait(int rank, int64_t done) {
    std::unique_lock lock(m);
    const int64_t mine = phase;
    if (++arrived == expected)
      next_phase();
    else
      cv.wait(lock, [&] { return phase != mine; });
    for (int r = 0; r < size; ++r)
      if (left_after[size_t(r)] < done)
        throw GroupLeftError(
            fmt::format("fake transport: rank {} waited for rank {}, which left the group ({})",
                        rank, r, left_why[size_t(r)]));
  }
  // Rank `rank` leaves after completing `done` phases; a phase waiting only for it completes.
  void leave(int rank, int64_t done, std::string why) {
    std::lock_guard lock(m);
    left_after[size_t(rank)] = done;
    left_why[size_t(rank)] = std::move(why);
    --expected;
    if (arrived > 0 && arrived == expected) next_phase();
  }

 private:
  void next_phase() {
    arrived = 0;
    ++phase;
    cv.notify_all();
  }
  std::mutex m;  // guards everything below
  std::condition_variable cv;
  std::vector<int64_t> left_after;  // phases a departed rank completed (INT64_MAX: still in)
  std::vector<std::string> left_why;
  int expected;  // ranks still in the group
  int arrived = 0;
  int64_t phase = 0;
};

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeShared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  Device device() const override { return Device::cpu(); }
  std::string describe() const override {
    return fmt::format("fake transport, rank {} of {} (threads, cpu)", rank_, s_->size);
  }

  void all_reduce_sum(Tensor& t) override {
    check_local(t, "all_reduce_sum");
    if (t.dtype() != DType::kF32)
      throw std::invalid_argument(
          fmt::format("all_reduce_sum: rank {} tensor {} is not F32", rank_, t.describe()));
    exchange(t);
    check_same("all_reduce_sum");
    // Left fold in rank order: ((x0 + x1) + x2) + ... with one rounding per addition.
    Tensor sum = s_->slot[0]->clone();
    for (int r = 1; r < s_->size; ++r) ops::add_inplace(sum, *s_->slot[size_t(r)]);
    sync();  // every rank has read every slot
    t.copy_from(sum);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_local(in, "all_gather (in)");
    check_local(out, "all_gather (out)");
    if (out.dtype() != in.dtype() || out.numel() != in.numel() * s_->size)
      throw std::invalid_argument(
          fmt::format("all_gather: rank {} out {} cannot hold {} copies of in {}", rank_,
                      out.describe(), s_->size, in.describe()));
    exchange(in);
    check_same("all_gather");
    auto* dst = static_cast<std::byte*>(out.raw());
    for (int r = 0; r < s_->size; ++r)
      if (in.nbytes())
        std::memcpy(dst + size_t(r) * in.nbytes(), s_->slot[size_t(r)]->raw(), in.nbytes());
    sync();
  }

  void broadcast(Tensor& t, int root) override {
    check_local(t, "broadcast");
    if (root < 0 || root >= s_->size)
      throw std::invalid_argument(
          fmt::format("broadcast: root {} is not a rank of a group of {}", root, s_->size));
    exchange(t);
    check_same("broadcast");
    if (rank_ != root && t.nbytes())
      std::memcpy(t.raw(), s_->slot[size_t(root)]->raw(), t.nbytes());
    sync();
    const int64_t call = broadcasts_++;
    if (rank_ != root && s_->opt.on_broadcast_received)
      s_->opt.on_broadcast_received(rank_, call, t);
  }

  void barrier() override { sync(); }

  // Leaves the group (run_fake_ranks calls it when fn returns or throws): the rank no longer
  // takes part in a collective, and a collective that needed it fails in the others.
  void depart(std::string why) { s_->leave(rank_, syncs_, std::move(why)); }

 private:
  void check_local(const Tensor& t, std::string_view op) const {
    if (!t.defined() || !t.is_cpu() || !t.is_contiguous())
      throw std::invalid_argument(fmt::format(
          "{}: rank {} needs a contiguous CPU tensor (the fake transport's device), got {}", op,
          rank_, t.defined() ? t.describe() : std::string("an undefined tensor")));
  }
  void exchange(const Tensor& t) {
    s_->slot[size_t(rank_)] = &t;
    sync();
  }
  // Every rank compares every slot with rank 0's, so all ranks reach the same verdict (and all
  // take the extra phase before throwing).
  void check_same(std::string_view op) {
    const Tensor& first = *s_->slot[0];
    for (int r = 1; r < s_->size; ++r) {
      const Tensor& x = *s_->slot[size_t(r)];
      if (x.dtype() != first.dtype() || x.shape() != first.shape()) {
        const std::string why = fmt::format("{}: rank {} gave {}, rank 0 gave {}", op, r,
                                            x.describe(), first.describe());
        sync();  // no rank unwinds (freeing its tensor) before every rank has read the slots
        throw std::invalid_argument(why);
      }
    }
  }
  void sync() { s_->arrive_and_wait(rank_, ++syncs_); }

  std::shared_ptr<FakeShared> s_;
  int rank_;
  int64_t syncs_ = 0;  // barrier phases this rank completed
  int64_t broadcasts_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_fake_group(int size, FakeTransportOptions opt) {
  if (size < 1)
    throw std::invalid_argument(
        fmt::format("fake transport: a group needs 1 or more ranks, got {}", size));
  auto shared = std::make_shared<FakeShared>(size, std::move(opt));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<FakeCommunicator>(shared, r));
  return out;
}

void run_fake_ranks(int size, const std::function<void(Communicator&)>& fn,
                    FakeTransportOptions opt) {
  std::vector<std::unique_ptr<Communicator>> group = make_fake_group(size, std::move(opt));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<char> own(static_cast<size_t>(size), 0);  // the rank raised the error itself
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < size; ++r)
      threads.emplace_back([&, r] {
        auto& comm = static_cast<FakeCommunicator&>(*group[size_t(r)]);
        std::string why = "it returned";
        try {
          fn(comm);
        } catch (const GroupLeftError& e) {
          errors[size_t(r)] = std::current_exception();
          why = e.what();
        } catch (const std::exception& e) {
          errors[size_t(r)] = std::current_exception();
          own[size_t(r)] = 1;
          why = fmt::format("it threw: {}", e.what());
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
          own[size_t(r)] = 1;
          why = "it threw";
        }
        comm.depart(std::move(why));
      });
  }  // joins
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < size; ++r)
      if (errors[size_t(r)] && (pass == 1 || own[size_t(r)]))
        std::rethrow_exception(errors[size_t(r)]);
}

}  // namespace lockstep::dist
