// Token embedding lookup and its backward: the shared per-row sum (LOCKSTEP_HD) and the CPU
// reference kernels on raw row-major arrays of T in {float, double}.
//
// Forward: out[t] = table[ids[t]]. Backward: dtable[v] = sum over tokens t with ids[t] == v, in
// ascending t (from +0), of dout[t]; rows of unused ids are +0. Both backends first list each id's
// tokens in ascending order (a stable sort of the token indices by id: a counting sort on the CPU,
// a radix sort on CUDA), then give each vocabulary row (the CPU) or (vocabulary row, column) (CUDA)
// to one thread, which calls embedding_bwd_sum; so every sum has one order whatever the thread
// count.
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"

namespace lockstep::ops {

// Columns [c0, c1) of one vocabulary row: out[c - c0] = +0 + dout[order[i0], c] + ... +
// dout[order[i1 - 1], c], tokens in list order (ascending). dout: [tokens, d].
template <class T, class I>
LOCKSTEP_HD void embedding_bwd_sum(const T* dout, const I* order, int64_t i0, int64_t i1, int64_t d,
                                   int64_t c0, int64_t c1, T* out) {
  for (int64_t c = c0; c < c1; ++c) out[c - c0] = T(0);
  for (int64_t i = i0; i < i1; ++i) {
    const T* g = dout + int64_t(order[i]) * d;
    for (int64_t c = c0; c < c1; ++c) out[c - c0] = out[c - c0] + g[c];
  }
}

// table: [vocab, d] T, row-major; ids: [tokens] int32 in [0, vocab) (std::out_of_range naming the
// id and vocab otherwise, before anything is written); out: [tokens, d].
template <class T>
void embedding_fwd_cpu(const T* table, int64_t vocab, int64_t d, const int32_t* ids, int64_t tokens,
                       T* out);

// dout: [tokens, d]; ids as in the forward; dtable: [vocab, d], overwritten.
template <class T>
void embedding_bwd_cpu(const T* dout, const int32_t* ids, int64_t tokens, int64_t vocab, int64_t d,
                       T* dtable);

}  // namespace lockstep::ops
