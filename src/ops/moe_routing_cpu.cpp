// MoE routing CPU reference (ops/moe_routing.h): router top-k over the softmax row function,
// a counting-sort permutation (expert-major, tokens ascending) and the slot-ordered combine.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "lockstep/ops/moe_routing.h"
#include "lockstep/ops/softmax.h"

namespace lockstep::ops {

namespace {

void check_router(const char* what, int64_t tokens, int64_t experts, int64_t k) {
  detail::require(tokens >= 0 && experts >= 1 && k >= 1 && k <= experts,
                  "{}: logits [{}, {}] with top-k {}; need experts >= 1 and 1 <= k <= experts",
                  what, tokens, experts, k);
}

void check_perm(const char* what, const MoePermutation& perm, int64_t d) {
  detail::require(d >= 1 && int64_t(perm.slot_row.size()) == perm.tokens * perm.k &&
                      int64_t(perm.row_token.size()) == perm.tokens * perm.k,
                  "{}: row width {} or a permutation of {} slots not built for [{}, {}]", what, d,
                  perm.slot_row.size(), perm.tokens, perm.k);
}

bool parallel(int64_t work) { return work >= detail::kParallelMinWork; }

}  // namespace

template <class T>
void moe_router_topk_fwd_cpu(const T* logits, int64_t tokens, int64_t experts, int64_t k,
                             bool renormalize, T* probs, int32_t* expert_ids, T* weights) {
  check_router("moe router", tokens, experts, k);
#pragma omp parallel if (parallel(tokens * experts * (k + 8)))
  {
    std::vector<char> taken(static_cast<size_t>(experts));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const T* pr = probs + t * experts;
      softmax_row(logits + t * experts, experts, probs + t * experts);
      std::fill(taken.begin(), taken.end(), char(0));
      T sum = 0;
      for (int64_t s = 0; s < k; ++s) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; ++e)
          if (!taken[size_t(e)] && (best < 0 || pr[e] > pr[best])) best = e;
        taken[size_t(best)] = 1;
        expert_ids[t * k + s] = int32_t(best);
        weights[t * k + s] = pr[best];
        sum += pr[best];
      }
      if (renormalize)
        for (int64_t s = 0; s < k; ++s) weights[t * k + s] = weights[t * k + s] / sum;
    }
  }
}

template <class T>
void moe_router_topk_bwd_cpu(const T* probs, const int32_t* expert_ids, const T* dweights,
                             int64_t tokens, int64_t experts, int64_t k, bool renormalize,
                             T* dlogits) {
  check_router("moe router backward", tokens, experts, k);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (expert_ids[i] < 0 || expert_ids[i] >= experts)
      throw std::out_of_range(fmt::format(
          "moe router backward: expert_ids[{}] = {} outside [0, {})", i, expert_ids[i], experts));
#pragma omp parallel if (parallel(tokens * experts * 8))
  {
    std::vector<T> dprob(static_cast<size_t>(experts));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const T* pr = probs + t * experts;
      const int32_t* ids = expert_ids + t * k;
      const T* dw = dweights + t * k;
      std::fill(dprob.begin(), dprob.end(), T(0));
      if (renormalize) {
        T sum = 0;
        for (int64_t s = 0; s < k; ++s) sum += pr[ids[s]];
        T dot = 0;  // sum_r dw_r * w_r with w_r = p_r / S as in the forward
        for (int64_t s = 0; s < k; ++s) dot += dw[s] * (pr[ids[s]] / sum);
        for (int64_t s = 0; s < k; ++s) dprob[size_t(ids[s])] += (dw[s] - dot) / sum;
      } else {
        for (int64_t s = 0; s < k; ++s) dprob[size_t(ids[s])] += dw[s];
      }
      softmax_row_bwd(pr, dprob.data(), experts, dlogits + t * experts);
    }
  }
}

MoePermutation moe_permutation_cpu(const int32_t* expert_ids, int64_t tokens, int64_t experts,
                                   int64_t k) {
  detail::require(tokens >= 0 && experts >= 1 && k >= 1 && tokens * k <= INT32_MAX,
                  "moe permutation: expert_ids [{}, {}] for {} experts; need experts, k >= 1 and "
                  "tokens * k < 2^31",
                  tokens, k, experts);
  MoePermutation p;
  p.tokens = tokens;
  p.experts = experts;
  p.k = k;
  p.offsets.assign(size_t(experts + 1), 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    const int32_t e = expert_ids[i];
    if (e < 0 || e >= experts)
      throw std::out_of_range(
          fmt::format("moe permutation: expert_ids[{}] (token {}, slot {}) = {} outside [0, {})", i,
                      i / k, i % k, e, experts));
    ++p.offsets[size_t(e + 1)];
  }
  for (int64_t e = 0; e < experts; ++e) p.offsets[size_t(e + 1)] += p.offsets[size_t(e)];
  std::vector<int64_t> cursor(p.offsets.begin(), p.offsets.end() - 1);
  p.row_token.resize(size_t(tokens * k));
  p.slot_row.resize(size_t(tokens * k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const int64_t row = cursor[size_t(expert_ids[t * k + s])]++;
      p.row_token[size_t(row)] = int32_t(t);
      p.slot_row[size_t(t * k + s)] = int32_t(row);
    }
  return p;
}

template <class T>
void moe_gather_fwd_cpu(const T* x, const MoePermutation& perm, int64_t d, T* out) {
  check_perm("moe gather", perm, d);
  const int64_t rows = perm.tokens * perm.k;
#pragma omp parallel for schedule(static) if (parallel(rows * d))
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = x + int64_t(perm.row_token[size_t(r)]) * d;
    for (int64_t c = 0; c < d; ++c) out[r * d + c] = src[c];
  }
}

// The gather's transpose is the unweighted combine: dx[t] = sum over slots s of dout[slot_row].
template <class T>
void moe_gather_bwd_cpu(const T* dout, const MoePermutation& perm, int64_t d, T* dx) {
  moe_combine_fwd_cpu<T>(dout, nullptr, perm, d, dx);
}

template <class T>
void moe_combine_fwd_cpu(const T* expert_out, const T* weights, const MoePermutation& perm,
                         int64_t d, T* out) {
  check_perm("moe combine", perm, d);
  const int64_t k = perm.k;
#pragma omp parallel for schedule(static) if (parallel(perm.tokens * k * d))
  for (int64_t t = 0; t < perm.tokens; ++t) {
    T* o = out + t * d;
    for (int64_t c = 0; c < d; ++c) o[c] = 0;
    for (int64_t s = 0; s < k; ++s) {
      const T* src = expert_out + int64_t(perm.slot_row[size_t(t * k + s)]) * d;
      if (weights) {
        const T w = weights[t * k + s];
        for (int64_t c = 0; c < d; ++c) o[c] += w * src[c];
      } else {
        for (int64_t c = 0; c < d; ++c) o[c] += src[c];
      }
    }
  }
}

template <class T>
void moe_combine_bwd_cpu(const T* dout, const T* expert_out, const T* weights,
                         const MoePermutation& perm, int64_t d, T* dexpert_out, T* dweights) {
  check_perm("moe combine backward", perm, d);
  detail::require(!weights || dweights, "moe combine backward: weights given but dweights is null");
  const int64_t k = perm.k;
#pragma omp parallel for schedule(static) if (parallel(perm.tokens * k * d))
  for (int64_t t = 0; t < perm.tokens; ++t) {
    const T* g = dout + t * d;
    for (int64_t s = 0; s < k; ++s) {
      const int64_t row = perm.slot_row[size_t(t * k + s)];
      const T* e = expert_out + row * d;
      T* de = dexpert_out + row * d;
      if (weights) {
        const T w = weights[t * k + s];
        T dot = 0;
        for (int64_t c = 0; c < d; ++c) {
          de[c] = w * g[c];
          dot += g[c] * e[c];
        }
        dweights[t * k + s] = dot;
      } else {
        for (int64_t c = 0; c < d; ++c) de[c] = g[c];
      }
    }
  }
}

#define LOCKSTEP_MOE_INSTANTIATE(T)                                                              \
  template void moe_router_topk_fwd_cpu<T>(const T*, int64_t, int64_t, int64_t, bool, T*,        \
                                           int32_t*, T*);                                        \
  template void moe_router_topk_bwd_cpu<T>(const T*, const int32_t*, const T*, int64_t, int64_t, \
                                           int64_t, bool, T*);                                   \
  template void moe_gather_fwd_cpu<T>(const T*, const MoePermutation&, int64_t, T*);             \
  template void moe_gather_bwd_cpu<T>(const T*, const MoePermutation&, int64_t, T*);             \
  template void moe_combine_fwd_cpu<T>(const T*, const T*, const MoePermutation&, int64_t, T*);  \
  template void moe_combine_bwd_cpu<T>(const T*, const T*, const T*, const MoePermutation&,      \
                                       int64_t, T*, T*);
LOCKSTEP_MOE_INSTANTIATE(float)
LOCKSTEP_MOE_INSTANTIATE(double)
#undef LOCKSTEP_MOE_INSTANTIATE

}  // namespace lockstep::ops
