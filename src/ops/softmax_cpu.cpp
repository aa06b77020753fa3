// Softmax, log-softmax and token log-prob / entropy CPU reference (ops/softmax.h): one function
// per row with its sums in ascending index order, rows in parallel.
#include <stdexcept>

#include "check.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/softmax.h"

namespace lockstep::ops {

namespace {

template <class T>
T row_max(const T* x, int64_t n) {
  T m = x[0];
  for (int64_t j = 1; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// S = sum_j exp(x_j - m), j ascending from 0.
template <class T>
T row_sum_exp(const T* x, int64_t n, T m) {
  T s = 0;
  for (int64_t j = 0; j < n; ++j) s += OpMath<T>::exp(x[j] - m);
  return s;
}

void check_rows(const char* what, int64_t rows, int64_t n) {
  detail::require(rows >= 0 && n >= 1, "{}: shape [{}, {}]; need rows >= 0 and n >= 1", what, rows,
                  n);
}

void check_targets(const char* what, const int32_t* targets, int64_t tokens, int64_t vocab) {
  for (int64_t t = 0; t < tokens; ++t)
    if (targets[t] < 0 || targets[t] >= vocab)
      throw std::out_of_range(fmt::format("{}: targets[{}] = {} outside the vocabulary [0, {})",
                                          what, t, targets[t], vocab));
}

// Calls row(r) for every row r, rows in parallel.
template <class F>
void for_rows(int64_t rows, int64_t n, F&& row) {
#pragma omp parallel for schedule(static) if (rows * n * 8 >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) row(r);
}

}  // namespace

template <class T>
void softmax_row(const T* x, int64_t n, T* y) {
  detail::require(n >= 1, "softmax_row: row length {} must be >= 1", n);
  const T m = row_max(x, n);
  T s = 0;
  for (int64_t j = 0; j < n; ++j) {
    y[j] = OpMath<T>::exp(x[j] - m);
    s += y[j];
  }
  for (int64_t j = 0; j < n; ++j) y[j] = y[j] / s;
}

template <class T>
void softmax_row_bwd(const T* y, const T* dy, int64_t n, T* dx) {
  detail::require(n >= 1, "softmax_row_bwd: row length {} must be >= 1", n);
  T dot = 0;
  for (int64_t j = 0; j < n; ++j) dot += dy[j] * y[j];
  for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - dot);
}

template <class T>
void log_softmax_row(const T* x, int64_t n, T* y) {
  detail::require(n >= 1, "log_softmax_row: row length {} must be >= 1", n);
  const T m = row_max(x, n);
  const T log_s = OpMath<T>::log(row_sum_exp(x, n, m));
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - m) - log_s;
}

template <class T>
void log_softmax_row_bwd(const T* y, const T* dy, int64_t n, T* dx) {
  detail::require(n >= 1, "log_softmax_row_bwd: row length {} must be >= 1", n);
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += dy[j];
  for (int64_t j = 0; j < n; ++j) dx[j] = dy[j] - OpMath<T>::exp(y[j]) * sum;
}

template <class T>
void softmax_fwd_cpu(const T* x, int64_t rows, int64_t n, T* y) {
  check_rows("softmax", rows, n);
  for_rows(rows, n, [&](int64_t r) { softmax_row(x + r * n, n, y + r * n); });
}

template <class T>
void softmax_bwd_cpu(const T* y, const T* dy, int64_t rows, int64_t n, T* dx) {
  check_rows("softmax backward", rows, n);
  for_rows(rows, n, [&](int64_t r) { softmax_row_bwd(y + r * n, dy + r * n, n, dx + r * n); });
}

template <class T>
void log_softmax_fwd_cpu(const T* x, int64_t rows, int64_t n, T* y) {
  check_rows("log_softmax", rows, n);
  for_rows(rows, n, [&](int64_t r) { log_softmax_row(x + r * n, n, y + r * n); });
}

template <class T>
void log_softmax_bwd_cpu(const T* y, const T* dy, int64_t rows, int64_t n, T* dx) {
  check_rows("log_softmax backward", rows, n);
  for_rows(rows, n, [&](int64_t r) { log_softmax_row_bwd(y + r * n, dy + r * n, n, dx + r * n); });
}

template <class T>
void token_logprobs_fwd_cpu(const T* logits, const int32_t* targets, int64_t tokens, int64_t vocab,
                            T* logp, T* entropy, T* lse) {
  check_rows("token_logprobs: logits", tokens, vocab);
  check_targets("token_logprobs", targets, tokens, vocab);
  for_rows(tokens, vocab, [&](int64_t t) {
    const T* x = logits + t * vocab;
    const T m = row_max(x, vocab);
    const T s = row_sum_exp(x, vocab, m);
    const T log_s = OpMath<T>::log(s);
    T acc = 0;  // sum_j p_j * lp_j
    for (int64_t j = 0; j < vocab; ++j) {
      const T shifted = x[j] - m;
      acc += (OpMath<T>::exp(shifted) / s) * (shifted - log_s);
    }
    logp[t] = (x[targets[t]] - m) - log_s;
    entropy[t] = -acc;
    lse[t] = m + log_s;
  });
}

template <class T>
void token_logprobs_bwd_cpu(const T* logits, const int32_t* targets, const T* lse, const T* entropy,
                            const T* dlogp, const T* dentropy, int64_t tokens, int64_t vocab,
                            T* dlogits) {
  check_rows("token_logprobs backward: logits", tokens, vocab);
  check_targets("token_logprobs backward", targets, tokens, vocab);
  for_rows(tokens, vocab, [&](int64_t t) {
    const T* x = logits + t * vocab;
    T* dx = dlogits + t * vocab;
    const T gl = dlogp ? dlogp[t] : T(0);
    const T gh = dentropy ? dentropy[t] : T(0);
    const T h = entropy[t], z = lse[t];
    for (int64_t j = 0; j < vocab; ++j) {
      const T lp = x[j] - z;
      dx[j] = -(OpMath<T>::exp(lp) * (gl + gh * (lp + h)));
    }
    dx[targets[t]] += gl;
  });
}

#define LOCKSTEP_SOFTMAX_INSTANTIATE(T)                                                            \
  template void softmax_row<T>(const T*, int64_t, T*);                                             \
  template void softmax_row_bwd<T>(const T*, const T*, int64_t, T*);                               \
  template void log_softmax_row<T>(const T*, int64_t, T*);                                         \
  template void log_softmax_row_bwd<T>(const T*, const T*, int64_t, T*);                           \
  template void softmax_fwd_cpu<T>(const T*, int64_t, int64_t, T*);                                \
  template void softmax_bwd_cpu<T>(const T*, const T*, int64_t, int64_t, T*);                      \
  template void log_softmax_fwd_cpu<T>(const T*, int64_t, int64_t, T*);                            \
  template void log_softmax_bwd_cpu<T>(const T*, const T*, int64_t, int64_t, T*);                  \
  template void token_logprobs_fwd_cpu<T>(const T*, const int32_t*, int64_t, int64_t, T*, T*, T*); \
  template void token_logprobs_bwd_cpu<T>(const T*, const int32_t*, const T*, const T*, const T*,  \
                                          const T*, int64_t, int64_t, T*);
LOCKSTEP_SOFTMAX_INSTANTIATE(float)
LOCKSTEP_SOFTMAX_INSTANTIATE(double)
#undef LOCKSTEP_SOFTMAX_INSTANTIATE

}  // namespace lockstep::ops
