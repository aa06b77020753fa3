// Private state of the decoder (model/decoder.h): the modules of each layer, the tensors a
// training forward keeps for the backward, and the per-layer steps shared by both executors.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/model/decoder.h"

namespace lockstep::model {

struct Layer {
  int index = 0;
  bool moe = false;
  nn::NormLinear qkv;  // input_norm + qkv
  Tensor q_norm, k_norm, g_q_norm, g_k_norm;
  nn::Linear o_proj;
  nn::NormLinear gate_up;  // dense: post_norm + gate_up
  nn::Linear down;
  Tensor post_norm, g_post_norm;  // MoE: the norm before router and experts
  nn::MoeBlock moe_block;
  // Saved by a training forward.
  Tensor q_raw, k_raw, q_rstd, k_rstd;  // before the per-head norms
  Tensor q, k, v, attn, lse;            // attention inputs (after rope, K / V rounded) and output
  Tensor mlp_in, post_rstd, mlp_h;      // MoE: input and rstd of post_norm; dense: gate_up out

  size_t saved_bytes() const;
  void clear_saved();
};

struct Decoder::Impl {
  explicit Impl(DecoderWeights w);

  const Tensor& tensor(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  void check_ids(const Tensor& ids) const;

  // y = o_proj(attention(rope(norm(q)), rope(norm(k)), v)) over packed sequences.
  Tensor attention_packed(Layer& L, const Tensor& x, const Tensor& positions, const Tensor& cu,
                          ops::AttentionKernel kernel, bool save);
  // The same with K / V appended to the cache and attention_row over it, after x += residual
  // (undefined: none) fused into the input norm (ops::add_rmsnorm).
  // positions / slots: I32 [rows] on the decoder's device, checked by the caller.
  Tensor attention_cached(Layer& L, Tensor& x, const Tensor& residual, const Tensor& positions,
                          const Tensor& slots, KvCache& cache);
  Tensor attention_backward(Layer& L, const Tensor& dy);
  // Dense SwiGLU MLP or MoE block, normalized input inside. replay / used: the MoE block's
  // routing replay input and the experts it used (nn::MoeBlock::forward); ignored by a dense layer.
  // residual (inference only; undefined: none): x += residual in place first, fused into the norm.
  Tensor mlp(Layer& L, Tensor& x, bool save, const Tensor& replay = Tensor(),
             Tensor* used = nullptr, const Tensor& residual = Tensor());
  Tensor mlp_backward(Layer& L, const Tensor& dy);
  // The final norm and the head; residual as for mlp.
  Tensor final_logits(Tensor& x, bool save, const Tensor& residual = Tensor());

  // Sets every module's GEMM order (deterministic: batch-invariant; fast: the fastest kernels).
  void set_mode(ExecMode mode);

  ModelConfig c;
  ModelPlan plan;
  DType dtype = DType::kF32;
  Device dev;                    // where the weights live: every op of the decoder runs there
  std::optional<ExecMode> mode;  // the modules' current GEMM order
  KvDtype kv = KvDtype::kBf16;   // the learner's K / V rounding (the sampler's cache dtype)
  int64_t hq = 0, hkv = 0, D = 0;
  std::map<std::string, Tensor> tensors, grads;
  Tensor embed, g_embed, final_norm, g_final_norm;
  std::vector<Layer> layers;
  nn::Linear lm_head;
  ops::RopeTable rope;
  // Saved by a training forward.
  Tensor ids, positions, cu, x_final, final_rstd;
  bool saved = false;
};

}  // namespace lockstep::model
