// Softmax, log-softmax and token log-prob / entropy CPU kernels (ops/softmax.h): the row functions
// of the header over HostLanes<1024>, rows in parallel.
#include <stdexcept>

#include "check.h"
#include "lockstep/ops/softmax.h"

namespace lockstep::ops {

namespace {

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
void softmax_fwd_cpu(const T* x, int64_t rows, int64_t n, T* y) {
  check_rows("softmax", rows, n);
  for_rows(rows, n, [&](int64_t r) { softmax_row(HostVocabLanes{}, x + r * n, n, y + r * n); });
}

template <class T>
void softmax_bwd_cpu(const T* y, const T* dy, int64_t rows, int64_t n, T* dx) {
  check_rows("softmax backward", rows, n);
  for_rows(rows, n, [&](int64_t r) {
    softmax_row_bwd(HostVocabLanes{}, y + r * n, dy + r * n, n, dx + r * n);
  });
}

template <class T>
void log_softmax_fwd_cpu(const T* x, int64_t rows, int64_t n, T* y) {
  check_rows("log_softmax", rows, n);
  for_rows(rows, n, [&](int64_t r) { log_softmax_row(HostVocabLanes{}, x + r * n, n, y + r * n); });
}

template <class T>
void log_softmax_bwd_cpu(const T* y, const T* dy, int64_t rows, int64_t n, T* dx) {
  check_rows("log_softmax backward", rows, n);
  for_rows(rows, n, [&](int64_t r) {
    log_softmax_row_bwd(HostVocabLanes{}, y + r * n, dy + r * n, n, dx + r * n);
  });
}

template <class T>
void token_logprobs_fwd_cpu(const T* logits, const int32_t* targets, int64_t tokens, int64_t vocab,
                            T* logp, T* entropy, T* lse) {
  check_rows("token_logprobs: logits", tokens, vocab);
  check_targets("token_logprobs", targets, tokens, vocab);
  for_rows(tokens, vocab, [&](int64_t t) {
    token_logprobs_row(HostVocabLanes{}, logits + t * vocab, vocab, int64_t(targets[t]), logp + t,
                       entropy + t, lse + t);
  });
}

template <class T>
void token_logprobs_bwd_cpu(const T* logits, const int32_t* targets, const T* lse, const T* entropy,
                            const T* dlogp, const T* dentropy, int64_t tokens, int64_t vocab,
                            T* dlogits) {
  check_rows("token_logprobs backward: logits", tokens, vocab);
  check_targets("token_logprobs backward", targets, tokens, vocab);
  for_rows(tokens, vocab, [&](int64_t t) {
    token_logprobs_row_bwd(HostVocabLanes{}, logits + t * vocab, vocab, int64_t(targets[t]), lse[t],
                           entropy[t], dlogp ? dlogp[t] : T(0), dentropy ? dentropy[t] : T(0),
                           dlogits + t * vocab);
  });
}

#define LOCKSTEP_SOFTMAX_INSTANTIATE(T)                                                            \
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
