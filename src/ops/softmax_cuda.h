// CUDA kernels of the softmax family (ops/softmax.h, ops/router.h, ops/sampling.h), private to
// ops/: device pointers plus sizes, inputs validated by the entries (tensor_ops_softmax.cpp). Every
// launch is ordered on `stream` (null: the thread's current stream); no call waits on the host,
// reads device data on the host or sizes anything from device data, so a caller can capture them
// into a CUDA graph. Only CUDA builds include this header.
#pragma once

#include <cstdint>

#include "lockstep/ops/sampling.h"
#include "lockstep/tensor/device.h"

namespace lockstep::ops::cuda {

// x, y, dy, dx: [rows, n] float; log selects log_softmax. y may alias x, dx may alias dy.
void softmax_rows(const float* x, int64_t rows, int64_t n, bool log, float* y, Device device,
                  Stream stream);
void softmax_rows_bwd(const float* y, const float* dy, int64_t rows, int64_t n, bool log, float* dx,
                      Device device, Stream stream);

// logits: [tokens, vocab]; targets: [tokens] (out of range: NaN logp / NaN gradient row); logp,
// entropy, lse: [tokens]; dlogp, dentropy: [tokens] or null (zero); dlogits: [tokens, vocab].
void token_logprobs_rows(const float* logits, const int32_t* targets, int64_t tokens, int64_t vocab,
                         float* logp, float* entropy, float* lse, Device device, Stream stream);
void token_logprobs_rows_bwd(const float* logits, const int32_t* targets, const float* lse,
                             const float* entropy, const float* dlogp, const float* dentropy,
                             int64_t tokens, int64_t vocab, float* dlogits, Device device,
                             Stream stream);

// logits, probs: [tokens, experts]; expert_ids, weights, dweights: [tokens, k]; dlogits:
// [tokens, experts]. An id outside [0, experts) in the backward gives a NaN row.
void router_topk_rows(const float* logits, int64_t tokens, int64_t experts, int64_t k,
                      bool renormalize, float* probs, int32_t* expert_ids, float* weights,
                      Device device, Stream stream);
// Routing replay (ops/router.h router_replay_row): expert_ids given, probs and weights written; a
// row with an id outside [0, experts) gets NaN weights.
void router_replay_rows(const float* logits, const int32_t* expert_ids, int64_t tokens,
                        int64_t experts, int64_t k, bool renormalize, float* probs, float* weights,
                        Device device, Stream stream);
void router_topk_rows_bwd(const float* probs, const int32_t* expert_ids, const float* dweights,
                          int64_t tokens, int64_t experts, int64_t k, bool renormalize,
                          float* dlogits, Device device, Stream stream);

// logits: [rows, vocab]; streams: [rows] (uint32 bits); positions: pos32 or pos64 [rows] (the
// other null); tokens, logprobs: [rows]. cfg already checked (check_sample_config).
void sample_tokens_rows(const float* logits, int64_t rows, int64_t vocab, const int32_t* streams,
                        const int32_t* pos32, const int64_t* pos64, const ops::SampleConfig& cfg,
                        int32_t* tokens, float* logprobs, Device device, Stream stream);

}  // namespace lockstep::ops::cuda
