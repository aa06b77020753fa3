// The Tensor-level op entries of ops/tensor_ops.h: argument checks (dtype, shape, device), output
// allocation, and one dispatch per op on the device (CPU kernels of ops/*.h) and the dtype
// (F32 / F64).
#include "lockstep/ops/tensor_ops.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "attention_prefill_cpu.h"
#include "lockstep/numerics/hd.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/moe_routing.h"
#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/rope.h"
#include "lockstep/ops/softmax.h"
#include "lockstep/ops/swiglu.h"

namespace lockstep::ops {
namespace {

void check(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

bool is_f64(const Tensor& t) { return t.dtype() == DType::kF64; }

// A floating operand of an op: CPU, F32 or F64, contiguous (a packed copy otherwise).
Tensor operand(const Tensor& t, std::string_view op, std::string_view name) {
  check(t.defined(), fmt::format("{}: tensor '{}' is undefined", op, name));
  require_cpu(t, op, name);
  check(t.dtype() == DType::kF32 || t.dtype() == DType::kF64,
        fmt::format("{}: tensor '{}' {} must be F32 or F64", op, name, t.describe()));
  return t.contiguous();
}

Tensor index_operand(const Tensor& t, std::string_view op, std::string_view name) {
  check(t.defined(), fmt::format("{}: tensor '{}' is undefined", op, name));
  require_cpu(t, op, name);
  check(t.dtype() == DType::kI32,
        fmt::format("{}: tensor '{}' {} must be I32", op, name, t.describe()));
  return t.contiguous();
}

void same_dtype(const Tensor& a, const Tensor& b, std::string_view op) {
  check(a.dtype() == b.dtype(),
        fmt::format("{}: dtypes differ ({} and {})", op, a.describe(), b.describe()));
}

// Calls f(T{}) with T = float or double as `t`'s dtype says.
template <class F>
decltype(auto) by_dtype(const Tensor& t, F&& f) {
  if (is_f64(t)) return f(double{});
  return f(float{});
}

int64_t rows_of(const Tensor& t, int64_t d) { return d == 0 ? 0 : t.numel() / d; }

}  // namespace

void require_cpu(const Tensor& t, std::string_view op, std::string_view name) {
  if (t.defined() && !t.is_cpu())
    throw DeviceNotSupported(fmt::format(
        "{}: tensor '{}' {} lives on {}; the CUDA engine does not implement {} yet (move it to "
        "the CPU with to())",
        op, name, t.describe(), t.device().str(), op));
}

Tensor rmsnorm(const Tensor& x_in, const Tensor& w_in, double eps, Tensor* rstd) {
  const Tensor x = operand(x_in, "rmsnorm", "x"), w = operand(w_in, "rmsnorm", "w");
  same_dtype(x, w, "rmsnorm");
  const int64_t d = w.numel();
  check(
      w.dim() == 1 && d >= 1 && x.numel() % d == 0,
      fmt::format("rmsnorm: x {} does not have rows of the weight's {} elements", x.describe(), d));
  const int64_t rows = rows_of(x, d);
  Tensor y = Tensor::empty(x.dtype(), x.shape());
  Tensor r = Tensor::empty(x.dtype(), {rows});
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    rmsnorm_fwd_cpu<T>(x.ptr<T>(), w.ptr<T>(), rows, d, T(eps), y.ptr<T>(), r.ptr<T>());
  });
  if (rstd) *rstd = r;
  return y;
}

Tensor rmsnorm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& w_in,
                        const Tensor& rstd_in, Tensor* dw) {
  const Tensor dy = operand(dy_in, "rmsnorm_backward", "dy"),
               x = operand(x_in, "rmsnorm_backward", "x"),
               w = operand(w_in, "rmsnorm_backward", "w"),
               rstd = operand(rstd_in, "rmsnorm_backward", "rstd");
  same_dtype(dy, x, "rmsnorm_backward");
  const int64_t d = w.numel(), rows = rows_of(x, d);
  check(dy.numel() == x.numel() && rstd.numel() == rows,
        fmt::format("rmsnorm_backward: dy {}, x {}, rstd {} do not match", dy.describe(),
                    x.describe(), rstd.describe()));
  Tensor dx = Tensor::empty(x.dtype(), x.shape());
  Tensor g = Tensor::empty(x.dtype(), {d});
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    rmsnorm_bwd_cpu<T>(dy.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<T>(), rows, d, dx.ptr<T>(),
                       g.ptr<T>());
  });
  if (dw) *dw = g;
  return dx;
}

RopeTable rope_table(int64_t max_pos, int64_t head_dim, double theta, DType dtype) {
  check(dtype == DType::kF32 || dtype == DType::kF64, "rope_table: dtype must be F32 or F64");
  RopeTable t{Tensor::empty(dtype, {max_pos, head_dim}), Tensor::empty(dtype, {max_pos, head_dim}),
              max_pos, head_dim};
  if (dtype == DType::kF64)
    rope_table_cpu<double>(max_pos, head_dim, theta, t.cos.ptr<double>(), t.sin.ptr<double>());
  else
    rope_table_cpu<float>(max_pos, head_dim, theta, t.cos.ptr<float>(), t.sin.ptr<float>());
  return t;
}

namespace {
void rope_apply(Tensor& x, const Tensor& positions_in, int64_t heads, const RopeTable& table,
                bool backward) {
  const char* op = backward ? "rope_backward" : "rope";
  require_cpu(x, op, "x");
  check(x.is_contiguous() && x.dtype() == table.cos.dtype(),
        fmt::format("{}: x {} must be contiguous with the table's dtype", op, x.describe()));
  const Tensor pos = index_operand(positions_in, op, "positions");
  const int64_t tokens = pos.numel();
  check(x.numel() == tokens * heads * table.head_dim,
        fmt::format("{}: x {} is not [{} tokens, {} heads, {}]", op, x.describe(), tokens, heads,
                    table.head_dim));
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    if (backward)
      rope_bwd_cpu<T>(x.ptr<T>(), pos.ptr<int32_t>(), tokens, heads, table.head_dim,
                      table.cos.ptr<T>(), table.sin.ptr<T>(), table.max_pos, x.ptr<T>());
    else
      rope_fwd_cpu<T>(x.ptr<T>(), pos.ptr<int32_t>(), tokens, heads, table.head_dim,
                      table.cos.ptr<T>(), table.sin.ptr<T>(), table.max_pos, x.ptr<T>());
  });
}
}  // namespace

void rope_inplace(Tensor& x, const Tensor& positions, int64_t heads, const RopeTable& table) {
  rope_apply(x, positions, heads, table, false);
}
void rope_backward_inplace(Tensor& dx, const Tensor& positions, int64_t heads,
                           const RopeTable& table) {
  rope_apply(dx, positions, heads, table, true);
}

double attention_scale(int64_t head_dim) { return 1.0 / std::sqrt(double(head_dim)); }

namespace {
// cu_seqlens as host int64 values, checked against the token count.
std::vector<int64_t> cu_values(const Tensor& cu_in, int64_t tokens, std::string_view op) {
  require_cpu(cu_in, op, "cu_seqlens");
  const Tensor cu = cu_in.contiguous();
  check(
      cu.dim() == 1 && cu.numel() >= 1 && (cu.dtype() == DType::kI32 || cu.dtype() == DType::kI64),
      fmt::format("{}: cu_seqlens {} must be 1-D I32 / I64 [b + 1]", op, cu.describe()));
  std::vector<int64_t> v(size_t(cu.numel()));
  for (int64_t i = 0; i < cu.numel(); ++i)
    v[size_t(i)] = cu.dtype() == DType::kI32 ? cu.ptr<int32_t>()[i] : cu.ptr<int64_t>()[i];
  check(v.front() == 0 && v.back() == tokens,
        fmt::format("{}: cu_seqlens runs from {} to {}; want 0 to the {} tokens", op, v.front(),
                    v.back(), tokens));
  return v;
}
}  // namespace

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                 const Tensor& cu_seqlens, const AttentionShape& s, AttentionKernel kernel,
                 Tensor* lse) {
  const Tensor q = operand(q_in, "attention", "q"), k = operand(k_in, "attention", "k"),
               v = operand(v_in, "attention", "v");
  same_dtype(q, k, "attention");
  same_dtype(q, v, "attention");
  const int64_t tokens = rows_of(q, s.q_heads * s.head_dim);
  check(q.numel() == tokens * s.q_heads * s.head_dim &&
            k.numel() == tokens * s.kv_heads * s.head_dim && v.numel() == k.numel(),
        fmt::format("attention: q {}, k {}, v {} do not match {} q heads, {} kv heads of {}",
                    q.describe(), k.describe(), v.describe(), s.q_heads, s.kv_heads, s.head_dim));
  const std::vector<int64_t> cu = cu_values(cu_seqlens, tokens, "attention");
  Tensor out = Tensor::empty(q.dtype(), {tokens, s.q_heads * s.head_dim});
  Tensor l = Tensor::empty(q.dtype(), {tokens, s.q_heads});
  const AttentionDims dims{s.q_heads, s.kv_heads, s.head_dim};
  by_dtype(q, [&](auto t) {
    using T = decltype(t);
    const T sc = T(attention_scale(s.head_dim));
    if (kernel == AttentionKernel::kRowwise)
      attention_fwd_cpu<T, int64_t>(q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), cu.data(),
                                    int64_t(cu.size()) - 1, dims, sc, out.ptr<T>(), l.ptr<T>());
    else
      attention_prefill_fwd_cpu<T>(q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), cu.data(),
                                   int64_t(cu.size()) - 1, dims, sc, out.ptr<T>(), l.ptr<T>());
  });
  if (lse) *lse = l;
  return out;
}

AttentionGrads attention_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                  const Tensor& out_in, const Tensor& lse_in, const Tensor& dout_in,
                                  const Tensor& cu_seqlens, const AttentionShape& s) {
  const char* op = "attention_backward";
  const Tensor q = operand(q_in, op, "q"), k = operand(k_in, op, "k"), v = operand(v_in, op, "v"),
               out = operand(out_in, op, "out"), lse = operand(lse_in, op, "lse"),
               dout = operand(dout_in, op, "dout");
  const int64_t tokens = rows_of(q, s.q_heads * s.head_dim);
  check(dout.numel() == q.numel() && out.numel() == q.numel() && lse.numel() == tokens * s.q_heads,
        fmt::format("{}: dout {}, out {}, lse {} do not match q {}", op, dout.describe(),
                    out.describe(), lse.describe(), q.describe()));
  const std::vector<int64_t> cu = cu_values(cu_seqlens, tokens, op);
  AttentionGrads g{Tensor::empty(q.dtype(), q.shape()), Tensor::empty(k.dtype(), k.shape()),
                   Tensor::empty(v.dtype(), v.shape())};
  const AttentionDims dims{s.q_heads, s.kv_heads, s.head_dim};
  by_dtype(q, [&](auto t) {
    using T = decltype(t);
    attention_bwd_cpu<T, int64_t>(q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), out.ptr<T>(), lse.ptr<T>(),
                                  dout.ptr<T>(), cu.data(), int64_t(cu.size()) - 1, dims,
                                  T(attention_scale(s.head_dim)), g.dq.ptr<T>(), g.dk.ptr<T>(),
                                  g.dv.ptr<T>());
  });
  return g;
}

Tensor swiglu(const Tensor& x_in, const Tensor& p_in) {
  const Tensor x = operand(x_in, "swiglu", "x");
  check(x.dim() == 2 && x.cols() % 2 == 0,
        fmt::format("swiglu: x {} must be [rows, 2I]", x.describe()));
  const int64_t rows = x.rows(), inter = x.cols() / 2;
  Tensor p;
  if (p_in.defined()) {
    p = operand(p_in, "swiglu", "p");
    same_dtype(x, p, "swiglu");
    check(p.numel() == rows, fmt::format("swiglu: p {} is not [{}]", p.describe(), rows));
  }
  Tensor y = Tensor::empty(x.dtype(), {rows, inter});
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    swiglu_fwd_cpu<T>(x.ptr<T>(), p.defined() ? p.ptr<T>() : nullptr, rows, inter, y.ptr<T>());
  });
  return y;
}

SwigluGrads swiglu_backward(const Tensor& x_in, const Tensor& p_in, const Tensor& dy_in) {
  const Tensor x = operand(x_in, "swiglu_backward", "x"),
               dy = operand(dy_in, "swiglu_backward", "dy");
  const int64_t rows = x.rows(), inter = x.cols() / 2;
  check(dy.numel() == rows * inter,
        fmt::format("swiglu_backward: dy {} is not [{}, {}]", dy.describe(), rows, inter));
  Tensor p = p_in.defined() ? operand(p_in, "swiglu_backward", "p") : Tensor();
  SwigluGrads g{Tensor::empty(x.dtype(), x.shape()),
                p.defined() ? Tensor::empty(x.dtype(), {rows}) : Tensor()};
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    swiglu_bwd_cpu<T>(x.ptr<T>(), p.defined() ? p.ptr<T>() : nullptr, dy.ptr<T>(), rows, inter,
                      g.dx.ptr<T>(), p.defined() ? g.dp.ptr<T>() : nullptr);
  });
  return g;
}

RouterOut router_topk(const Tensor& logits_in, int64_t k, bool renormalize) {
  const Tensor logits = operand(logits_in, "router_topk", "logits");
  check(logits.dim() == 2, fmt::format("router_topk: logits {} must be 2-D", logits.describe()));
  const int64_t tokens = logits.rows(), experts = logits.cols();
  RouterOut r{Tensor::empty(logits.dtype(), {tokens, experts}),
              Tensor::empty(DType::kI32, {tokens, k}), Tensor::empty(logits.dtype(), {tokens, k})};
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    moe_router_topk_fwd_cpu<T>(logits.ptr<T>(), tokens, experts, k, renormalize, r.probs.ptr<T>(),
                               r.expert_ids.ptr<int32_t>(), r.weights.ptr<T>());
  });
  return r;
}

Tensor router_topk_backward(const RouterOut& fwd, const Tensor& dweights_in, bool renormalize) {
  const Tensor dw = operand(dweights_in, "router_topk_backward", "dweights");
  const int64_t tokens = fwd.probs.rows(), experts = fwd.probs.cols(), k = fwd.expert_ids.cols();
  check(dw.numel() == tokens * k,
        fmt::format("router_topk_backward: dweights {} is not [{}, {}]", dw.describe(), tokens, k));
  Tensor dl = Tensor::empty(fwd.probs.dtype(), {tokens, experts});
  by_dtype(dw, [&](auto t) {
    using T = decltype(t);
    moe_router_topk_bwd_cpu<T>(fwd.probs.ptr<T>(), fwd.expert_ids.ptr<int32_t>(), dw.ptr<T>(),
                               tokens, experts, k, renormalize, dl.ptr<T>());
  });
  return dl;
}

Tensor embedding(const Tensor& table_in, const Tensor& ids_in) {
  const Tensor table = operand(table_in, "embedding", "table"),
               ids = index_operand(ids_in, "embedding", "ids");
  check(table.dim() == 2, fmt::format("embedding: table {} must be 2-D", table.describe()));
  Tensor out = Tensor::empty(table.dtype(), {ids.numel(), table.cols()});
  by_dtype(table, [&](auto t) {
    using T = decltype(t);
    embedding_fwd_cpu<T>(table.ptr<T>(), table.rows(), table.cols(), ids.ptr<int32_t>(),
                         ids.numel(), out.ptr<T>());
  });
  return out;
}

Tensor embedding_backward(const Tensor& dout_in, const Tensor& ids_in, int64_t vocab) {
  const Tensor dout = operand(dout_in, "embedding_backward", "dout"),
               ids = index_operand(ids_in, "embedding_backward", "ids");
  const int64_t d = dout.cols();
  Tensor dt = Tensor::empty(dout.dtype(), {vocab, d});
  by_dtype(dout, [&](auto t) {
    using T = decltype(t);
    embedding_bwd_cpu<T>(dout.ptr<T>(), ids.ptr<int32_t>(), ids.numel(), vocab, d, dt.ptr<T>());
  });
  return dt;
}

TokenLogprobs token_logprobs(const Tensor& logits_in, const Tensor& targets_in) {
  const Tensor logits = operand(logits_in, "token_logprobs", "logits"),
               targets = index_operand(targets_in, "token_logprobs", "targets");
  check(logits.dim() == 2 && logits.rows() == targets.numel(),
        fmt::format("token_logprobs: logits {} and targets {} disagree on tokens",
                    logits.describe(), targets.describe()));
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  TokenLogprobs r{Tensor::empty(logits.dtype(), {tokens}), Tensor::empty(logits.dtype(), {tokens}),
                  Tensor::empty(logits.dtype(), {tokens})};
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    token_logprobs_fwd_cpu<T>(logits.ptr<T>(), targets.ptr<int32_t>(), tokens, vocab,
                              r.logp.ptr<T>(), r.entropy.ptr<T>(), r.lse.ptr<T>());
  });
  return r;
}

Tensor token_logprobs_backward(const Tensor& logits_in, const Tensor& targets_in,
                               const TokenLogprobs& fwd, const Tensor& dlogp_in,
                               const Tensor& dentropy_in) {
  const char* op = "token_logprobs_backward";
  const Tensor logits = operand(logits_in, op, "logits"),
               targets = index_operand(targets_in, op, "targets");
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  const Tensor dlogp = dlogp_in.defined() ? operand(dlogp_in, op, "dlogp") : Tensor();
  const Tensor dent = dentropy_in.defined() ? operand(dentropy_in, op, "dentropy") : Tensor();
  check(
      (!dlogp.defined() || dlogp.numel() == tokens) && (!dent.defined() || dent.numel() == tokens),
      fmt::format("{}: dlogp / dentropy must have {} values", op, tokens));
  Tensor dl = Tensor::empty(logits.dtype(), {tokens, vocab});
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    token_logprobs_bwd_cpu<T>(logits.ptr<T>(), targets.ptr<int32_t>(), fwd.lse.ptr<T>(),
                              fwd.entropy.ptr<T>(), dlogp.defined() ? dlogp.ptr<T>() : nullptr,
                              dent.defined() ? dent.ptr<T>() : nullptr, tokens, vocab, dl.ptr<T>());
  });
  return dl;
}

void adamw_step(Tensor& param, const Tensor& grad_in, Tensor& m, Tensor& v, const AdamWConfig& cfg,
                int64_t step, double grad_scale) {
  const char* op = "adamw_step";
  require_cpu(param, op, "param");
  const Tensor grad = operand(grad_in, op, "grad");
  check(param.is_contiguous() && m.is_contiguous() && v.is_contiguous() &&
            grad.numel() == param.numel() && m.numel() == param.numel() &&
            v.numel() == param.numel() && grad.dtype() == param.dtype(),
        fmt::format("{}: param {}, grad {}, m {}, v {} must match", op, param.describe(),
                    grad.describe(), m.describe(), v.describe()));
  by_dtype(param, [&](auto t) {
    using T = decltype(t);
    adamw_step_cpu<T>(param.ptr<T>(), grad.ptr<T>(), m.ptr<T>(), v.ptr<T>(), param.numel(), cfg,
                      step, T(grad_scale));
  });
}

Tensor scale(const Tensor& x_in, double s) {
  const Tensor x = operand(x_in, "scale", "x");
  Tensor y = Tensor::empty(x.dtype(), x.shape());
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    const T f = T(s);
    const T* a = x.ptr<T>();
    T* b = y.ptr<T>();
    for (int64_t i = 0; i < x.numel(); ++i) b[i] = a[i] * f;
  });
  return y;
}

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = operand(a_in, "add", "a"), b = operand(b_in, "add", "b");
  check(a.numel() == b.numel() && a.dtype() == b.dtype(),
        fmt::format("add: {} + {} needs equal element counts and dtypes", a.describe(),
                    b.describe()));
  Tensor y = Tensor::empty(a.dtype(), a.shape());
  by_dtype(a, [&](auto t) {
    using T = decltype(t);
    const T* x = a.ptr<T>();
    const T* z = b.ptr<T>();
    T* o = y.ptr<T>();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 17))
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + z[i];
  });
  return y;
}

void add_inplace(Tensor& a, const Tensor& b_in) {
  require_cpu(a, "add_inplace", "a");
  const Tensor b = operand(b_in, "add_inplace", "b");
  check(a.is_contiguous() && a.numel() == b.numel() && a.dtype() == b.dtype(),
        fmt::format("add_inplace: {} += {} needs equal element counts and dtypes", a.describe(),
                    b.describe()));
  by_dtype(a, [&](auto t) {
    using T = decltype(t);
    T* x = a.ptr<T>();
    const T* y = b.ptr<T>();
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 17))
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] + y[i];
  });
}

void round_bf16_inplace(Tensor& x) {
  require_cpu(x, "round_bf16", "x");
  if (x.dtype() != DType::kF32) return;
  check(x.is_contiguous(), "round_bf16: x must be contiguous");
  float* p = x.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = num::bf16_to_f32(num::f32_to_bf16(p[i]));
}

}  // namespace lockstep::ops
