// MoE router CPU kernels (ops/router.h): the router row functions over HostLanes<32>, tokens in
// parallel.
#include <stdexcept>

#include "check.h"
#include "lockstep/ops/router.h"

namespace lockstep::ops {

namespace {

void check_router(const char* what, int64_t tokens, int64_t experts, int64_t k) {
  detail::require(tokens >= 0 && experts >= 1 && k >= 1 && k <= experts && experts <= (1 << 24),
                  "{}: logits [{}, {}] with top-k {}; need 1 <= experts <= 2^24 and "
                  "1 <= k <= experts",
                  what, tokens, experts, k);
}

bool router_parallel(int64_t work) { return work >= detail::kParallelMinWork; }

void check_router_ids(const char* what, const int32_t* expert_ids, int64_t n, int64_t experts) {
  for (int64_t i = 0; i < n; ++i)
    if (expert_ids[i] < 0 || expert_ids[i] >= experts)
      throw std::out_of_range(
          fmt::format("{}: expert_ids[{}] = {} outside [0, {})", what, i, expert_ids[i], experts));
}

}  // namespace

template <class T>
void moe_router_topk_fwd_cpu(const T* logits, int64_t tokens, int64_t experts, int64_t k,
                             bool renormalize, T* probs, int32_t* expert_ids, T* weights) {
  check_router("moe router", tokens, experts, k);
#pragma omp parallel for schedule(static) if (router_parallel(tokens * experts * (2 * k + 8)))
  for (int64_t t = 0; t < tokens; ++t)
    router_topk_row(HostRouterLanes{}, logits + t * experts, experts, k, renormalize,
                    probs + t * experts, expert_ids + t * k, weights + t * k);
}

template <class T>
void moe_router_replay_fwd_cpu(const T* logits, const int32_t* expert_ids, int64_t tokens,
                               int64_t experts, int64_t k, bool renormalize, T* probs, T* weights) {
  check_router("moe router replay", tokens, experts, k);
  check_router_ids("moe router replay", expert_ids, tokens * k, experts);
#pragma omp parallel for schedule(static) if (router_parallel(tokens * experts * (k + 8)))
  for (int64_t t = 0; t < tokens; ++t)
    router_replay_row(HostRouterLanes{}, logits + t * experts, expert_ids + t * k, experts, k,
                      renormalize, probs + t * experts, weights + t * k);
}

template <class T>
void moe_router_topk_bwd_cpu(const T* probs, const int32_t* expert_ids, const T* dweights,
                             int64_t tokens, int64_t experts, int64_t k, bool renormalize,
                             T* dlogits) {
  check_router("moe router backward", tokens, experts, k);
  check_router_ids("moe router backward", expert_ids, tokens * k, experts);
#pragma omp parallel for schedule(static) if (router_parallel(tokens * experts * (k + 8)))
  for (int64_t t = 0; t < tokens; ++t)
    router_topk_row_bwd(HostRouterLanes{}, probs + t * experts, expert_ids + t * k,
                        dweights + t * k, experts, k, renormalize, dlogits + t * experts);
}

#define LOCKSTEP_ROUTER_INSTANTIATE(T)                                                            \
  template void moe_router_topk_fwd_cpu<T>(const T*, int64_t, int64_t, int64_t, bool, T*,         \
                                           int32_t*, T*);                                         \
  template void moe_router_replay_fwd_cpu<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                             bool, T*, T*);                                       \
  template void moe_router_topk_bwd_cpu<T>(const T*, const int32_t*, const T*, int64_t, int64_t,  \
                                           int64_t, bool, T*);
LOCKSTEP_ROUTER_INSTANTIATE(float)
LOCKSTEP_ROUTER_INSTANTIATE(double)
#undef LOCKSTEP_ROUTER_INSTANTIATE

}  // namespace lockstep::ops
