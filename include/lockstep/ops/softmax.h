// Row softmax, row log-softmax and per-token log-probabilities with entropy: the row functions,
// written once over a row executor (ops/row_exec.h) and called by the CPU kernels below
// (HostLanes<1024>) and the CUDA kernels (BlockLanes, or several blocks per row for small batches),
// so both compute the same bits; CPU kernels on raw row-major arrays of T in {float, double}.
//
// Lanes: every op of this header runs its rows with 1024 lanes (vocabulary-sized rows); the MoE
// router calls the same row functions with 32 lanes (ops/router.h). Per row of n values, every
// step one rounded operation of T, sums and maxes in the executor's order:
//   m = max_j x_j (a NaN element is skipped by the max);  S = sum_j exp(x_j - m);  log S = log(S)
//   softmax:     y_j = exp(x_j - m) / S            backward: dx_j = y_j * (dy_j - sum_k dy_k * y_k)
//   log_softmax: y_j = (x_j - m) - log S           backward: dx_j = dy_j - exp(y_j) * sum_k dy_k
// Token log-probs of logits x [tokens, V] at targets y (two passes over the row: the max, then S
// and U together with sum2, U = sum_j u_j, u_j = e_j * (x_j - m) when e_j = exp(x_j - m) > 0, else
// 0, so a -inf logit contributes nothing):
//   logp = (x_y - m) - log S (the bits of log_softmax at y);  entropy = log S - U / S;
//   lse = m + log S.
//   backward, with lp_j = x_j - lse and p_j = exp(lp_j) recomputed from the saved lse:
//   dx_j = -(p_j * (dlogp + dH * (lp_j + H))) when p_j > 0, else 0; then dx_y = dx_y + dlogp.
// A row with a NaN or +inf element, or with every element -inf, has S = NaN: every output of it is
// NaN. Every value depends only on its own row and the fixed lane order, never on the batch or the
// device; rows run in parallel.
#pragma once

#include <cstdint>
#include <limits>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops {

// The lanes of vocabulary-sized rows (softmax, log_softmax, token_logprobs, sample_tokens).
inline constexpr int kVocabLanes = kBlockLanes;
using HostVocabLanes = HostLanes<kVocabLanes>;

// The max, the sum of exponentials and its log of one row.
template <class T>
struct RowStats {
  T m, s, log_s;
};

// Stats of the row whose element j is in(j) (a logit, possibly scaled on the fly).
template <class T, class X, class In>
LOCKSTEP_HD RowStats<T> softmax_stats(const X& ex, int64_t n, const In& in) {
  const T m = ex.template max<T>(n, in);
  const T s = ex.template sum<T>(n, [&](int64_t j) { return OpMath<T>::exp(in(j)-m); });
  return {m, s, OpMath<T>::log(s)};
}

// (x_j - m) - log S: the log-probability of one element given its row's stats.
template <class T>
LOCKSTEP_HD T log_softmax_value(T xj, const RowStats<T>& st) {
  return (xj - st.m) - st.log_s;
}
// exp(x_j - m) / S.
template <class T>
LOCKSTEP_HD T softmax_value(T xj, const RowStats<T>& st) {
  return OpMath<T>::exp(xj - st.m) / st.s;
}

// One row: x, y: [n], n >= 1; y may alias x. Every lane of the executor calls it.
template <class X, class T>
LOCKSTEP_HD void softmax_row(const X& ex, const T* x, int64_t n, T* y) {
  const RowStats<T> st = softmax_stats<T>(ex, n, [&](int64_t j) { return x[j]; });
  ex.for_each(n, [&](int64_t j) { y[j] = softmax_value(x[j], st); });
}

template <class X, class T>
LOCKSTEP_HD void log_softmax_row(const X& ex, const T* x, int64_t n, T* y) {
  const RowStats<T> st = softmax_stats<T>(ex, n, [&](int64_t j) { return x[j]; });
  ex.for_each(n, [&](int64_t j) { y[j] = log_softmax_value(x[j], st); });
}

// y: the softmax output [n]; dy, dx: [n] (dx may alias dy).
template <class X, class T>
LOCKSTEP_HD void softmax_row_bwd(const X& ex, const T* y, const T* dy, int64_t n, T* dx) {
  const T dot = ex.template sum<T>(n, [&](int64_t j) { return dy[j] * y[j]; });
  ex.for_each(n, [&](int64_t j) { dx[j] = y[j] * (dy[j] - dot); });
}

// y: the log_softmax output [n]; dy, dx: [n] (dx may alias dy).
template <class X, class T>
LOCKSTEP_HD void log_softmax_row_bwd(const X& ex, const T* y, const T* dy, int64_t n, T* dx) {
  const T s = ex.template sum<T>(n, [&](int64_t j) { return dy[j]; });
  ex.for_each(n, [&](int64_t j) { dx[j] = dy[j] - OpMath<T>::exp(y[j]) * s; });
}

// One token: x: logits [n]; target in [0, n) (any other value gives logp = NaN and reads nothing
// outside the row); writes *logp, *entropy, *lse (through the executor's leader).
template <class X, class T>
LOCKSTEP_HD void token_logprobs_row(const X& ex, const T* x, int64_t n, int64_t target, T* logp,
                                    T* entropy, T* lse) {
  const T m = ex.template max<T>(n, [&](int64_t j) { return x[j]; });
  const Sum2<T> su = ex.template sum2<T>(n, [&](int64_t j) {
    const T d = x[j] - m;
    const T e = OpMath<T>::exp(d);
    return Sum2<T>{e, e > T(0) ? e * d : T(0)};
  });
  if (ex.leader()) {
    const T log_s = OpMath<T>::log(su.a);
    *logp =
        target >= 0 && target < n ? (x[target] - m) - log_s : std::numeric_limits<T>::quiet_NaN();
    *entropy = log_s - su.b / su.a;
    *lse = m + log_s;
  }
}

// Backward of one token: dx [n] overwritten. gl, gh: dlogp and dentropy of the token (0 for none).
// A target outside [0, n) gives a NaN row.
template <class X, class T>
LOCKSTEP_HD void token_logprobs_row_bwd(const X& ex, const T* x, int64_t n, int64_t target, T lse,
                                        T entropy, T gl, T gh, T* dx) {
  const bool ok = target >= 0 && target < n;
  ex.for_each(n, [&](int64_t j) {
    const T lp = x[j] - lse;
    const T p = OpMath<T>::exp(lp);
    T v = p > T(0) ? -(p * (gl + gh * (lp + entropy))) : T(0);
    if (j == target) v = v + gl;
    dx[j] = ok ? v : std::numeric_limits<T>::quiet_NaN();
  });
}

// ---- CPU kernels (HostLanes<1024> per row, rows in parallel) -----------------------------------

// x, y, dy, dx: [rows, n] T, row-major; n >= 1 (std::invalid_argument otherwise).
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
