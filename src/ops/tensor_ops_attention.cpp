// Tensor-level entries of causal attention (ops/tensor_ops.h): checks, outputs on the inputs'
// device, dispatch to the kernels of ops/attention.h (rowwise and prefill).
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "attention_prefill_cpu.h"
#include "entry_util.h"
#include "lockstep/ops/attention.h"

namespace lockstep::ops {

using namespace detail;

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
  const Tensor q = cpu_operand(q_in, "attention", "q"), k = cpu_operand(k_in, "attention", "k"),
               v = cpu_operand(v_in, "attention", "v");
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
  const Tensor q = cpu_operand(q_in, op, "q"), k = cpu_operand(k_in, op, "k"), v = cpu_operand(v_in, op, "v"),
               out = cpu_operand(out_in, op, "out"), lse = cpu_operand(lse_in, op, "lse"),
               dout = cpu_operand(dout_in, op, "dout");
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

}  // namespace lockstep::ops
