// GroupedLinear: the MoE expert GEMMs (one [N, K] weight per expert, token rows grouped by expert)
// with forward and backward in the recipe's formats, like Linear: the expert weights are quantized
// with quantize_grouped (per_group = one amax per expert, so an FC1 expert's gate and up rows share
// it), dgrad reads the weights' columnwise copies, wgrad reduces over each expert's rows (groups
// along K). Each expert's rows are padded with zero rows to row_multiple(spec) when training.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/nn/linear.h"

namespace lockstep::nn {

// Rows of each expert group are padded to a multiple of this when training (the wgrad GEMM
// reduces over them): the wgrad format's block (fp8 1x128: 128) and kLinearKMultiple.
int64_t group_row_multiple(const LinearSpec& spec);

// The fprop weight operand of a grouped W [groups * N, K] (quantize_grouped per expert), padded
// per expert to [N_p, K_p] as LinearDims says.
Operand prepare_grouped_fprop_weight(const Tensor& w, int64_t groups, const LinearSpec& spec,
                                     std::string_view name, bool training);

class GroupedLinear {
 public:
  GroupedLinear() = default;
  // weight, grad: [groups * N, K] (grad undefined for inference).
  GroupedLinear(std::string name, Tensor weight, Tensor grad, int64_t groups, LinearSpec spec,
                uint32_t rng_stream = 0);
  static GroupedLinear from_operand(std::string name, Operand fprop_weight, int64_t groups,
                                    int64_t out, int64_t in, LinearSpec spec);

  // x: [R, K] rows grouped by offsets (I64 [groups + 1], offsets[groups] = R, on x's device or
  // the host) -> y [R, N]. Device offsets are read on the host only where the recipe needs the
  // group sizes there (a training forward: columnwise copies and the wgrad GEMM loop over groups;
  // per_group activation scaling); an inference forward never waits for the device.
  Tensor forward(const Tensor& x, const Tensor& offsets, bool save);
  // As Linear::producer_dtype: BF16 for an inference forward with a bf16 fprop activation operand.
  std::optional<DType> producer_dtype(bool save) const;
  // dy: [R, N] -> dx [R, K]; adds dW into the grad tensor.
  Tensor backward(const Tensor& dy);

  void weights_changed();
  void set_grad_seed(uint64_t seed) { grad_seed_ = seed; }
  // The GEMMs' summation order (batch-invariant, or the fastest kernel: docs/gemm.md).
  void set_gemm_order(GemmOrder order) { order_ = order; }
  size_t saved_bytes() const;
  void clear_saved();
  const LinearSpec& spec() const { return spec_; }
  const LinearDims& dims() const { return dims_; }
  int64_t groups() const { return groups_; }
  const Operand& fprop_weight();

 private:
  const Operand& dgrad_weight();

  std::string name_;
  LinearSpec spec_;
  LinearDims dims_;
  int64_t groups_ = 0;
  Tensor weight_, grad_;
  uint32_t stream_ = 0;
  uint64_t grad_seed_ = 0;
  GemmOrder order_ = GemmOrder::kBatchInvariant;
  bool inference_ = false;
  Operand w_fprop_, w_dgrad_;
  Operand x_saved_;
  std::vector<int64_t> offsets_;  // host offsets of the saved forward
  Tensor offsets_t_;              // the same on the operands' device
  bool has_saved_ = false;
};

}  // namespace lockstep::nn
