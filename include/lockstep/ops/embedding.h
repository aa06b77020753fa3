// Token embedding lookup and its backward: CPU reference kernels on raw row-major arrays of
// T in {float, double}.
//
// Forward: out[t] = table[ids[t]]. Backward: dtable[v] = sum over tokens t with ids[t] == v, in
// ascending t (from 0), of dout[t]; rows of unused ids are 0. A counting sort lists each id's
// tokens in ascending order and vocabulary rows run in parallel, so every sum has one order
// whatever the thread count.
#pragma once

#include <cstdint>

namespace lockstep::ops {

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
