// CUDA kernels of softmax, log-softmax, token log-probs and the MoE router (softmax_cuda.h): the
// row functions of ops/softmax.h and ops/router.h, run by row_launch_cuda.cuh (vocabulary rows with
// 1024 lanes, router rows with a warp of 32), so every output has the bits of the CPU kernels.
//
// Bytes per row of n floats (HBM, the learner's 64K x 151936 logits: 39.8 GB per read):
//   softmax / log_softmax: read x twice (max, sum), read x once more and write y: 16 n bytes;
//   token_logprobs forward: read x twice (the max; S and U in one sum2 pass): 8 n bytes;
//   token_logprobs backward: read x, write dx: 8 n bytes (no reduction).
// Flops per element: about 25 for exp_f32 (no FMA: --fmad=false) plus 3-5 for the rest, so at
// H200 rates (33 Tflop/s fp32 non-FMA, 4 TB/s) a pass with an exp per element costs about as much
// compute as reading the element; a second read of a row comes from L2 only when the row is small.
#include <cuda_runtime.h>

#include "lockstep/ops/router.h"
#include "lockstep/ops/softmax.h"
#include "row_launch_cuda.cuh"
#include "softmax_cuda.h"

namespace lockstep::ops::cuda {

namespace {

struct SoftmaxRowsOp {
  const float* x;
  float* y;
  int64_t n;
  bool log;
  template <class X>
  __device__ void operator()(const X& ex, int64_t r) const {
    if (log)
      ops::log_softmax_row(ex, x + r * n, n, y + r * n);
    else
      ops::softmax_row(ex, x + r * n, n, y + r * n);
  }
};

struct SoftmaxRowsBwdOp {
  const float* y;
  const float* dy;
  float* dx;
  int64_t n;
  bool log;
  template <class X>
  __device__ void operator()(const X& ex, int64_t r) const {
    if (log)
      ops::log_softmax_row_bwd(ex, y + r * n, dy + r * n, n, dx + r * n);
    else
      ops::softmax_row_bwd(ex, y + r * n, dy + r * n, n, dx + r * n);
  }
};

struct TokenLogprobsOp {
  const float* logits;
  const int32_t* targets;
  float *logp, *entropy, *lse;
  int64_t vocab;
  template <class X>
  __device__ void operator()(const X& ex, int64_t t) const {
    ops::token_logprobs_row(ex, logits + t * vocab, vocab, int64_t(targets[t]), logp + t,
                            entropy + t, lse + t);
  }
};

struct TokenLogprobsBwdOp {
  const float* logits;
  const int32_t* targets;
  const float *lse, *entropy, *dlogp, *dentropy;
  float* dlogits;
  int64_t vocab;
  template <class X>
  __device__ void operator()(const X& ex, int64_t t) const {
    ops::token_logprobs_row_bwd(ex, logits + t * vocab, vocab, int64_t(targets[t]), lse[t],
                                entropy[t], dlogp ? dlogp[t] : 0.0f, dentropy ? dentropy[t] : 0.0f,
                                dlogits + t * vocab);
  }
};

struct RouterOp {
  const float* logits;
  float* probs;
  int32_t* ids;
  float* weights;
  int64_t experts, k;
  bool renormalize;
  template <class X>
  __device__ void operator()(const X& ex, int64_t t) const {
    ops::router_topk_row(ex, logits + t * experts, experts, k, renormalize, probs + t * experts,
                         ids + t * k, weights + t * k);
  }
};

struct RouterReplayOp {
  const float* logits;
  const int32_t* ids;
  float* probs;
  float* weights;
  int64_t experts, k;
  bool renormalize;
  template <class X>
  __device__ void operator()(const X& ex, int64_t t) const {
    ops::router_replay_row(ex, logits + t * experts, ids + t * k, experts, k, renormalize,
                           probs + t * experts, weights + t * k);
  }
};

struct RouterBwdOp {
  const float* probs;
  const int32_t* ids;
  const float* dweights;
  float* dlogits;
  int64_t experts, k;
  bool renormalize;
  template <class X>
  __device__ void operator()(const X& ex, int64_t t) const {
    ops::router_topk_row_bwd(ex, probs + t * experts, ids + t * k, dweights + t * k, experts, k,
                             renormalize, dlogits + t * experts);
  }
};

}  // namespace

void softmax_rows(const float* x, int64_t rows, int64_t n, bool log, float* y, Device device,
                  Stream stream) {
  rows::launch_block_rows(SoftmaxRowsOp{x, y, n, log}, rows, /*reductions=*/2, device, stream);
}

void softmax_rows_bwd(const float* y, const float* dy, int64_t rows, int64_t n, bool log, float* dx,
                      Device device, Stream stream) {
  rows::launch_block_rows(SoftmaxRowsBwdOp{y, dy, dx, n, log}, rows, /*reductions=*/1, device,
                          stream);
}

void token_logprobs_rows(const float* logits, const int32_t* targets, int64_t tokens, int64_t vocab,
                         float* logp, float* entropy, float* lse, Device device, Stream stream) {
  rows::launch_block_rows(TokenLogprobsOp{logits, targets, logp, entropy, lse, vocab}, tokens,
                          /*reductions=*/2, device, stream);
}

void token_logprobs_rows_bwd(const float* logits, const int32_t* targets, const float* lse,
                             const float* entropy, const float* dlogp, const float* dentropy,
                             int64_t tokens, int64_t vocab, float* dlogits, Device device,
                             Stream stream) {
  rows::launch_block_rows(
      TokenLogprobsBwdOp{logits, targets, lse, entropy, dlogp, dentropy, dlogits, vocab}, tokens,
      /*reductions=*/0, device, stream);
}

void router_topk_rows(const float* logits, int64_t tokens, int64_t experts, int64_t k,
                      bool renormalize, float* probs, int32_t* expert_ids, float* weights,
                      Device device, Stream stream) {
  rows::launch_warp_rows(RouterOp{logits, probs, expert_ids, weights, experts, k, renormalize},
                         tokens, device, stream);
}

void router_replay_rows(const float* logits, const int32_t* expert_ids, int64_t tokens,
                        int64_t experts, int64_t k, bool renormalize, float* probs, float* weights,
                        Device device, Stream stream) {
  rows::launch_warp_rows(
      RouterReplayOp{logits, expert_ids, probs, weights, experts, k, renormalize}, tokens, device,
      stream);
}

void router_topk_rows_bwd(const float* probs, const int32_t* expert_ids, const float* dweights,
                          int64_t tokens, int64_t experts, int64_t k, bool renormalize,
                          float* dlogits, Device device, Stream stream) {
  rows::launch_warp_rows(RouterBwdOp{probs, expert_ids, dweights, dlogits, experts, k, renormalize},
                         tokens, device, stream);
}

}  // namespace lockstep::ops::cuda
