// Qwen3-MoE routing: the permutation helpers that group token rows by expert and combine expert
// outputs back to tokens; the router (softmax + top-k + renormalisation) is ops/router.h.
// CPU reference kernels on raw arrays of T in {float, double}.
//
// Permutation: expert-major rows, tokens ascending within an expert (slots ascending for a token
//   that picks an expert twice); offsets [E+1], zero-token experts allowed.
// Combine: out[t] = sum over slots s = 0..k-1 in order of w[t,s] * expert_out[slot_row[t,s]]
//   (from 0). Backward: dexpert_out[slot_row[t,s]] = w[t,s] * dout[t];
//   dw[t,s] = sum_c dout[t,c] * expert_out[row,c], c ascending.
// Every value depends only on its own token's row(s); tokens run in parallel.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/ops/router.h"

namespace lockstep::ops {

// Token rows grouped by expert, built from expert_ids [tokens, k].
struct MoePermutation {
  int64_t tokens = 0, experts = 0, k = 0;
  std::vector<int64_t> offsets;    // [experts + 1]: expert e owns rows [offsets[e], offsets[e+1])
  std::vector<int32_t> row_token;  // [tokens * k]: source token of each expert row (gather index)
  std::vector<int32_t> slot_row;   // [tokens * k]: expert row of slot (t, s) at t * k + s
};

// expert_ids: [tokens, k] int32 in [0, experts) (std::out_of_range otherwise).
MoePermutation moe_permutation_cpu(const int32_t* expert_ids, int64_t tokens, int64_t experts,
                                   int64_t k);

// x: [tokens, d] T; out: [tokens * k, d], row r = x[row_token[r]].
template <class T>
void moe_gather_fwd_cpu(const T* x, const MoePermutation& perm, int64_t d, T* out);
// dout: [tokens * k, d]; dx: [tokens, d], dx[t] = sum over slots s ascending of
// dout[slot_row[t,s]] (from 0).
template <class T>
void moe_gather_bwd_cpu(const T* dout, const MoePermutation& perm, int64_t d, T* dx);

// expert_out: [tokens * k, d] T in permuted order; weights: [tokens, k] or nullptr (weight 1,
// e.g. when the router probability was applied inside the weighted SwiGLU); out: [tokens, d].
template <class T>
void moe_combine_fwd_cpu(const T* expert_out, const T* weights, const MoePermutation& perm,
                         int64_t d, T* out);
// dout: [tokens, d]; dexpert_out: [tokens * k, d]; dweights: [tokens, k], written when weights
// is non-null.
template <class T>
void moe_combine_bwd_cpu(const T* dout, const T* expert_out, const T* weights,
                         const MoePermutation& perm, int64_t d, T* dexpert_out, T* dweights);

}  // namespace lockstep::ops
