// The per-layer steps of the decoder (decoder_impl.h): attention over packed sequences or over
// the KV cache, the MLP / MoE step, and their backward passes.
#include <fmt/format.h>

#include <cstring>
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
  // The sampler's KV cache holds bf16 values: the learner attends to the same values.
  ops::round_bf16_inplace(k);
  ops::round_bf16_inplace(v);
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

Tensor Decoder::Impl::attention_cached(Layer& L, const Tensor& x, const Tensor& positions_i32,
                                       std::span<const int64_t> positions,
                                       std::span<const int64_t> slots, KvCache& cache) {
  if (x.dtype() != DType::kF32)
    throw std::invalid_argument("forward_cached: the cached executor runs F32 tensors");
  const int64_t T = x.rows();
  const double eps = c.rms_norm_eps;
  const Tensor qkv = L.qkv.forward(x, false);
  std::vector<Tensor> p = ops::split_cols(qkv, {hq * D, hkv * D, hkv * D});
  Tensor q = ops::rmsnorm(p[0].view({T * hq, D}), L.q_norm, eps, nullptr).view({T, hq * D});
  Tensor k = ops::rmsnorm(p[1].view({T * hkv, D}), L.k_norm, eps, nullptr).view({T, hkv * D});
  Tensor v = p[2];
  ops::rope_inplace(q, positions_i32, hq, rope);
  ops::rope_inplace(k, positions_i32, hkv, rope);
  const int64_t W = hkv * D;
  float* kp = k.ptr<float>();
  float* vp = v.ptr<float>();
  if (cache.dtype() == KvDtype::kBf16) {
    ops::round_bf16_inplace(k);
    ops::round_bf16_inplace(v);
  }
  for (int64_t r = 0; r < T;) {
    int64_t r1 = r + 1;
    while (r1 < T && slots[size_t(r1)] == slots[size_t(r)]) ++r1;
    const int64_t s = slots[size_t(r)];
    if (cache.dtype() == KvDtype::kFp8E4M3)
      cache.round_rows(s, L.index, kp + r * W, vp + r * W, r1 - r);
    for (int64_t i = r; i < r1; ++i) {
      std::memcpy(cache.k(s, L.index) + positions[size_t(i)] * W, kp + i * W,
                  size_t(W) * sizeof(float));
      std::memcpy(cache.v(s, L.index) + positions[size_t(i)] * W, vp + i * W,
                  size_t(W) * sizeof(float));
    }
    r = r1;
  }
  Tensor o = Tensor::empty(DType::kF32, {T, hq * D});
  const float scale = float(ops::attention_scale(D));
  const float* qp = q.ptr<float>();
  float* op = o.ptr<float>();
  const int64_t rep = hq / hkv, rows = T * hq;
  int64_t work = 0;
  for (int64_t r = 0; r < T; ++r) work += (positions[size_t(r)] + 1) * hq * D;
#pragma omp parallel for schedule(dynamic, 4) if (work >= (int64_t(1) << 15) && rows > 1)
  for (int64_t rh = 0; rh < rows; ++rh) {
    const int64_t r = rh / hq, h = rh % hq, g = h / rep, s = slots[size_t(r)];
    float lse = 0;
    ops::attention_row<float>(qp + rh * D, cache.k(s, L.index) + g * D, cache.v(s, L.index) + g * D,
                              W, positions[size_t(r)] + 1, D, scale, op + rh * D, &lse);
  }
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

Tensor Decoder::Impl::mlp(Layer& L, const Tensor& x, bool save) {
  if (L.moe) {
    Tensor rstd;
    const Tensor xn = ops::rmsnorm(x, L.post_norm, c.rms_norm_eps, &rstd);
    Tensor y = L.moe_block.forward(xn, save);
    if (save) {
      L.mlp_in = x;
      L.post_rstd = rstd;
    }
    return y;
  }
  const Tensor h = L.gate_up.forward(x, save);
  const Tensor a = ops::swiglu(h, Tensor());
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
