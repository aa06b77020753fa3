// Embedding CPU reference (ops/embedding.h): row gather, and a scatter-add made deterministic by
// grouping tokens per id (ascending) and giving each vocabulary row to one thread, which calls the
// shared embedding_bwd_sum.
#include <stdexcept>
#include <vector>

#include "check.h"
#include "lockstep/ops/embedding.h"

namespace lockstep::ops {

namespace {

void check_ids(const char* what, const int32_t* ids, int64_t tokens, int64_t vocab, int64_t d) {
  detail::require(tokens >= 0 && vocab >= 1 && d >= 1,
                  "{}: table [{}, {}] with {} tokens; need vocab, d >= 1", what, vocab, d, tokens);
  for (int64_t t = 0; t < tokens; ++t)
    if (ids[t] < 0 || ids[t] >= vocab)
      throw std::out_of_range(
          fmt::format("{}: token id {} at position {} is outside the vocabulary "
                      "of size V = {}",
                      what, ids[t], t, vocab));
}

}  // namespace

template <class T>
void embedding_fwd_cpu(const T* table, int64_t vocab, int64_t d, const int32_t* ids, int64_t tokens,
                       T* out) {
  check_ids("embedding", ids, tokens, vocab, d);
#pragma omp parallel for schedule(static) if (tokens * d >= detail::kParallelMinWork)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* src = table + int64_t(ids[t]) * d;
    for (int64_t c = 0; c < d; ++c) out[t * d + c] = src[c];
  }
}

template <class T>
void embedding_bwd_cpu(const T* dout, const int32_t* ids, int64_t tokens, int64_t vocab, int64_t d,
                       T* dtable) {
  check_ids("embedding backward", ids, tokens, vocab, d);
  // Counting sort: tokens of id v are order[start[v] .. start[v+1]), ascending.
  std::vector<int64_t> start(size_t(vocab + 1), 0);
  for (int64_t t = 0; t < tokens; ++t) ++start[size_t(ids[t]) + 1];
  for (int64_t v = 0; v < vocab; ++v) start[size_t(v + 1)] += start[size_t(v)];
  std::vector<int64_t> order(static_cast<size_t>(tokens));
  {
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < tokens; ++t) order[size_t(cursor[size_t(ids[t])]++)] = t;
  }
#pragma omp parallel for schedule(static) if ((vocab + tokens) * d >= detail::kParallelMinWork)
  for (int64_t v = 0; v < vocab; ++v)
    embedding_bwd_sum(dout, order.data(), start[size_t(v)], start[size_t(v + 1)], d, 0, d,
                      dtable + v * d);
}

template void embedding_fwd_cpu<float>(const float*, int64_t, int64_t, const int32_t*, int64_t,
                                       float*);
template void embedding_fwd_cpu<double>(const double*, int64_t, int64_t, const int32_t*, int64_t,
                                        double*);
template void embedding_bwd_cpu<float>(const float*, const int32_t*, int64_t, int64_t, int64_t,
                                       float*);
template void embedding_bwd_cpu<double>(const double*, const int32_t*, int64_t, int64_t, int64_t,
                                        double*);

}  // namespace lockstep::ops
