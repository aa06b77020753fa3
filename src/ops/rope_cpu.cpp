// Rotary position embedding CPU reference (ops/rope.h): the float64 table and the shared per-pair
// rotation (rope_pair), tokens in parallel.
#include <cmath>
#include <stdexcept>

#include "check.h"
#include "lockstep/ops/rope.h"

namespace lockstep::ops {

namespace {

void check_rope_args(const char* what, const int32_t* positions, int64_t tokens, int64_t heads,
                     int64_t head_dim, int64_t max_pos) {
  detail::require(tokens >= 0 && heads >= 1 && head_dim >= 2 && head_dim % 2 == 0,
                  "{}: x has shape [{}, {}, {}]; need heads >= 1 and an even head_dim >= 2", what,
                  tokens, heads, head_dim);
  for (int64_t t = 0; t < tokens; ++t)
    if (positions[t] < 0 || positions[t] >= max_pos)
      throw std::out_of_range(fmt::format("{}: positions[{}] = {} is outside the table [0, {})",
                                          what, t, positions[t], max_pos));
}

// out = R in per (token, head) pair rotation (kTranspose: R^T in, the backward).
template <class T, bool kTranspose>
void rotate(const T* in, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
            const T* cos, const T* sin, T* out) {
  const int64_t h = head_dim / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * head_dim >= detail::kParallelMinWork)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* c = cos + int64_t(positions[t]) * head_dim;
    const T* s = sin + int64_t(positions[t]) * head_dim;
    for (int64_t hd = 0; hd < heads; ++hd) {
      const T* a = in + (t * heads + hd) * head_dim;
      T* o = out + (t * heads + hd) * head_dim;
      for (int64_t i = 0; i < h; ++i) rope_pair<T, kTranspose>(a, c, s, h, i, o);
    }
  }
}

}  // namespace

template <class T>
void rope_table_cpu(int64_t max_pos, int64_t head_dim, double theta, T* cos, T* sin) {
  detail::require(max_pos >= 0 && head_dim >= 2 && head_dim % 2 == 0 && theta > 0,
                  "rope table: shape [{}, {}] with theta {}; need an even head_dim >= 2, theta > 0",
                  max_pos, head_dim, theta);
  const int64_t h = head_dim / 2;
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < h; ++i) {
      const double inv_freq = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
      const double angle = double(p) * inv_freq;
      cos[p * head_dim + i] = cos[p * head_dim + i + h] = T(std::cos(angle));
      sin[p * head_dim + i] = sin[p * head_dim + i + h] = T(std::sin(angle));
    }
}

template <class T>
void rope_fwd_cpu(const T* x, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, const T* cos, const T* sin, int64_t max_pos, T* y) {
  check_rope_args("rope", positions, tokens, heads, head_dim, max_pos);
  rotate<T, false>(x, positions, tokens, heads, head_dim, cos, sin, y);
}

template <class T>
void rope_bwd_cpu(const T* dy, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, const T* cos, const T* sin, int64_t max_pos, T* dx) {
  check_rope_args("rope backward", positions, tokens, heads, head_dim, max_pos);
  rotate<T, true>(dy, positions, tokens, heads, head_dim, cos, sin, dx);
}

#define LOCKSTEP_ROPE_INSTANTIATE(T)                                                           \
  template void rope_table_cpu<T>(int64_t, int64_t, double, T*, T*);                           \
  template void rope_fwd_cpu<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, const T*, \
                                const T*, int64_t, T*);                                        \
  template void rope_bwd_cpu<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, const T*, \
                                const T*, int64_t, T*);
LOCKSTEP_ROPE_INSTANTIATE(float)
LOCKSTEP_ROPE_INSTANTIATE(double)
#undef LOCKSTEP_ROPE_INSTANTIATE

}  // namespace lockstep::ops
