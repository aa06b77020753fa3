// The MoE block (nn/moe.h). Rows of the grouped buffer: expert e owns
// [offsets[e], offsets[e+1]), its tokens in ascending order, then zero padding rows up to a
// multiple of group_row_multiple (training only). Every gather / combine sum runs in slot order
// from 0, per token, so no value depends on the batch or the thread count.
#include "lockstep/nn/moe.h"

#include <fmt/format.h>

#include <numeric>

#include "lockstep/ops/moe_routing.h"
#include "lockstep/ops/op_math.h"

namespace lockstep::nn {
namespace {

template <class F>
void by_dtype(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kF64)
    f(double{});
  else
    f(float{});
}

// out [R, d]: row r = x[src[r]] (src -1: zero row).
Tensor gather_rows(const Tensor& x, const std::vector<int32_t>& src) {
  const int64_t d = x.cols(), R = int64_t(src.size());
  Tensor out(x.dtype(), {R, d});
  by_dtype(x, [&](auto z) {
    using T = decltype(z);
    const T* xp = x.ptr<T>();
    T* o = out.ptr<T>();
    for (int64_t r = 0; r < R; ++r)
      if (src[size_t(r)] >= 0) std::copy_n(xp + src[size_t(r)] * d, d, o + r * d);
  });
  return out;
}

// out [T, d]: out[t] = sum over slots s = 0..k-1 (from 0) of rows[slot_row[t k + s]].
Tensor combine_rows(const Tensor& rows, const std::vector<int64_t>& slot_row, int64_t T,
                    int64_t k) {
  const int64_t d = rows.cols();
  Tensor out(rows.dtype(), {T, d});
  by_dtype(rows, [&](auto z) {
    using T_ = decltype(z);
    const T_* rp = rows.ptr<T_>();
    T_* o = out.ptr<T_>();
    for (int64_t t = 0; t < T; ++t) {
      T_* ot = o + t * d;
      for (int64_t s = 0; s < k; ++s) {
        const T_* src = rp + slot_row[size_t(t * k + s)] * d;
        for (int64_t c = 0; c < d; ++c) ot[c] = ot[c] + src[c];
      }
    }
  });
  return out;
}

// out [R, d]: out[slot_row[t k + s]] = x[t] for every slot, padding rows zero.
Tensor scatter_rows(const Tensor& x, const std::vector<int64_t>& slot_row, int64_t R, int64_t k) {
  const int64_t d = x.cols(), T = x.rows();
  Tensor out(x.dtype(), {R, d});
  by_dtype(x, [&](auto z) {
    using T_ = decltype(z);
    const T_* xp = x.ptr<T_>();
    T_* o = out.ptr<T_>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < k; ++s)
        std::copy_n(xp + t * d, d, o + slot_row[size_t(t * k + s)] * d);
  });
  return out;
}

// y[t] = a[t] * x[t, :] per row (a: [T] gate values), a new tensor.
Tensor scale_rows(const Tensor& x, const Tensor& a) {
  Tensor out = Tensor::empty(x.dtype(), x.shape());
  const int64_t T = x.rows(), d = x.cols();
  by_dtype(x, [&](auto z) {
    using T_ = decltype(z);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < d; ++c)
        out.ptr<T_>()[t * d + c] = a.ptr<T_>()[t] * x.ptr<T_>()[t * d + c];
  });
  return out;
}

}  // namespace

MoeBlock::MoeBlock(Linear router, GroupedLinear fc1, GroupedLinear fc2, MoeOptions opt,
                   std::optional<SharedExpert> shared)
    : router_(std::move(router)),
      fc1_(std::move(fc1)),
      fc2_(std::move(fc2)),
      opt_(opt),
      shared_(std::move(shared)) {}

Tensor MoeBlock::forward(const Tensor& xn, bool save) {
  const int64_t T = xn.rows(), E = fc1_.groups(), k = opt_.top_k;
  const Tensor logits = router_.forward(xn, save);
  ops::RouterOut route = ops::router_topk(logits, k, opt_.norm_topk_prob);
  const ops::MoePermutation perm =
      ops::moe_permutation_cpu(route.expert_ids.ptr<int32_t>(), T, E, k);
  // Padded offsets: each expert's row count rounded up (the wgrad GEMMs reduce over them).
  const int64_t P =
      save ? std::lcm(group_row_multiple(fc1_.spec()), group_row_multiple(fc2_.spec())) : 1;
  std::vector<int64_t> off(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e)
    off[size_t(e + 1)] =
        off[size_t(e)] + round_up(perm.offsets[size_t(e + 1)] - perm.offsets[size_t(e)], P);
  const int64_t R = off.back();
  std::vector<int32_t> src(size_t(R), -1);
  std::vector<int64_t> slot_row(size_t(T * k));
  std::vector<int64_t> row_expert(size_t(T * k));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = perm.offsets[size_t(e)]; r < perm.offsets[size_t(e + 1)]; ++r)
      src[size_t(off[size_t(e)] + r - perm.offsets[size_t(e)])] = perm.row_token[size_t(r)];
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t r = perm.slot_row[size_t(i)];
    int64_t e = 0;
    while (perm.offsets[size_t(e + 1)] <= r) ++e;
    slot_row[size_t(i)] = off[size_t(e)] + r - perm.offsets[size_t(e)];
  }
  Tensor prob(xn.dtype(), {R});
  by_dtype(xn, [&](auto z) {
    using T_ = decltype(z);
    for (int64_t i = 0; i < T * k; ++i)
      prob.ptr<T_>()[slot_row[size_t(i)]] = route.weights.ptr<T_>()[i];
  });
  const Tensor xp = gather_rows(xn, src);
  const Tensor fc1 = fc1_.forward(xp, off, save);
  const Tensor h = ops::swiglu(fc1, prob);
  const Tensor o = fc2_.forward(h, off, save);
  Tensor out = combine_rows(o, slot_row, T, k);
  if (shared_) {
    const Tensor s1 = shared_->gate_up.forward(xn, save);
    const Tensor sh = shared_->down.forward(ops::swiglu(s1, Tensor()), save);
    Tensor g = shared_->gate.forward(xn, save);  // [T, 1]
    by_dtype(g, [&](auto z) {
      using T_ = decltype(z);
      T_* p = g.ptr<T_>();
      for (int64_t t = 0; t < T; ++t) p[t] = T_(1) / (T_(1) + ops::OpMath<T_>::exp(-p[t]));
    });
    ops::add_inplace(out, scale_rows(sh, g));
    if (save) {
      sh_fc1_ = s1;
      sh_out_ = sh;
      sh_gate_ = g;
    }
  }
  if (save) {
    route_ = std::move(route);
    offsets_ = std::move(off);
    slot_row_ = std::move(slot_row);
    prob_row_ = prob;
    fc1_out_ = fc1;
    tokens_ = T;
    has_saved_ = true;
  }
  return out;
}

Tensor MoeBlock::backward(const Tensor& dout) {
  if (!has_saved_) throw std::logic_error("moe block: backward without a saved forward");
  const int64_t T = tokens_, k = opt_.top_k, R = offsets_.back();
  const Tensor d_o = scatter_rows(dout, slot_row_, R, k);
  const Tensor dh = fc2_.backward(d_o);
  const ops::SwigluGrads sg = ops::swiglu_backward(fc1_out_, prob_row_, dh);
  const Tensor dxp = fc1_.backward(sg.dx);
  Tensor dx = combine_rows(dxp, slot_row_, T, k);
  Tensor dweights(dout.dtype(), {T, k});
  by_dtype(dout, [&](auto z) {
    using T_ = decltype(z);
    for (int64_t i = 0; i < T * k; ++i)
      dweights.ptr<T_>()[i] = sg.dp.ptr<T_>()[slot_row_[size_t(i)]];
  });
  const Tensor dlogits = ops::router_topk_backward(route_, dweights, opt_.norm_topk_prob);
  ops::add_inplace(dx, router_.backward(dlogits));
  if (shared_) {
    // out += g * sh: d sh = g * dout; dg = sum_c dout * sh (c ascending); dz = dg * g * (1 - g).
    const int64_t H = dout.cols();
    Tensor dz(dout.dtype(), {T, 1});
    by_dtype(dout, [&](auto z) {
      using T_ = decltype(z);
      const T_* d = dout.ptr<T_>();
      const T_* s = sh_out_.ptr<T_>();
      const T_* g = sh_gate_.ptr<T_>();
      for (int64_t t = 0; t < T; ++t) {
        T_ acc = 0;
        for (int64_t c = 0; c < H; ++c) acc = acc + d[t * H + c] * s[t * H + c];
        dz.ptr<T_>()[t] = acc * (g[t] * (T_(1) - g[t]));
      }
    });
    const Tensor dsh = scale_rows(dout, sh_gate_);
    const Tensor ds1 = ops::swiglu_backward(sh_fc1_, Tensor(), shared_->down.backward(dsh)).dx;
    ops::add_inplace(dx, shared_->gate_up.backward(ds1));
    ops::add_inplace(dx, shared_->gate.backward(dz));
  }
  clear_saved();
  return dx;
}

void MoeBlock::weights_changed() {
  router_.weights_changed();
  fc1_.weights_changed();
  fc2_.weights_changed();
  if (shared_) {
    shared_->gate_up.weights_changed();
    shared_->down.weights_changed();
    shared_->gate.weights_changed();
  }
}

void MoeBlock::set_grad_seed(uint64_t seed) {
  router_.set_grad_seed(seed);
  fc1_.set_grad_seed(seed);
  fc2_.set_grad_seed(seed);
  if (shared_) {
    shared_->gate_up.set_grad_seed(seed);
    shared_->down.set_grad_seed(seed);
    shared_->gate.set_grad_seed(seed);
  }
}

size_t MoeBlock::saved_bytes() const {
  size_t n = router_.saved_bytes() + fc1_.saved_bytes() + fc2_.saved_bytes();
  for (const Tensor* t : {&prob_row_, &fc1_out_, &sh_fc1_, &sh_out_, &sh_gate_, &route_.probs,
                          &route_.expert_ids, &route_.weights})
    if (t->defined()) n += t->nbytes();
  if (shared_)
    n += shared_->gate_up.saved_bytes() + shared_->down.saved_bytes() + shared_->gate.saved_bytes();
  return n;
}

void MoeBlock::clear_saved() {
  router_.clear_saved();
  fc1_.clear_saved();
  fc2_.clear_saved();
  if (shared_) {
    shared_->gate_up.clear_saved();
    shared_->down.clear_saved();
    shared_->gate.clear_saved();
  }
  route_ = ops::RouterOut{};
  offsets_.clear();
  slot_row_.clear();
  prob_row_ = fc1_out_ = sh_fc1_ = sh_out_ = sh_gate_ = Tensor();
  has_saved_ = false;
}

}  // namespace lockstep::nn
