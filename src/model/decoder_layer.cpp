// The per-layer steps of the decoder (decoder_impl.h): attention over packed sequences or over
// the KV cache, the MLP / MoE step, and their backward passes.
#include <fmt/format.h>

#include <stdexcept>

#include "decoder_impl.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/layout.h"

namespace lockstep::model {

size_t Layer::saved_bytes() const {
  size_t n = qkv.saved_bytes() + o_proj.saved_bytes();
  n += moe ? moe_block.saved_bytes() : gate_up.saved_bytes() + down.saved_bytes();
  for (const Tensor* t :
       {&q_raw, &k_raw, &q_rstd, &k_rstd, &q, &k, &v, &attn, &lse, &mlp_in, &post_rstd, &mlp_h})
    if (t->defined()) n += t->nbytes();
  return n;
}

void Layer::clear_saved() {
  qkv.clear_saved();
  o_proj.clear_saved();
  if (moe) {
    moe_block.clear_saved();
  } else {
    gate_up.clear_saved();
    down.clear_saved();
  }
  q_raw = k_raw = q_rstd = k_rstd = q = k = v = attn = lse = mlp_in = post_rstd = mlp_h = Tensor();
}

void Decoder::Impl::check_ids(const Tensor& ids) const {
  if (!ids.defined() || ids.dtype() != DType::kI32 || ids.dim() != 1)
    throw std::invalid_argument(fmt::format("token ids must be a 1-D I32 tensor, got {}",
                                            ids.defined() ? ids.describe() : "nothing"));
  // Ids on a device are the caller's responsibility (a device-resident decode step never reads
  // them on the host); the embedding kernel writes NaN rows for ids outside the vocabulary.
  if (!ids.is_cpu()) return;
  const Tensor c = ids.contiguous();
  const int32_t* p = c.ptr<int32_t>();
  for (int64_t i = 0; i < c.numel(); ++i)
    if (p[i] < 0 || p[i] >= this->c.vocab_size)
      throw std::invalid_argument(
          fmt::format("token id {} at position {} is out of range for the vocabulary of {} tokens",
                      p[i], i, this->c.vocab_size));
}

Tensor Decoder::Impl::attention_packed(Layer& L, const Tensor& x, const Tensor& positions,
                                       const Tensor& cu_t, ops::AttentionKernel kernel, bool save) {
  const int64_t T = x.rows();
  const double eps = c.rms_norm_eps;
  const Tensor qkv = L.qkv.forward(x, save);
  std::vector<Tensor> p = ops::split_cols(qkv, {hq * D, hkv * D, hkv * D});
  Tensor q_rstd, k_rstd;
  Tensor q = ops::rmsnorm(p[0].view({T * hq, D}), L.q_norm, eps, &q_rstd).view({T, hq * D});
  Tensor k = ops::rmsnorm(p[1].view({T * hkv, D}), L.k_norm, eps, &k_rstd).view({T, hkv * D});
  Tensor v = p[2];
  ops::rope_inplace(q, positions, hq, rope);
  ops::rope_inplace(k, positions, hkv, rope);
  // The sampler's KV cache holds K / V rounded by its rule: the learner attends to the same values.
  ops::kv_round_inplace(k, hkv, kv);
  ops::kv_round_inplace(v, hkv, kv);
  Tensor lse;
  const Tensor o = ops::attention(q, k, v, cu_t, {hq, hkv, D}, kernel, &lse);
  const Tensor y = L.o_proj.forward(o, save);
  if (save) {
    L.q_raw = p[0];
    L.k_raw = p[1];
    L.q_rstd = q_rstd;
    L.k_rstd = k_rstd;
    L.q = q;
    L.k = k;
    L.v = v;
    L.attn = o;
    L.lse = lse;
  }
  return y;
}

Tensor Decoder::Impl::attention_cached(Layer& L, Tensor& x, const Tensor& residual,
                                       const Tensor& positions, const Tensor& slots,
                                       KvCache& cache) {
  if (x.dtype() != DType::kF32)
    throw std::invalid_argument("forward_cached: the cached executor runs F32 tensors");
  const double eps = c.rms_norm_eps;
  const Tensor qkv = L.qkv.forward_add(x, residual);
  // q / k head norms and rope, and the cache's K / V rows rounded by its rule (the learner's
  // kv_round_inplace) as they are stored, in one op (one kernel on a GPU); every row of this call
  // is stored before any row attends, so a prompt's rows see each other.
  ops::KvCacheLayer& layer = cache.layer(L.index);
  const Tensor q =
      ops::cached_qkv_prologue(qkv, L.q_norm, L.k_norm, eps, positions, rope, layer, slots, hq);
  const Tensor o = ops::attention_cached(q, layer, slots, positions, {hq, hkv, D}, nullptr,
                                         L.o_proj.producer_dtype(false));
  return L.o_proj.forward(o, false);
}

Tensor Decoder::Impl::attention_backward(Layer& L, const Tensor& dy) {
  const int64_t T = dy.rows();
  const Tensor dattn = L.o_proj.backward(dy);
  ops::AttentionGrads g =
      ops::attention_backward(L.q, L.k, L.v, L.attn, L.lse, dattn, cu, {hq, hkv, D});
  // K / V rounding is straight-through.
  ops::rope_backward_inplace(g.dq, positions, hq, rope);
  ops::rope_backward_inplace(g.dk, positions, hkv, rope);
  Tensor dqw, dkw;
  const Tensor dq = ops::rmsnorm_backward(g.dq.view({T * hq, D}), L.q_raw.view({T * hq, D}),
                                          L.q_norm, L.q_rstd, &dqw);
  const Tensor dk = ops::rmsnorm_backward(g.dk.view({T * hkv, D}), L.k_raw.view({T * hkv, D}),
                                          L.k_norm, L.k_rstd, &dkw);
  if (L.g_q_norm.defined()) ops::add_inplace(L.g_q_norm, dqw);
  if (L.g_k_norm.defined()) ops::add_inplace(L.g_k_norm, dkw);
  const Tensor dqkv =
      ops::concat_cols({dq.view({T, hq * D}), dk.view({T, hkv * D}), g.dv.view({T, hkv * D})});
  return L.qkv.backward(dqkv);
}

Tensor Decoder::Impl::mlp(Layer& L, Tensor& x, bool save, const Tensor& replay, Tensor* used,
                          const Tensor& residual) {
  if (residual.defined() && save)
    throw std::logic_error("decoder: a residual fused into a norm in a training forward");
  if (L.moe) {
    Tensor rstd;
    const Tensor xn = ops::add_rmsnorm(x, residual, L.post_norm, c.rms_norm_eps, &rstd,
                                       L.moe_block.producer_dtype(save));
    Tensor y = L.moe_block.forward(xn, save, replay, used);
    if (save) {
      L.mlp_in = x;
      L.post_rstd = rstd;
    }
    return y;
  }
  const Tensor h =
      residual.defined() ? L.gate_up.forward_add(x, residual) : L.gate_up.forward(x, save);
  const Tensor a = ops::swiglu(h, Tensor(), L.down.producer_dtype(save));
  Tensor y = L.down.forward(a, save);
  if (save) L.mlp_h = h;
  return y;
}

Tensor Decoder::Impl::mlp_backward(Layer& L, const Tensor& dy) {
  if (L.moe) {
    const Tensor dxn = L.moe_block.backward(dy);
    Tensor dw;
    Tensor dx = ops::rmsnorm_backward(dxn, L.mlp_in, L.post_norm, L.post_rstd, &dw);
    if (L.g_post_norm.defined()) ops::add_inplace(L.g_post_norm, dw);
    return dx;
  }
  const Tensor da = L.down.backward(dy);
  const Tensor dh = ops::swiglu_backward(L.mlp_h, Tensor(), da).dx;
  return L.gate_up.backward(dh);
}

}  // namespace lockstep::model
