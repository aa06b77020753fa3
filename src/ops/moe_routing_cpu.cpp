// MoE routing CPU reference (ops/moe_routing.h): a counting-sort permutation (expert-major, tokens
// ascending) and the slot-ordered combine.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "lockstep/ops/moe_routing.h"

namespace lockstep::ops {

namespace {

void check_perm(const char* what, const MoePermutation& perm, int64_t d) {
  detail::require(d >= 1 && int64_t(perm.slot_row.size()) == perm.tokens * perm.k &&
                      int64_t(perm.row_token.size()) == perm.tokens * perm.k,
                  "{}: row width {} or a permutation of {} slots not built for [{}, {}]", what, d,
                  perm.slot_row.size(), perm.tokens, perm.k);
}

bool parallel(int64_t work) { return work >= detail::kParallelMinWork; }

}  // namespace

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

#define LOCKSTEP_MOE_INSTANTIATE(T)                                                             \
  template void moe_gather_fwd_cpu<T>(const T*, const MoePermutation&, int64_t, T*);            \
  template void moe_gather_bwd_cpu<T>(const T*, const MoePermutation&, int64_t, T*);            \
  template void moe_combine_fwd_cpu<T>(const T*, const T*, const MoePermutation&, int64_t, T*); \
  template void moe_combine_bwd_cpu<T>(const T*, const T*, const T*, const MoePermutation&,     \
                                       int64_t, T*, T*);
LOCKSTEP_MOE_INSTANTIATE(float)
LOCKSTEP_MOE_INSTANTIATE(double)
#undef LOCKSTEP_MOE_INSTANTIATE

}  // namespace lockstep::ops
