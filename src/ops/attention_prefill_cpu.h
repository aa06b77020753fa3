// The fast-mode prefill attention of the learner (private to ops/): for each query, one two-pass
// softmax over its whole causal key range, K of a (sequence, kv head) transposed once and shared
// by all its queries, the softmax scale folded into q, probabilities normalised before P V
// (as an eager softmax-then-matmul computes it). Another order of operations than
// attention_row (ops/attention.h: scale applied to each score, online softmax over 32-key
// chunks), so it is not bit-identical to the sampler's decode; `lockstep align` measures it.
#pragma once

#include <cstdint>

#include "lockstep/ops/attention.h"

namespace lockstep::ops {

// Per query row i of a sequence, keys j = 0..i (every step one rounded operation of T):
//   qs[d] = q[d] * scale;  s_j = sum_d qs[d] * k_j[d] (d ascending);  m = max_j s_j
//   e_j = exp(s_j - m);  l = sum_j e_j (j ascending);  p_j = e_j / l;
//   out[d] = sum_j p_j v_j[d] (j ascending: softmax, then P V)
//   lse = m + log(l).
// Layouts as attention_fwd_cpu; cu_seqlens: int64 [num_seqs + 1].
template <class T>
void attention_prefill_fwd_cpu(const T* q, const T* k, const T* v, const int64_t* cu_seqlens,
                               int64_t num_seqs, const AttentionDims& dims, T scale, T* out,
                               T* lse);

}  // namespace lockstep::ops
