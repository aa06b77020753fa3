// Token sampling as one op: temperature, top-k, top-p and an inverse CDF driven by one Philox
// uniform per row, defined with fixed float orders so that the CPU and the GPU draw the same token
// from the same logits. The pieces are written once here (row functions over a row executor and
// LOCKSTEP_HD helpers); the CPU kernel and the CUDA kernels compose them.
//
// Definition, per row of V logits x (V <= 2^21), every step one rounded fp32 operation:
//   u = sampling_uniform(seed, stream, position): Philox4x32-10 with key = seed, counter =
//       (position low, position high, stream, 0), word 0 w, u = (w >> 8) * 2^-24 in [0, 1).
//   x'_j = x_j * float(1 / temperature) (the learner's scaling; exact for temperature 1).
//   Stats with 1024 lanes (ops/softmax.h): m = max x'_j, S = sum exp(x'_j - m), log S.
//   lp_j = (x'_j - m) - log S: the bits of log_softmax_row and of token_logprobs on x'.
//   A row with S = NaN (a NaN or +inf in x', every x' -inf) has no distribution: token -1, log-prob
//   NaN.
//   top_k == 1 (greedy): the lowest j with lp_j == (m - m) - log S, the largest log-prob.
//   Otherwise the candidates c_0, c_1, ..., c_{n-1}:
//     top_k == 0 and top_p == 1: every token in index order, n = V;
//     else: the tokens sorted by (lp descending, index ascending) (-0 and +0 equal), truncated to
//     n = min(top_k, V) when top_k > 0.
//   Weights w_i = exp(lp_{c_i} + 0). Blocked prefix sums over the candidates in that order: blocks
//   of kSampleBlock = 256 consecutive candidates; B_b = the block's weights summed sequentially
//   from +0; P_b = P_{b-1} + B_b sequentially (P_{-1} = +0); the prefix at candidate i = 256 b + r
//   is Q_i = P_{b-1} + c_r with c_r the block's sequential sum of its first r + 1 weights from +0,
//   so Q at a block's last candidate is P_b, and Q is non-decreasing.
//   top_p < 1: keep the shortest prefix whose mass reaches top_p: keep = 1 + the first i with
//     Q_i >= float(top_p), or n when there is none.
//   total = Q_{keep-1}; target = u * total (rounded); the token is c_i for the first i < keep with
//   Q_i > target. total > 0 is normal (the largest candidate's weight is >= exp(-log V)) and
//   u <= 1 - 2^-24, so target < total: the crossing exists, at the latest at i = keep - 1, and a
//   zero weight never crosses. The log-prob returned is lp of the token (as token_logprobs).
// top_k == 1 is the general rule with n = 1 (the first candidate of the sorted order).
#pragma once

#include <cstdint>
#include <limits>

#include "lockstep/numerics/philox.h"
#include "lockstep/numerics/transcendental.h"
#include "lockstep/ops/softmax.h"

namespace lockstep::ops {

inline constexpr int64_t kSampleBlock = 256;
inline constexpr int64_t kSampleMaxVocab = int64_t(1) << 21;  // 8192 blocks

struct SampleConfig {
  double temperature = 1.0;  // > 0: logits are scaled by float(1 / temperature)
  int64_t top_k = 0;         // >= 0; 0 keeps every token, 1 is greedy
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;         // the Philox key
};

// One uniform in [0, 1) for (seed, stream, position): Philox4x32-10, key = seed, counter =
// (position low, position high, stream, 0), word 0 w, (w >> 8) * 2^-24 (exact in float).
LOCKSTEP_HD inline float sampling_uniform(uint64_t seed, uint32_t stream, int64_t position) {
  const num::Philox4x32 c{{uint32_t(position), uint32_t(uint64_t(position) >> 32), stream, 0u}};
  const num::Philox4x32 r = num::philox4x32_10(c, uint32_t(seed), uint32_t(seed >> 32));
  return float(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

// The logit scale of a temperature: float(1 / temperature), as ops::scale(logits, 1 / t) rounds it.
inline float sampling_scale(double temperature) { return float(1.0 / temperature); }

// Stats of the scaled row x_j * inv_t (1024 lanes on every backend).
template <class X>
LOCKSTEP_HD RowStats<float> sample_stats_row(const X& ex, const float* x, int64_t n, float inv_t) {
  return softmax_stats<float>(ex, n, [&](int64_t j) { return x[j] * inv_t; });
}
LOCKSTEP_HD inline bool sample_row_valid(const RowStats<float>& st) { return st.s >= 1.0f; }
LOCKSTEP_HD inline float sample_logprob(float xj, float inv_t, const RowStats<float>& st) {
  return log_softmax_value(xj * inv_t, st);
}
LOCKSTEP_HD inline float sample_weight(float lp) { return num::exp_f32(lp + 0.0f); }

// Greedy (top_k == 1) for one row: writes *token (-1 without a distribution) and *logprob.
// Three reductions: the max, the sum, and the lowest index with the largest log-prob (as the max
// of -j, exact for j < 2^24).
template <class X>
LOCKSTEP_HD void sample_greedy_row(const X& ex, const float* x, int64_t n, float inv_t,
                                   int32_t* token, float* logprob) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const RowStats<float> st = sample_stats_row(ex, x, n, inv_t);
  const float top = log_softmax_value(st.m, st);
  const float neg = ex.template max<float>(
      n, [&](int64_t j) { return sample_logprob(x[j], inv_t, st) == top ? -float(j) : -kInf; });
  if (ex.leader()) {
    const int64_t j = sample_row_valid(st) && neg > -kInf ? int64_t(-neg) : -1;
    *token = int32_t(j);
    *logprob = j >= 0 ? sample_logprob(x[j], inv_t, st) : std::numeric_limits<float>::quiet_NaN();
  }
}

// ---- the sorted order --------------------------------------------------------------------
// Bits of the token index in a sort key: ceil(log2(V)), at least 1.
LOCKSTEP_HD inline int sample_index_bits(int64_t vocab) {
  int b = 1;
  while ((int64_t(1) << b) < vocab) ++b;
  return b;
}
// An unsigned key whose ascending order is (lp descending, index ascending), -0 == +0:
// (~order(lp + 0) << index_bits) | j, order() mapping floats to unsigned in ascending order.
LOCKSTEP_HD inline uint64_t sample_sort_key(float lp, int64_t j, int index_bits) {
  const uint32_t u = num::f32_bits(lp + 0.0f);
  const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t(~ordered) << index_bits) | uint64_t(j);
}
LOCKSTEP_HD inline int64_t sample_key_index(uint64_t key, int index_bits) {
  return int64_t(key & ((uint64_t(1) << index_bits) - 1));
}
LOCKSTEP_HD inline float sample_key_logprob(uint64_t key, int index_bits) {
  const uint32_t ordered = ~uint32_t(key >> index_bits);
  return num::f32_from_bits((ordered & 0x80000000u) ? (ordered & 0x7FFFFFFFu) : ~ordered);
}

// ---- blocked prefix sums and the inverse CDF -----------------------------------------------
// The sequential sums below wait on their adds only: the values of a chunk are read before any of
// them is added (in order), so one thread's chain of a few hundred adds does not also wait for a
// load per add (shared memory on the GPU).
inline constexpr int kSampleChunk = 16;

// f(i, v_i) for i = begin .. end - 1 in order, v_i = w(i) read a chunk ahead; stops after the
// first i for which f returns true and returns it, or -1.
template <class W, class F>
LOCKSTEP_HD int64_t sample_in_order(const W& w, int64_t begin, int64_t end, const F& f) {
  int64_t i = begin;
  for (; i + kSampleChunk <= end; i += kSampleChunk) {
    float v[kSampleChunk];
    LOCKSTEP_UNROLL
    for (int j = 0; j < kSampleChunk; ++j) v[j] = w(i + j);
    LOCKSTEP_UNROLL
    for (int j = 0; j < kSampleChunk; ++j)
      if (f(i + j, v[j])) return i + j;
  }
  for (; i < end; ++i)
    if (f(i, w(i))) return i;
  return -1;
}

// B_b: w(begin) + ... + w(end - 1), sequentially from +0.
template <class W>
LOCKSTEP_HD float sample_block_sum(const W& w, int64_t begin, int64_t end) {
  float c = 0.0f;
  sample_in_order(w, begin, end, [&](int64_t, float v) {
    c = c + v;
    return false;
  });
  return c;
}
// Block sums [nb] -> block prefixes P_b in place, sequentially from +0.
LOCKSTEP_HD inline void sample_prefix_chain(float* p, int64_t nb) {
  float acc = 0.0f;
  sample_in_order([p](int64_t b) { return p[b]; }, 0, nb,
                  [&](int64_t b, float v) {
                    acc = acc + v;
                    p[b] = acc;
                    return false;
                  });
}
// The first i in [begin, end) (one block) whose prefix Q_i = base + c_i passes thr (>= when
// at_least, > otherwise), c_i summed sequentially from +0; writes Q_i to *q. -1 when none does.
template <class W>
LOCKSTEP_HD int64_t sample_scan_block(const W& w, int64_t begin, int64_t end, float base, float thr,
                                      bool at_least, float* q) {
  float c = 0.0f;
  return sample_in_order(w, begin, end, [&](int64_t, float v) {
    c = c + v;
    const float qi = base + c;
    const bool hit = at_least ? qi >= thr : qi > thr;
    if (hit) *q = qi;
    return hit;
  });
}

// The candidate drawn by target u over n candidates with block prefixes P [ceil(n / 256)]:
// first_block(lim, thr, at_least): the first b < lim with P_b >= thr (at_least) or P_b > thr, else
// lim (P is non-decreasing: any search order gives it); scan(begin, end, base, thr, at_least, &q):
// sample_scan_block over the weights. Returns the candidate position i in [0, n).
template <class FirstBlock, class Scan>
LOCKSTEP_HD int64_t sample_pick(int64_t n, const float* P, bool truncate_p, float top_p, float u,
                                const FirstBlock& first_block, const Scan& scan) {
  const int64_t nb = (n + kSampleBlock - 1) / kSampleBlock;
  const auto block_end = [&](int64_t b) {
    return (b + 1) * kSampleBlock < n ? (b + 1) * kSampleBlock : n;
  };
  int64_t keep = n;
  float total = P[nb - 1];
  if (truncate_p) {
    const int64_t b = first_block(nb, top_p, true);
    if (b < nb) {
      float q = 0.0f;
      const int64_t i =
          scan(b * kSampleBlock, block_end(b), b > 0 ? P[b - 1] : 0.0f, top_p, true, &q);
      keep = i >= 0 ? i + 1 : block_end(b);  // i >= 0: the block's last prefix is P_b >= top_p
      total = i >= 0 ? q : P[b];
    }
  }
  const float target = u * total;
  const int64_t kb = (keep - 1) / kSampleBlock;  // the block of the last kept candidate
  const int64_t b = first_block(kb, target, false);
  float q = 0.0f;
  const int64_t end = b == kb ? keep : block_end(b);
  const int64_t i = scan(b * kSampleBlock, end, b > 0 ? P[b - 1] : 0.0f, target, false, &q);
  return i >= 0 ? i : keep - 1;  // i >= 0 always: the last prefix of the range exceeds target
}

// ---- CPU kernel --------------------------------------------------------------------------
// logits: [rows, vocab] float, row-major, 1 <= vocab <= kSampleMaxVocab; streams, positions:
// [rows]; tokens, logprobs: [rows]. cfg checked (std::invalid_argument).
void sample_tokens_cpu(const float* logits, int64_t rows, int64_t vocab, const uint32_t* streams,
                       const int64_t* positions, const SampleConfig& cfg, int32_t* tokens,
                       float* logprobs);

// The config rule of every backend: temperature > 0 and finite, top_k >= 0, top_p in (0, 1].
void check_sample_config(const SampleConfig& cfg, int64_t vocab);

}  // namespace lockstep::ops
