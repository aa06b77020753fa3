// Qwen3-MoE routing: router softmax + top-k (+ optional renormalisation) with backward, and the
// permutation helpers that group token rows by expert and combine expert outputs back to tokens.
// CPU reference kernels on raw arrays of T in {float, double}.
//
// Router, per token (every step one rounded operation of T):
//   probs = softmax_row(logits) (ops/softmax.h);  top-k by repeated selection of the largest
//   remaining prob, a tie going to the lower expert index; slot s holds the s-th largest.
//   weights_s = probs[e_s], or with renormalisation (norm_topk_prob) probs[e_s] / S with
//   S = sum_s probs[e_s] (slot order 0..k-1).
// Backward (selection is piecewise constant): dprob[e_s] = dw_s, or with renormalisation
//   (dw_s - sum_r dw_r * w_r) / S (sum in slot order); other experts 0; then
//   dlogits = softmax_row_bwd(probs, dprob).
// Permutation: expert-major rows, tokens ascending within an expert (slots ascending for a token
//   that picks an expert twice); offsets [E+1], zero-token experts allowed.
// Combine: out[t] = sum over slots s = 0..k-1 in order of w[t,s] * expert_out[slot_row[t,s]]
//   (from 0). Backward: dexpert_out[slot_row[t,s]] = w[t,s] * dout[t];
//   dw[t,s] = sum_c dout[t,c] * expert_out[row,c], c ascending.
// Every value depends only on its own token's row(s); tokens run in parallel.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::ops {

// logits, probs: [tokens, experts] T, row-major; expert_ids, weights: [tokens, k], 1 <= k <= E.
template <class T>
void moe_router_topk_fwd_cpu(const T* logits, int64_t tokens, int64_t experts, int64_t k,
                             bool renormalize, T* probs, int32_t* expert_ids, T* weights);

// probs, expert_ids: forward results; dweights: [tokens, k]; dlogits: [tokens, experts].
template <class T>
void moe_router_topk_bwd_cpu(const T* probs, const int32_t* expert_ids, const T* dweights,
                             int64_t tokens, int64_t experts, int64_t k, bool renormalize,
                             T* dlogits);

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
