// The Qwen3-MoE router: softmax over the E experts of a token, top-k by repeated selection,
// optional renormalisation, and its backward. Row functions written once over a row executor with
// 32 lanes (HostLanes<32> on the CPU, a warp per token on CUDA: ops/row_exec.h); CPU kernels on raw
// arrays of T in {float, double}.
//
// Per token (every step one rounded operation of T; sums and maxes in the 32-lane order):
//   probs = softmax_row(logits) with 32 lanes (ops/softmax.h), p_e = exp(x_e - m) / S.
//   Slot s = 0..k-1 holds the largest p_e not taken by slots 0..s-1, a tie going to the lower
//   expert index: the experts in the order (p descending, e ascending). The selection is exact
//   (no rounding), so how it is computed changes no bit: for float one 32-lane max per slot over
//   the keys (p's bits, 2^32 - 1 - e) below the previous slot's key; for double two (the best p
//   after the previous slot in that order, then the lowest e with that p, as the max of -e).
//   weights_s = p[e_s], or with renormalisation (norm_topk_prob) p[e_s] / W with
//   W = sum_s p[e_s] in slot order 0..k-1 from 0.
//   A token whose softmax has no distribution (a NaN or +inf logit, or every logit -inf: NaN
//   probabilities) takes experts 0..k-1 in order with NaN weights.
// Backward (the selection is piecewise constant): the probability gradient is
//   g_e = sum over the slots s with e_s = e (slot order, from 0) of c_s, with c_s = dw_s, or with
//   renormalisation c_s = (dw_s - D) / W, D = sum_r dw_r * (p[e_r] / W) in slot order;
//   then dlogits = softmax_row_bwd(probs, g) with 32 lanes. An expert id outside [0, E) in the
//   backward's input gives a NaN row (nothing outside the row is read).
// Every value depends only on its own token's row; tokens run in parallel.
#pragma once

#include <cstdint>
#include <limits>

#include "lockstep/ops/softmax.h"

namespace lockstep::ops {

inline constexpr int kRouterLanes = kWarpLanes;
using HostRouterLanes = HostLanes<kRouterLanes>;

// Experts up to this many keep their probabilities in registers for the selection (a Dims array
// of the executor: 8 per lane on the GPU); more are read back from probs. Either way a selection
// reads the stored value prob(e), so the two paths give the same bits.
inline constexpr int kRouterDimsExperts = 256;

namespace detail {

// Slots 0..k-1 of router_topk_row, given the row's stats and `reduce(f)`: the 32-lane max over the
// experts e of f(e, p_e) (f returns T, or uint64_t keys).
template <class X, class T, class Prob, class Reduce>
LOCKSTEP_HD void router_select(const X& ex, const RowStats<T>& st, int64_t k, bool renormalize,
                               const Prob& prob, const Reduce& reduce, int32_t* ids, T* weights) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const bool valid = st.s >= T(1);  // S >= exp(0) = 1 whenever the row has a distribution
  T prev_p = kInf;                  // the previous slot's (probability, expert)
  int64_t prev_e = -1;
  uint64_t prev_key = ~uint64_t(0);
  T sum = 0;
  for (int64_t s = 0; s < k; ++s) {
    bool found;
    int64_t e;
    T best;
    if constexpr (sizeof(T) == 4) {
      // In a row with a distribution every p is finite and >= +0, so its bits order as its value
      // does: the key (p's bits, 2^32 - 1 - e) orders the experts as (p descending, e ascending)
      // reversed, and one max over the keys below the previous slot's is the slot's (p, e). Key 0
      // (p = +0 at e = 2^32 - 1) cannot occur, so it stands for "none left".
      const uint64_t key = reduce([&](int64_t x, T p) {
        const uint64_t kx = (uint64_t(num::f32_bits(p)) << 32) | (0xFFFFFFFFu - uint32_t(x));
        return kx < prev_key ? kx : uint64_t(0);
      });
      found = valid && key != 0;
      e = found ? int64_t(0xFFFFFFFFu - uint32_t(key)) : s;
      best = num::f32_from_bits(uint32_t(key >> 32));
      prev_key = key;
    } else {
      const auto after = [&](int64_t x, T p) { return p < prev_p || (p == prev_p && x > prev_e); };
      best = reduce([&](int64_t x, T p) { return after(x, p) ? p : -kInf; });
      const T neg_e =
          reduce([&](int64_t x, T p) { return after(x, p) && p == best ? -T(x) : -kInf; });
      found = valid && neg_e > -kInf;
      e = found ? int64_t(-neg_e) : s;
    }
    // A found expert's p equals best (the same bits).
    const T p = found ? best : valid ? prob(e) : std::numeric_limits<T>::quiet_NaN();
    prev_p = p;
    prev_e = e;
    sum = sum + p;
    if (ex.leader()) {
      ids[s] = int32_t(e);
      weights[s] = p;
    }
  }
  if (renormalize && ex.leader())
    for (int64_t s = 0; s < k; ++s) weights[s] = weights[s] / sum;
}

}  // namespace detail

// One token: logits, probs: [E]; ids, weights: [k], 1 <= k <= E <= 2^24.
template <class X, class T>
LOCKSTEP_HD void router_topk_row(const X& ex, const T* logits, int64_t E, int64_t k,
                                 bool renormalize, T* probs, int32_t* ids, T* weights) {
  const RowStats<T> st = softmax_stats<T>(ex, E, [&](int64_t e) { return logits[e]; });
  const auto prob = [&](int64_t e) { return softmax_value(logits[e], st); };
  if (E <= kRouterDimsExperts) {
    // The selection reads p_e from the lane's Dims array, which holds the value stored to probs.
    typename X::template Dims<T, kRouterDimsExperts> pv;
    ex.template for_dims<kRouterDimsExperts>(E, [&](int64_t e, int i) {
      pv[i] = prob(e);
      probs[e] = pv[i];
    });
    const auto reduce = [&](const auto& f) {
      using R = decltype(f(int64_t(0), T(0)));
      return ex.template max_dims<kRouterDimsExperts, R>(
          E, [&](int64_t e, int i) { return f(e, pv[i]); });
    };
    detail::router_select(ex, st, k, renormalize, prob, reduce, ids, weights);
    return;
  }
  ex.for_each(E, [&](int64_t e) { probs[e] = prob(e); });
  // The selection reads p_e back from probs: the lane that wrote probs[e] is the lane that reads
  // it (the executor's for_each and max give element e to the same lane), and the stored value is
  // prob(e) itself, so the read is the recomputation without its exp and division per pass.
  const auto reduce = [&](const auto& f) {
    using R = decltype(f(int64_t(0), T(0)));
    return ex.template max<R>(E, [&](int64_t e) { return f(e, probs[e]); });
  };
  detail::router_select(ex, st, k, renormalize, prob, reduce, ids, weights);
}

// Routing replay: the experts of a token are given (ids [k], chosen by another forward, e.g. the
// sampler's) and the router supplies only their weights: probs as above, weights_s = p[ids_s], or
// with renormalisation p[ids_s] / W, W = sum_s p[ids_s] in slot order 0..k-1 from 0. Each weight is
// the expression router_topk_row gives the same expert in the same slot, so ids equal to
// router_topk_row's selection give its weights bit for bit. The backward is router_topk_row_bwd
// with these ids. A token without a distribution, or with an id outside [0, E), gets NaN weights.
template <class X, class T>
LOCKSTEP_HD void router_replay_row(const X& ex, const T* logits, const int32_t* ids, int64_t E,
                                   int64_t k, bool renormalize, T* probs, T* weights) {
  const RowStats<T> st = softmax_stats<T>(ex, E, [&](int64_t e) { return logits[e]; });
  ex.for_each(E, [&](int64_t e) { probs[e] = softmax_value(logits[e], st); });
  bool ok = st.s >= T(1);  // as router_topk_row: S >= 1 whenever the row has a distribution
  for (int64_t s = 0; s < k; ++s) ok = ok && ids[s] >= 0 && ids[s] < E;
  T sum = 0;
  for (int64_t s = 0; s < k; ++s) {
    const T p = ok ? softmax_value(logits[ids[s]], st) : std::numeric_limits<T>::quiet_NaN();
    sum = sum + p;
    if (ex.leader()) weights[s] = p;
  }
  if (renormalize && ex.leader())
    for (int64_t s = 0; s < k; ++s) weights[s] = weights[s] / sum;
}

// One token: probs [E], ids / dweights [k] from the forward; dlogits [E] overwritten.
template <class X, class T>
LOCKSTEP_HD void router_topk_row_bwd(const X& ex, const T* probs, const int32_t* ids,
                                     const T* dweights, int64_t E, int64_t k, bool renormalize,
                                     T* dlogits) {
  bool ok = true;
  for (int64_t s = 0; s < k; ++s) ok = ok && ids[s] >= 0 && ids[s] < E;
  if (!ok) {
    ex.for_each(E, [&](int64_t e) { dlogits[e] = std::numeric_limits<T>::quiet_NaN(); });
    return;
  }
  T w_sum = 0, dot = 0;
  if (renormalize) {
    for (int64_t s = 0; s < k; ++s) w_sum = w_sum + probs[ids[s]];
    for (int64_t s = 0; s < k; ++s) dot = dot + dweights[s] * (probs[ids[s]] / w_sum);
  }
  const auto grad = [&](int64_t e) {
    T g = 0;
    for (int64_t s = 0; s < k; ++s)
      if (ids[s] == e) g = g + (renormalize ? (dweights[s] - dot) / w_sum : dweights[s]);
    return g;
  };
  const T d = ex.template sum<T>(E, [&](int64_t e) { return grad(e) * probs[e]; });
  ex.for_each(E, [&](int64_t e) { dlogits[e] = probs[e] * (grad(e) - d); });
}

// ---- CPU kernels (HostLanes<32> per token, tokens in parallel) ---------------------------------

// logits, probs: [tokens, experts] T, row-major; expert_ids, weights: [tokens, k], 1 <= k <= E.
template <class T>
void moe_router_topk_fwd_cpu(const T* logits, int64_t tokens, int64_t experts, int64_t k,
                             bool renormalize, T* probs, int32_t* expert_ids, T* weights);

// expert_ids: [tokens, k] given experts (in [0, experts): std::out_of_range otherwise); probs:
// [tokens, experts] and weights [tokens, k] written as router_replay_row defines them.
template <class T>
void moe_router_replay_fwd_cpu(const T* logits, const int32_t* expert_ids, int64_t tokens,
                               int64_t experts, int64_t k, bool renormalize, T* probs, T* weights);

// probs, expert_ids: forward results (ids in [0, experts): std::out_of_range otherwise); dweights:
// [tokens, k]; dlogits: [tokens, experts].
template <class T>
void moe_router_topk_bwd_cpu(const T* probs, const int32_t* expert_ids, const T* dweights,
                             int64_t tokens, int64_t experts, int64_t k, bool renormalize,
                             T* dlogits);

}  // namespace lockstep::ops
