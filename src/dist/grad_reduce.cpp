// The fixed-tree data-parallel gradient reduction (dist/grad_reduce.h): local subtree sums, an
// all_gather of them, and the top of the same tree added on every rank.
#include "lockstep/dist/grad_reduce.h"

#include <fmt/format.h>

#include <bit>
#include <stdexcept>

#include "lockstep/ops/tensor_ops.h"

namespace lockstep::dist {
namespace {

// lo..hi: a range of a power-of-two length >= 1.
Tensor tree_range(std::span<const Tensor> s, size_t lo, size_t hi) {
  if (hi - lo == 1) return s[lo].clone();
  const size_t mid = lo + (hi - lo) / 2;
  return ops::add(tree_range(s, lo, mid), tree_range(s, mid, hi));
}

void check_slots(std::span<const Tensor> slots, std::string_view where) {
  if (slots.empty() || !std::has_single_bit(slots.size()))
    throw std::invalid_argument(fmt::format(
        "{}: {} gradient slot(s); the fixed tree needs a power-of-two count", where, slots.size()));
  const Tensor& first = slots[0];
  for (size_t i = 0; i < slots.size(); ++i) {
    const Tensor& t = slots[i];
    if (!t.defined() || t.dtype() != DType::kF32 || t.shape() != first.shape() ||
        t.device() != first.device())
      throw std::invalid_argument(fmt::format(
          "{}: slot {} is {}; every slot must be F32 with slot 0's shape and device ({})", where, i,
          t.defined() ? t.describe() : std::string("undefined"), first.describe()));
  }
}

}  // namespace

Tensor tree_sum(std::span<const Tensor> slots) {
  check_slots(slots, "tree_sum");
  return tree_range(slots, 0, slots.size());
}

Tensor reduce_gradients(Communicator& comm, std::span<const Tensor> local, double scale) {
  const int n = comm.size();
  if (!std::has_single_bit(unsigned(n)))
    throw std::invalid_argument(fmt::format(
        "reduce_gradients: {} ranks; the fixed tree needs a power-of-two rank count", n));
  check_slots(local, "reduce_gradients");
  if (local[0].device() != comm.device())
    throw std::invalid_argument(
        fmt::format("reduce_gradients: slots on {}, the communicator ({}) works on {}",
                    local[0].device().str(), comm.describe(), comm.device().str()));
  // This rank's slots are the subtree [rank * k, (rank + 1) * k) of the tree over n * k slots.
  const Tensor part = tree_sum(local).contiguous();
  Tensor gathered = Tensor::empty(DType::kF32, {int64_t(n), part.numel()}, comm.device());
  comm.all_gather(part, gathered);
  std::vector<Tensor> tops;
  for (int r = 0; r < n; ++r) tops.push_back(gathered.slice_rows(r, r + 1).view(part.shape()));
  Tensor sum = tree_sum(tops);
  return scale == 1.0 ? sum : ops::scale(sum, scale);
}

}  // namespace lockstep::dist
