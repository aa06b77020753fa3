// The data-parallel gradient reduction: a global batch is cut into M gradient slots (micro-batches,
// each slot's gradient computed with the global batch's normalisation), rank r of N holds slots
// r*M/N .. (r+1)*M/N - 1, and every rank gets the sum of all M slots added with one fixed pairwise
// tree. The tree's shape depends on M only, and each rank's slots form one of its subtrees, so
// the result has the same bits for 1, 2, 4, ... ranks and on every run: the ranks exchange their
// subtree sums with all_gather (bytes, no arithmetic in the transport) and each adds the top of
// the tree itself. See docs/multi-gpu.md.
#pragma once

#include <span>

#include "lockstep/dist/communicator.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::dist {

// The specification: slots (F32, one shape, one device; a power-of-two count) added pairwise,
// sum(lo, hi) = sum(lo, mid) + sum(mid, hi) with mid = (lo + hi) / 2, one rounding per addition
// (ops::add). One slot is returned as a copy.
Tensor tree_sum(std::span<const Tensor> slots);

// This rank's slots (`local`: F32, one shape, on comm.device(); the same count k on every rank)
// reduced over the group: tree_sum of all size() * k slots in rank order, then multiplied by
// `scale` (one rounding per element, skipped when scale is 1), e.g. 1 / M for a mean over slots.
// Requires size() and k to be powers of two (std::invalid_argument otherwise, before any
// communication). Every rank returns the same bits.
Tensor reduce_gradients(Communicator& comm, std::span<const Tensor> local, double scale = 1.0);

}  // namespace lockstep::dist
