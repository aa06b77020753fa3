// Causal GQA attention CPU reference (ops/attention.h): attention_row (the one definition of a
// query row, run by the host executor) per (token, GQA group) for the packed forward; the backward
// recomputes the probabilities from logsumexp per (sequence, kv head).
#include <algorithm>
#include <limits>
#include <vector>

#include "attention_heads.h"
#include "check.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops {

namespace {

// Validates cu_seqlens and the head layout; returns the token count cu[num_seqs].
template <class Idx>
int64_t check_packed(const char* what, const Idx* cu, int64_t num_seqs, const AttentionDims& dims) {
  detail::require(dims.q_heads >= 1 && dims.kv_heads >= 1 && dims.q_heads % dims.kv_heads == 0,
                  "{}: q_heads {} and kv_heads {}; need kv_heads >= 1 dividing q_heads", what,
                  dims.q_heads, dims.kv_heads);
  detail::require(dims.head_dim >= 1 && dims.head_dim <= kAttentionMaxHeadDim,
                  "{}: head_dim {} outside [1, {}]", what, dims.head_dim, kAttentionMaxHeadDim);
  detail::require(num_seqs >= 0, "{}: num_seqs {} is negative", what, num_seqs);
  detail::require(cu[0] == 0, "{}: cu_seqlens[0] = {}; must be 0", what, int64_t(cu[0]));
  for (int64_t s = 0; s < num_seqs; ++s)
    detail::require(cu[s + 1] >= cu[s], "{}: cu_seqlens [{}] decreases at index {} ({} -> {})",
                    what, num_seqs + 1, s + 1, int64_t(cu[s]), int64_t(cu[s + 1]));
  return int64_t(cu[num_seqs]);
}

}  // namespace

template <class T>
void attention_row(const T* q, const T* k, const T* v, int64_t kv_stride, int64_t n_keys,
                   int64_t head_dim, T scale, T* out, T* lse) {
  detail::require(n_keys >= 1, "attention_row: n_keys {} must be >= 1", n_keys);
  detail::require(head_dim >= 1 && head_dim <= kAttentionMaxHeadDim && kv_stride >= head_dim,
                  "attention_row: head_dim {} outside [1, {}] or kv_stride {} < head_dim", head_dim,
                  kAttentionMaxHeadDim, kv_stride);
  StridedKvSource<T> src;
  src.q = q;
  src.k = k;
  src.v_ = v;
  src.kv_stride = kv_stride;
  attention_row<1, kAttentionMaxHeadDim>(HostWarp{}, src, n_keys, head_dim, scale, out, head_dim,
                                         lse, 1);
}

template <class T, class Idx>
void attention_fwd_cpu(const T* q, const T* k, const T* v, const Idx* cu_seqlens, int64_t num_seqs,
                       const AttentionDims& dims, T scale, T* out, T* lse) {
  const int64_t tokens = check_packed("attention", cu_seqlens, num_seqs, dims);
  const int64_t hq = dims.q_heads, hkv = dims.kv_heads, D = dims.head_dim, rep = hq / hkv;
  std::vector<int64_t> seq_start(static_cast<size_t>(tokens));
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t t = int64_t(cu_seqlens[s]); t < int64_t(cu_seqlens[s + 1]); ++t)
      seq_start[size_t(t)] = int64_t(cu_seqlens[s]);
  // One attention_row call per (token, NH query heads of one GQA group): the group's keys are read
  // once; every head's bits are those of its own NH = 1 row.
  with_row_heads(attention_row_heads(rep), [&](auto nh_c) {
    constexpr int NH = decltype(nh_c)::value;
    const int64_t calls_per_token = hq / NH, calls = tokens * calls_per_token;
#pragma omp parallel for schedule(dynamic, 8) if (calls * NH * D * 16 >= detail::kParallelMinWork)
    for (int64_t r = 0; r < calls; ++r) {
      const int64_t t = r / calls_per_token, h0 = (r % calls_per_token) * NH, g = h0 / rep;
      const int64_t s0 = seq_start[size_t(t)];
      StridedKvSource<T> src;
      src.q = q + (t * hq + h0) * D;
      src.head_stride = D;
      src.k = k + (s0 * hkv + g) * D;
      src.v_ = v + (s0 * hkv + g) * D;
      src.kv_stride = hkv * D;
      attention_row<NH, kAttentionMaxHeadDim>(HostWarp{}, src, t - s0 + 1, D, scale,
                                              out + (t * hq + h0) * D, D, lse + t * hq + h0, 1);
    }
  });
}

template <class T, class Idx>
void attention_bwd_cpu(const T* q, const T* k, const T* v, const T* out, const T* lse,
                       const T* dout, const Idx* cu_seqlens, int64_t num_seqs,
                       const AttentionDims& dims, T scale, T* dq, T* dk, T* dv) {
  const int64_t tokens = check_packed("attention backward", cu_seqlens, num_seqs, dims);
  const int64_t hq = dims.q_heads, hkv = dims.kv_heads, D = dims.head_dim, rep = hq / hkv;
  const int64_t tasks = num_seqs * hkv;
#pragma omp parallel if (tokens * hq * D * 32 >= detail::kParallelMinWork)
  {
    // Per-thread scratch, sized per task: K and V of the sequence transposed ([D, n]) so that
    // score and dp dots run across keys; p and ds rows of one query.
    std::vector<T> kt, vt, p, ds;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t sq = task / hkv, g = task % hkv;
      const int64_t s0 = int64_t(cu_seqlens[sq]), n = int64_t(cu_seqlens[sq + 1]) - s0;
      if (n == 0) continue;
      kt.resize(size_t(D * n));
      vt.resize(size_t(D * n));
      p.resize(size_t(n));
      ds.resize(size_t(n));
      auto kv_row = [&](int64_t j) { return ((s0 + j) * hkv + g) * D; };
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) {
          kt[size_t(d * n + j)] = k[kv_row(j) + d];
          vt[size_t(d * n + j)] = v[kv_row(j) + d];
          dk[kv_row(j) + d] = 0;
          dv[kv_row(j) + d] = 0;
        }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
          const int64_t qr = ((s0 + i) * hq + h) * D;
          const T* qi = q + qr;
          const T* doi = dout + qr;
          const T* oi = out + qr;
          const T lse_i = lse[(s0 + i) * hq + h];
          T di = 0;
          for (int64_t d = 0; d < D; ++d) di += doi[d] * oi[d];
          for (int64_t j = 0; j <= i; ++j) p[size_t(j)] = ds[size_t(j)] = 0;
          for (int64_t d = 0; d < D; ++d) {
            const T qd = qi[d], od = doi[d];
            const T* kd = kt.data() + d * n;
            const T* vd = vt.data() + d * n;
            for (int64_t j = 0; j <= i; ++j) {
              p[size_t(j)] += qd * kd[j];
              ds[size_t(j)] += od * vd[j];
            }
          }
          for (int64_t j = 0; j <= i; ++j) {
            const T pj = OpMath<T>::exp(p[size_t(j)] * scale - lse_i);
            p[size_t(j)] = pj;
            ds[size_t(j)] = pj * (ds[size_t(j)] - di);
          }
          T* dqi = dq + qr;
          for (int64_t d = 0; d < D; ++d) dqi[d] = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const T dsj = ds[size_t(j)];
            const T* kj = k + kv_row(j);
            for (int64_t d = 0; d < D; ++d) dqi[d] += dsj * kj[d];
          }
          for (int64_t d = 0; d < D; ++d) dqi[d] *= scale;
          for (int64_t j = 0; j <= i; ++j) {
            const T pj = p[size_t(j)], dsj = ds[size_t(j)];
            T* dvj = dv + kv_row(j);
            T* dkj = dk + kv_row(j);
            for (int64_t d = 0; d < D; ++d) {
              dvj[d] += pj * doi[d];
              dkj[d] += dsj * qi[d];
            }
          }
        }
      }
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) dk[kv_row(j) + d] *= scale;
    }
  }
}

#define LOCKSTEP_ATTENTION_INSTANTIATE(T, Idx)                                                    \
  template void attention_fwd_cpu<T, Idx>(const T*, const T*, const T*, const Idx*, int64_t,      \
                                          const AttentionDims&, T, T*, T*);                       \
  template void attention_bwd_cpu<T, Idx>(const T*, const T*, const T*, const T*, const T*,       \
                                          const T*, const Idx*, int64_t, const AttentionDims&, T, \
                                          T*, T*, T*);
LOCKSTEP_ATTENTION_INSTANTIATE(float, int32_t)
LOCKSTEP_ATTENTION_INSTANTIATE(float, int64_t)
LOCKSTEP_ATTENTION_INSTANTIATE(double, int32_t)
LOCKSTEP_ATTENTION_INSTANTIATE(double, int64_t)
#undef LOCKSTEP_ATTENTION_INSTANTIATE
template void attention_row<float>(const float*, const float*, const float*, int64_t, int64_t,
                                   int64_t, float, float*, float*);
template void attention_row<double>(const double*, const double*, const double*, int64_t, int64_t,
                                    int64_t, double, double*, double*);

}  // namespace lockstep::ops
