// Causal grouped-query attention over packed variable-length sequences: CPU reference forward
// (online softmax over fixed key chunks) and flash-style backward (recomputed from logsumexp).
//
// One query row (attention_row), every step one rounded operation of T:
//   m = -inf, l = 0, acc[0..D) = 0. Keys 0..n-1 are visited in chunks [c0, c0 + kAttentionKeyChunk)
//   with c0 = 0, 32, 64, ... (the last chunk shorter); the chunking depends on the key index only.
//   Per chunk:  s_j  = (sum_d q[d] * k_j[d], d ascending from 0) * scale
//               mc   = max_j s_j;  m' = max(m, mc);  alpha = exp(m - m')   (0 on the first chunk)
//               p_j  = exp(s_j - m');  lc = sum_j p_j (j ascending from 0)
//               pv[d] = sum_j p_j * v_j[d] (j ascending from 0)
//               l = l * alpha + lc;  acc[d] = acc[d] * alpha + pv[d];  m = m'
//   out[d] = acc[d] / l;  lse = m + log(l).
// Inner loops run across keys of a chunk (scores) or across d (pv, acc); each value keeps the
// order above, so vectorisation changes no bits.
//
// Batch invariance: query t of a sequence is attention_row(q_t, keys 0..t of its own sequence),
// so its bits depend only on that sequence's q_t, k_0..t, v_0..t: never on packing, batch size,
// position in the batch or thread count. The sampler calls attention_row on its KV cache for
// decode step t and gets the learner's bits.
//
// Backward, per (sequence, kv head g), queries i ascending, then the query heads h of group g
// ascending: s_ij as in the forward, p_ij = exp(s_ij - lse_i), D_i = sum_d dout_i[d] * out_i[d],
// dp_ij = sum_d dout_i[d] * v_j[d], ds_ij = p_ij * (dp_ij - D_i) (sums in ascending d);
//   dq_i[d] = (sum_{j<=i} ds_ij * k_j[d], j ascending) * scale
//   dv_j[d] = sum over (i, h) in that order of p_ij * dout_i[d]
//   dk_j[d] = (sum over (i, h) in that order of ds_ij * q_i[d]) * scale
// Tasks (sequence, kv head) run in parallel; each owns its rows of dq, dk and dv.
#pragma once

#include <cstdint>

namespace lockstep::ops {

// Keys per online-softmax chunk, a compile-time constant shared with every port of the kernel.
inline constexpr int64_t kAttentionKeyChunk = 32;
// Largest head_dim the kernels accept (the per-row scratch lives on the stack).
inline constexpr int64_t kAttentionMaxHeadDim = 256;

struct AttentionDims {
  int64_t q_heads = 0;   // Hq
  int64_t kv_heads = 0;  // Hkv, divides Hq; query head h reads kv head h / (Hq / Hkv)
  int64_t head_dim = 0;  // D, 1..kAttentionMaxHeadDim
};

// One query head's row against n_keys >= 1 keys. q: [head_dim] T; k, v: n_keys rows of head_dim
// T, row j at k + j * kv_stride (kv_stride >= head_dim: a KV cache [pos, Hkv, D] is read with
// k = cache + g * D and kv_stride = Hkv * D); out: [head_dim]; *lse: the log-sum-exp of the
// scaled scores. scale is 1/sqrt(head_dim) rounded to T by the caller.
template <class T>
void attention_row(const T* q, const T* k, const T* v, int64_t kv_stride, int64_t n_keys,
                   int64_t head_dim, T scale, T* out, T* lse);

// q, out: [tokens, Hq, D] T, row-major; k, v: [tokens, Hkv, D]; lse: [tokens, Hq], saved for
// the backward. cu_seqlens: [num_seqs + 1] (Idx = int32_t or int64_t), 0 = cu[0] <= cu[1] <= ...,
// tokens = cu[num_seqs]; sequence s holds tokens [cu[s], cu[s+1]) with positions from 0.
template <class T, class Idx>
void attention_fwd_cpu(const T* q, const T* k, const T* v, const Idx* cu_seqlens, int64_t num_seqs,
                       const AttentionDims& dims, T scale, T* out, T* lse);

// Inputs as in the forward plus out, lse (forward results) and dout: [tokens, Hq, D].
// dq: [tokens, Hq, D]; dk, dv: [tokens, Hkv, D]; all overwritten.
template <class T, class Idx>
void attention_bwd_cpu(const T* q, const T* k, const T* v, const T* out, const T* lse,
                       const T* dout, const Idx* cu_seqlens, int64_t num_seqs,
                       const AttentionDims& dims, T scale, T* dq, T* dk, T* dv);

}  // namespace lockstep::ops
