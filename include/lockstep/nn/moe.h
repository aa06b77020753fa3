// The Qwen3-MoE sparse block on normalized input: softmax router (a Linear), top-k with optional
// renormalisation (ties to the lower expert), permutation of token rows by expert (tokens
// ascending within an expert, each expert padded with zero rows), FC1 (gate | up, a
// GroupedLinear), SwiGLU times the slot's router weight, FC2, and the combine
// out[t] = sum over slots in order of FC2[row(t, s)]; plus an optional shared expert with a
// sigmoid gate (out += sigmoid(x Wg^T) * shared(x)). Forward and backward.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "lockstep/nn/grouped_linear.h"
#include "lockstep/nn/linear.h"
#include "lockstep/ops/moe.h"
#include "lockstep/ops/tensor_ops.h"

namespace lockstep::nn {

struct MoeOptions {
  int64_t top_k = 2;
  bool norm_topk_prob = true;
};

struct SharedExpert {
  Linear gate_up;  // [2 Is, H]
  Linear down;     // [H, Is]
  Linear gate;     // [1, H]
};

class MoeBlock {
 public:
  MoeBlock() = default;
  MoeBlock(Linear router, GroupedLinear fc1, GroupedLinear fc2, MoeOptions opt,
           std::optional<SharedExpert> shared = std::nullopt);

  // xn: [T, H] (normalized hidden states) -> [T, H]. replay: I32 [T, k] expert ids on xn's device
  // (routing replay: these experts instead of the router's top-k, weighted by the router's own
  // probabilities of them, ops::router_replay) or undefined (top-k). expert_ids: when not null,
  // receives the I32 [T, k] experts this call used.
  Tensor forward(const Tensor& xn, bool save, const Tensor& replay = Tensor(),
                 Tensor* expert_ids = nullptr);
  Tensor backward(const Tensor& dout);
  // BF16 when every module reading xn (router, experts' FC1, shared expert) takes a bf16 operand
  // in this forward (Linear::producer_dtype), so xn can be normalized straight into bf16.
  std::optional<DType> producer_dtype(bool save) const;

  int64_t top_k() const { return opt_.top_k; }
  void weights_changed();
  void set_grad_seed(uint64_t seed);
  void set_gemm_order(GemmOrder order);
  size_t saved_bytes() const;
  void clear_saved();

  Linear& router() { return router_; }
  GroupedLinear& fc1() { return fc1_; }
  GroupedLinear& fc2() { return fc2_; }
  std::optional<SharedExpert>& shared() { return shared_; }

 private:
  Linear router_;
  GroupedLinear fc1_, fc2_;
  MoeOptions opt_;
  std::optional<SharedExpert> shared_;
  // Saved by forward(save = true).
  ops::RouterOut route_;
  ops::MoeRoute grouped_;             // the grouped row layout (padded per expert)
  Tensor prob_row_, fc1_out_;         // [R], [R, 2 Ie]
  Tensor sh_fc1_, sh_out_, sh_gate_;  // shared expert: fc1 output, its output, sigmoid gate
  bool has_saved_ = false;
};

}  // namespace lockstep::nn
