// Causal grouped-query attention over packed variable-length sequences: the row function
// attention_row (one query row, written once for the CPU and the GPU over a row executor), the
// CPU reference forward and the flash-style backward (recomputed from logsumexp).
//
// One query row (attention_row), every step one rounded operation of T:
//   m = -inf, l = 0, acc[0..D) = 0. Keys 0..n-1 are visited in chunks [c0, c0 + kAttentionKeyChunk)
//   with c0 = 0, 32, 64, ... (the last chunk shorter); the chunking depends on the key index only.
//   Per chunk:  s_j  = (sum_d q[d] * k_j[d], d ascending from 0) * scale
//               mc   = max_j s_j (j ascending: mc = s_0, then mc = s_j > mc ? s_j : mc)
//               m' = mc > m ? mc : m;  alpha = exp(m - m')   (0 on the first chunk)
//               p_j  = exp(s_j - m');  lc = sum_j p_j (j ascending from 0)
//               pv[d] = sum_j p_j * v_j[d] (j ascending from 0)
//               l = l * alpha + lc;  acc[d] = acc[d] * alpha + pv[d];  m = m'
//   out[d] = acc[d] / l;  lse = m + log(l).
// The steps are the LOCKSTEP_HD functions below (attention_chunk_scores, attention_chunk_max,
// attention_max_step, attention_chunk_probs, attention_chunk_pv, attention_rescale_add);
// attention_row runs them chunk after chunk. A GPU kernel may run the independent steps of several
// chunks at once (scores, probabilities, pv) as long as it chains the max and rescale steps in
// chunk order: the bits are those of attention_row.
//
// Executors (row_exec.h): a chunk's keys are spread one per lane (per_key), head dimensions over
// the same lanes (for_dims); per-key values are read back with key(v, j) in ascending j, so every
// sum keeps the order above on the host (HostLanes) and on a warp (WarpLanes). Several query heads
// of one kv head (NH <= 8, the GQA group) go through one call: their keys and values are read once,
// and each head's arithmetic is exactly that of a call with NH = 1.
//
// Sources: attention_row reads q, K and V through a source object, so the same function reads the
// learner's packed F32 K / V (StridedKvSource) and the sampler's cache (ops/kv_cache.h: bf16
// values, or FP8 E4M3 codes with a scale per token and kv head). A source provides
//   void load_q(int h, int64_t d0, int n, T (&out)[8]) const  // q of head h, dims d0 .. d0+n-1
//   void load_k(int64_t j, int64_t d0, int n, T (&out)[8]) const  // key j, dims d0 .. d0+n-1
//   T v(int64_t j, int64_t d) const                           // value j, dim d
// with n <= kAttentionDimBlock (a block of dims per load, so a GPU source can load 16 bytes).
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
#include <limits>
#include <type_traits>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/op_math.h"

namespace lockstep::ops {

// Keys per online-softmax chunk, a compile-time constant shared with every port of the kernel.
inline constexpr int64_t kAttentionKeyChunk = 32;
// Largest head_dim the kernels accept (the per-row scratch lives on the stack / in registers).
inline constexpr int64_t kAttentionMaxHeadDim = 256;
// Dimensions per source load (load_q / load_k).
inline constexpr int kAttentionDimBlock = 8;
// Largest number of query heads one attention_row call serves.
inline constexpr int kAttentionMaxRowHeads = 8;

struct AttentionDims {
  int64_t q_heads = 0;   // Hq
  int64_t kv_heads = 0;  // Hkv, divides Hq; query head h reads kv head h / (Hq / Hkv)
  int64_t head_dim = 0;  // D, 1..kAttentionMaxHeadDim
};

// NH heads' values of one key (scores or probabilities), or one value per head.
template <class T, int NH>
struct alignas(sizeof(T) * NH >= 16 ? 16 : sizeof(T) * NH) HeadVec {
  T v[NH];
  LOCKSTEP_HD T& operator[](int h) { return v[h]; }
  LOCKSTEP_HD const T& operator[](int h) const { return v[h]; }
};

// ---- sources ------------------------------------------------------------------------------------

// NH query heads at q + h * head_stride (contiguous dims). On a GPU, `qvec` (q and head_stride
// 16-byte aligned) loads a full block of 8 dims as two 16-byte vectors.
template <class T>
struct RowQuery {
  const T* q = nullptr;
  int64_t head_stride = 0;
  bool qvec = false;
  LOCKSTEP_HD void load_q(int h, int64_t d0, int n, T (&out)[kAttentionDimBlock]) const {
    const T* p = q + h * head_stride + d0;
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>) {
      if (qvec && n == kAttentionDimBlock) {
        const float4 a = reinterpret_cast<const float4*>(p)[0];
        const float4 b = reinterpret_cast<const float4*>(p)[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
        return;
      }
    }
#endif
    LOCKSTEP_UNROLL
    for (int i = 0; i < kAttentionDimBlock; ++i)
      if (i < n) out[i] = p[i];
  }
};

// K / V rows of T at k + j * kv_stride (kv_stride >= head_dim: packed [tokens, Hkv, D] read at
// k = base + g * D with kv_stride = Hkv * D). On a GPU, `vec` (rows and q 16-byte aligned, D a
// multiple of 8: set by the kernel) lets a full block of 8 dims load as 16-byte vectors.
template <class T>
struct StridedKvSource : RowQuery<T> {
  const T* k = nullptr;
  const T* v_ = nullptr;
  int64_t kv_stride = 0;
  bool vec = false;
  LOCKSTEP_HD void load_k(int64_t j, int64_t d0, int n, T (&out)[kAttentionDimBlock]) const {
    const T* p = k + j * kv_stride + d0;
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>) {
      if (vec && n == kAttentionDimBlock) {
        const float4 a = reinterpret_cast<const float4*>(p)[0];
        const float4 b = reinterpret_cast<const float4*>(p)[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
        return;
      }
    }
#endif
    LOCKSTEP_UNROLL
    for (int i = 0; i < kAttentionDimBlock; ++i)
      if (i < n) out[i] = p[i];
  }
  LOCKSTEP_HD T v(int64_t j, int64_t d) const { return v_[j * kv_stride + d]; }
};

// ---- the steps of one chunk ---------------------------------------------------------------------

// Scores of keys c0 .. c0 + nc - 1 for NH heads: s_j[h] = (sum_d q_h[d] k_j[d], d ascending from
// +0) * scale, one key per lane.
template <int NH, class X, class T, class Src>
LOCKSTEP_HD auto attention_chunk_scores(const X& ex, const Src& src, int64_t c0, int nc, int64_t D,
                                        T scale) {
  return ex.template per_key<HeadVec<T, NH>>(nc, [&](int j) {
    HeadVec<T, NH> s;
    LOCKSTEP_UNROLL
    for (int h = 0; h < NH; ++h) s[h] = T(0);
    for (int64_t d0 = 0; d0 < D; d0 += kAttentionDimBlock) {
      const int n = D - d0 < kAttentionDimBlock ? int(D - d0) : kAttentionDimBlock;
      T kb[kAttentionDimBlock] = {};  // entries past n are never read; zeroed for the compiler
      src.load_k(c0 + j, d0, n, kb);
      LOCKSTEP_UNROLL
      for (int h = 0; h < NH; ++h) {
        T qb[kAttentionDimBlock] = {};
        src.load_q(h, d0, n, qb);
        LOCKSTEP_UNROLL
        for (int i = 0; i < kAttentionDimBlock; ++i)
          if (i < n) s[h] = s[h] + qb[i] * kb[i];
      }
    }
    LOCKSTEP_UNROLL
    for (int h = 0; h < NH; ++h) s[h] = s[h] * scale;
    return s;
  });
}

// mc[h] = max over the chunk's keys in ascending order (mc = s_0, then s_j > mc ? s_j : mc).
template <int NH, class X, class Keys>
LOCKSTEP_HD auto attention_chunk_max(const X& ex, const Keys& s, int nc) {
  auto mc = ex.key(s, 0);
  for (int j = 1; j < nc; ++j) {
    const auto x = ex.key(s, j);
    LOCKSTEP_UNROLL
    for (int h = 0; h < NH; ++h) mc[h] = x[h] > mc[h] ? x[h] : mc[h];
  }
  return mc;
}

// The running max after a chunk with max mc: m' = mc > m ? mc : m; alpha = exp(m - m').
template <class T>
LOCKSTEP_HD T attention_max_next(T m, T mc) {
  return mc > m ? mc : m;
}
template <class T>
LOCKSTEP_HD void attention_max_step(T m, T mc, T& m_new, T& alpha) {
  m_new = attention_max_next(m, mc);
  alpha = OpMath<T>::exp(m - m_new);
}

// p_j[h] = exp(s_j[h] - m_new[h]), one key per lane.
template <int NH, class X, class Keys, class T>
LOCKSTEP_HD auto attention_chunk_probs(const X& ex, const Keys& s, int nc,
                                       const HeadVec<T, NH>& m_new) {
  return ex.template map_keys<HeadVec<T, NH>>(s, nc, [&](const HeadVec<T, NH>& sj) {
    HeadVec<T, NH> p;
    LOCKSTEP_UNROLL
    for (int h = 0; h < NH; ++h) p[h] = OpMath<T>::exp(sj[h] - m_new[h]);
    return p;
  });
}

// lc[h] = sum_j p_j[h] and pv[h][d] = sum_j p_j[h] * v_j[d], j ascending from +0.
template <int NH, int MaxD, class X, class Src, class Keys, class T, class DimsT>
LOCKSTEP_HD void attention_chunk_pv(const X& ex, const Src& src, const Keys& p, int64_t c0, int nc,
                                    int64_t D, HeadVec<T, NH>& lc, DimsT (&pv)[NH]) {
  LOCKSTEP_UNROLL
  for (int h = 0; h < NH; ++h) {
    lc[h] = T(0);
    ex.template for_dims<MaxD>(D, [&](int64_t, int i) { pv[h][i] = T(0); });
  }
  for (int j = 0; j < nc; ++j) {
    const auto pj = ex.key(p, j);
    LOCKSTEP_UNROLL
    for (int h = 0; h < NH; ++h) lc[h] = lc[h] + pj[h];
    ex.template for_dims<MaxD>(D, [&](int64_t d, int i) {
      const T vd = src.v(c0 + j, d);
      LOCKSTEP_UNROLL
      for (int h = 0; h < NH; ++h) pv[h][i] = pv[h][i] + pj[h] * vd;
    });
  }
}

// The rescale of a running sum: x * alpha + part (l with lc, acc[d] with pv[d]).
template <class T>
LOCKSTEP_HD T attention_rescale_add(T x, T alpha, T part) {
  return x * alpha + part;
}

// out = acc / l;  lse = m + log(l).
template <class T>
LOCKSTEP_HD T attention_out(T acc, T l) {
  return acc / l;
}
template <class T>
LOCKSTEP_HD T attention_lse(T m, T l) {
  return m + OpMath<T>::log(l);
}

// ---- the row ------------------------------------------------------------------------------------

// NH query heads of one row against keys 0 .. n_keys - 1 (n_keys >= 1) of one kv head, through
// `src`. out: head h's D values at out + h * out_head_stride (Y is T, or num::Bf16Out for an
// output stored as bf16); lse: head h's at lse + h * lse_head_stride (written by the executor's
// leader). head_dim D <= MaxD <= kAttentionMaxHeadDim; scale is 1/sqrt(D) rounded to T by the
// caller.
template <int NH, int MaxD, class X, class T, class Src, class Y>
LOCKSTEP_HD void attention_row(const X& ex, const Src& src, int64_t n_keys, int64_t D, T scale,
                               Y* out, int64_t out_head_stride, T* lse, int64_t lse_head_stride) {
  using DimsT = typename X::template Dims<T, MaxD>;
  HeadVec<T, NH> m, l;
  DimsT acc[NH];
  LOCKSTEP_UNROLL
  for (int h = 0; h < NH; ++h) {
    m[h] = -std::numeric_limits<T>::infinity();
    l[h] = T(0);
    ex.template for_dims<MaxD>(D, [&](int64_t, int i) { acc[h][i] = T(0); });
  }
  for (int64_t c0 = 0; c0 < n_keys; c0 += kAttentionKeyChunk) {
    const int nc = int(n_keys - c0 < kAttentionKeyChunk ? n_keys - c0 : kAttentionKeyChunk);
    const auto s = attention_chunk_scores<NH>(ex, src, c0, nc, D, scale);
    const HeadVec<T, NH> mc = attention_chunk_max<NH>(ex, s, nc);
    HeadVec<T, NH> m_new, alpha;
    LOCKSTEP_UNROLL
    for (int h = 0; h < NH; ++h) attention_max_step(m[h], mc[h], m_new[h], alpha[h]);
    const auto p = attention_chunk_probs<NH>(ex, s, nc, m_new);
    HeadVec<T, NH> lc;
    DimsT pv[NH];
    attention_chunk_pv<NH, MaxD>(ex, src, p, c0, nc, D, lc, pv);
    LOCKSTEP_UNROLL
    for (int h = 0; h < NH; ++h) {
      l[h] = attention_rescale_add(l[h], alpha[h], lc[h]);
      ex.template for_dims<MaxD>(D, [&](int64_t, int i) {
        acc[h][i] = attention_rescale_add(acc[h][i], alpha[h], pv[h][i]);
      });
      m[h] = m_new[h];
    }
  }
  LOCKSTEP_UNROLL
  for (int h = 0; h < NH; ++h) {
    ex.template for_dims<MaxD>(D, [&](int64_t d, int i) {
      out[h * out_head_stride + d] = attention_out(acc[h][i], l[h]);
    });
    if (ex.leader()) lse[h * lse_head_stride] = attention_lse(m[h], l[h]);
  }
}

// ---- CPU kernels --------------------------------------------------------------------------------

// One query head's row against n_keys >= 1 keys (attention_row with NH = 1 on the host). q:
// [head_dim] T; k, v: n_keys rows of head_dim T, row j at k + j * kv_stride (kv_stride >= head_dim:
// a KV cache [pos, Hkv, D] is read with k = cache + g * D and kv_stride = Hkv * D); out:
// [head_dim]; *lse: the log-sum-exp of the scaled scores. scale is 1/sqrt(head_dim) rounded to T by
// the caller.
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

// The heads per attention_row call for a GQA group of `rep` query heads: the largest of 8, 4, 2, 1
// that divides rep.
inline int attention_row_heads(int64_t rep) {
  for (int nh = kAttentionMaxRowHeads; nh > 1; nh /= 2)
    if (rep % nh == 0) return nh;
  return 1;
}

}  // namespace lockstep::ops
