// The learner's fast prefill attention (attention_prefill_cpu.h): tasks (sequence, kv head) run
// in parallel, each owning its queries' output rows, so the thread count never changes a value.
#include "attention_prefill_cpu.h"

#include <algorithm>
#include <vector>

#include "lockstep/ops/op_math.h"

namespace lockstep::ops {

template <class T>
void attention_prefill_fwd_cpu(const T* q, const T* k, const T* v, const int64_t* cu,
                               int64_t num_seqs, const AttentionDims& dims, T scale, T* out,
                               T* lse) {
  const int64_t hq = dims.q_heads, hkv = dims.kv_heads, D = dims.head_dim, rep = hq / hkv;
  const int64_t tasks = num_seqs * hkv;
  int64_t work = 0;
  for (int64_t s = 0; s < num_seqs; ++s) work += (cu[s + 1] - cu[s]) * (cu[s + 1] - cu[s]);
  work *= hq * D;
#pragma omp parallel if (work >= (int64_t(1) << 16) && tasks > 1)
  {
    std::vector<T> kt, s;
    std::vector<T> qs(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t sq = task / hkv, g = task % hkv;
      const int64_t s0 = cu[sq], n = cu[sq + 1] - s0;
      if (n == 0) continue;
      kt.resize(size_t(D * n));
      s.resize(size_t(n));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) kt[size_t(d * n + j)] = k[((s0 + j) * hkv + g) * D + d];
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
          const int64_t row = (s0 + i) * hq + h;
          // The scale is folded into q once per query (D multiplications instead of one per key).
          const T* qrow = q + row * D;
          for (int64_t d = 0; d < D; ++d) qs[size_t(d)] = qrow[d] * scale;
          for (int64_t j = 0; j <= i; ++j) s[size_t(j)] = 0;
          for (int64_t d = 0; d < D; ++d) {
            const T qd = qs[size_t(d)];
            const T* kd = kt.data() + d * n;
            for (int64_t j = 0; j <= i; ++j) s[size_t(j)] += qd * kd[j];
          }
          T m = s[0];
          for (int64_t j = 1; j <= i; ++j) m = std::max(m, s[size_t(j)]);
          T l = 0;
          for (int64_t j = 0; j <= i; ++j) {
            s[size_t(j)] = OpMath<T>::exp(s[size_t(j)] - m);
            l += s[size_t(j)];
          }
          // Probabilities normalised first, then O = P V (an eager softmax-then-matmul order).
          for (int64_t j = 0; j <= i; ++j) s[size_t(j)] = s[size_t(j)] / l;
          T* oi = out + row * D;
          for (int64_t d = 0; d < D; ++d) oi[d] = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const T pj = s[size_t(j)];
            const T* vj = v + ((s0 + j) * hkv + g) * D;
            for (int64_t d = 0; d < D; ++d) oi[d] += pj * vj[d];
          }
          lse[row] = m + OpMath<T>::log(l);
        }
    }
  }
}

template void attention_prefill_fwd_cpu<float>(const float*, const float*, const float*,
                                               const int64_t*, int64_t, const AttentionDims&, float,
                                               float*, float*);
template void attention_prefill_fwd_cpu<double>(const double*, const double*, const double*,
                                                const int64_t*, int64_t, const AttentionDims&,
                                                double, double*, double*);

}  // namespace lockstep::ops
