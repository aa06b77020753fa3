// Linear and NormLinear: y = x W^T with each GEMM (fprop, dgrad, wgrad) in the format the recipe
// resolves for the module, the three backward modes, and the straight-through estimator
// (d Q(x) / dx = identity). docs/model.md "nn modules" states what each mode saves and reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/nn/operand.h"
#include "lockstep/recipe/recipe.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::nn {

// The weight operands a Linear prepares once per weight version (the converter calls
// prepare_fprop_weight too, so the sampler reads the learner's bytes).
//   padded dims: K_p = roundup(K, k_multiple(fprop)), N_p = roundup(N, k_multiple(dgrad)).
// Every K a linear layer's GEMMs reduce over (fprop: in, dgrad: out, wgrad: tokens, or an expert's
// rows) is zero-padded to a multiple of this as well as to its formats' block size, on every
// device: the CUDA GEMM kernels step K by 32, and padding alike everywhere keeps a layer's shapes
// and bits independent of where it runs (zero products add nothing to a sum).
inline constexpr int64_t kLinearKMultiple = 32;

struct LinearDims {
  int64_t out = 0, in = 0;  // N, K
  int64_t out_padded = 0, in_padded = 0;
  static LinearDims of(int64_t out, int64_t in, const LinearSpec& spec);
};
// The fprop weight operand of W [N, K] (F32 master, or F64 with an f32 spec): W padded to
// [N_p, K_p] and made an operand by the fprop weight spec (rowwise copy; plus the columnwise copy
// when the quantized backward's dgrad weight spec is the same, so one quantize serves both).
Operand prepare_fprop_weight(const Tensor& w, const LinearSpec& spec, std::string_view name,
                             bool training);

class Linear {
 public:
  Linear() = default;
  // weight: the master [N, K] (a view: an optimizer updating it in place is seen after
  // weights_changed()); grad: [N, K] of the same dtype, where backward accumulates dW (undefined
  // for inference). rng_stream: the Philox stream of this module's stochastic rounding.
  Linear(std::string name, Tensor weight, Tensor grad, LinearSpec spec, uint32_t rng_stream = 0);
  // Inference from a prepared fprop weight operand (a policy version); no backward.
  static Linear from_operand(std::string name, Operand fprop_weight, int64_t out, int64_t in,
                             LinearSpec spec);

  // x: [T, K] F32 (F64 with f32 specs; BF16 where producer_dtype allows it) -> y [T, N] F32 (F64
  // for F64 x). save: keep the backward's operands (the mode's choice).
  Tensor forward(const Tensor& x, bool save);
  // The dtype the op producing this module's input may write it in: BF16 for an inference
  // forward (save = false) whose fprop activation operand is bf16, so that the producer's output
  // is the operand itself (the bits of the F32 output cast to bf16, without the cast's kernel);
  // nullopt (its own dtype) otherwise.
  std::optional<DType> producer_dtype(bool save) const;
  // dy: [T, N] -> dx [T, K]; adds dW into the grad tensor. Uses and drops the saved state.
  Tensor backward(const Tensor& dy);

  void weights_changed();  // the master changed: rebuild cached operands
  void set_grad_seed(uint64_t seed) { grad_seed_ = seed; }
  // The GEMMs' summation order (batch-invariant, or the fastest kernel: docs/gemm.md).
  void set_gemm_order(GemmOrder order) { order_ = order; }
  size_t saved_bytes() const;  // bytes kept for the backward now
  void clear_saved();
  const LinearSpec& spec() const { return spec_; }
  const std::string& name() const { return name_; }
  const LinearDims& dims() const { return dims_; }
  const Operand& fprop_weight();

 private:
  const Operand& dgrad_weight();

  std::string name_;
  LinearSpec spec_;
  LinearDims dims_;
  Tensor weight_, grad_;
  uint32_t stream_ = 0;
  uint64_t grad_seed_ = 0;
  GemmOrder order_ = GemmOrder::kBatchInvariant;
  bool inference_ = false;
  Operand w_fprop_, w_dgrad_;  // cached per weight version
  // Saved by forward(save = true).
  Operand x_saved_;  // the wgrad activation operand (quantized: columnwise copy)
  int64_t tokens_ = 0;
  bool has_saved_ = false;
};

// RMSNorm over the last dimension followed by a Linear (Qwen3's input_layernorm + qkv and
// post_attention_layernorm + gate_up): y = Linear(rmsnorm(x) * w_norm).
class NormLinear {
 public:
  NormLinear() = default;
  // norm_weight / norm_grad: [K]; eps: rms_norm_eps.
  NormLinear(Tensor norm_weight, Tensor norm_grad, double eps, Linear linear);
  Tensor forward(const Tensor& x, bool save);
  // An inference forward (save = false) after x += residual in place, the add fused into the norm
  // (ops::add_rmsnorm); an undefined residual is forward(x, false).
  Tensor forward_add(Tensor& x, const Tensor& residual);
  Tensor backward(const Tensor& dy);
  Linear& linear() { return linear_; }
  size_t saved_bytes() const;
  void clear_saved();

 private:
  Tensor norm_w_, norm_g_;
  double eps_ = 1e-6;
  Linear linear_;
  Tensor x_, rstd_;
};

}  // namespace lockstep::nn
