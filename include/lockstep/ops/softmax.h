// Row softmax, row log-softmax and per-token log-probabilities with entropy: CPU reference
// forward and backward on raw row-major arrays of T in {float, double}.
//
// Per row of n values (every step one rounded operation of T, sums from 0 in ascending index):
//   m = max_j x_j;  e_j = exp(x_j - m);  S = sum_j e_j
//   softmax:      y_j = e_j / S                 backward: dx_j = y_j * (dy_j - sum_k dy_k y_k)
//   log_softmax:  y_j = (x_j - m) - log(S)      backward: dx_j = dy_j - exp(y_j) * sum_k dy_k
// Token log-probs from logits [T, V] and targets y_t:
//   lse = m + log(S);  logp = (x_y - m) - log(S);  entropy = -sum_j p_j * lp_j with
//   lp_j = (x_j - m) - log(S), p_j = e_j / S.
//   backward (lp_j = x_j - lse, p_j = exp(lp_j) recomputed from the saved lse):
//   dx_j = -(p_j * (dlogp + dH * (lp_j + H))), plus dlogp at j = y.
// Every value depends only on its own row; rows run in parallel.
#pragma once

#include <cstdint>

namespace lockstep::ops {

// One row: x, y: [n], n >= 1 (y may alias x). The row functions are the definitions the batched
// kernels call, so a sampler scoring one row gets the learner's bits.
template <class T>
void softmax_row(const T* x, int64_t n, T* y);
// y: softmax output [n]; dy, dx: [n] (dx may alias dy).
template <class T>
void softmax_row_bwd(const T* y, const T* dy, int64_t n, T* dx);
template <class T>
void log_softmax_row(const T* x, int64_t n, T* y);
// y: log_softmax output [n]; dy, dx: [n] (dx may alias dy).
template <class T>
void log_softmax_row_bwd(const T* y, const T* dy, int64_t n, T* dx);

// x, y, dy, dx: [rows, n] T, row-major.
template <class T>
void softmax_fwd_cpu(const T* x, int64_t rows, int64_t n, T* y);
template <class T>
void softmax_bwd_cpu(const T* y, const T* dy, int64_t rows, int64_t n, T* dx);
template <class T>
void log_softmax_fwd_cpu(const T* x, int64_t rows, int64_t n, T* y);
template <class T>
void log_softmax_bwd_cpu(const T* y, const T* dy, int64_t rows, int64_t n, T* dx);

// logits: [tokens, vocab] T, row-major; targets: [tokens] int32 in [0, vocab)
// (std::out_of_range otherwise, before anything is written); logp, entropy, lse: [tokens].
template <class T>
void token_logprobs_fwd_cpu(const T* logits, const int32_t* targets, int64_t tokens, int64_t vocab,
                            T* logp, T* entropy, T* lse);

// lse, entropy: forward results [tokens]; dlogp, dentropy: [tokens], either may be nullptr
// (a zero gradient); dlogits: [tokens, vocab], overwritten.
template <class T>
void token_logprobs_bwd_cpu(const T* logits, const int32_t* targets, const T* lse, const T* entropy,
                            const T* dlogp, const T* dentropy, int64_t tokens, int64_t vocab,
                            T* dlogits);

}  // namespace lockstep::ops
