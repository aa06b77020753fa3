// Tensor-level entries of causal attention (ops/tensor_ops.h): checks, outputs on the inputs'
// device, dispatch to the CPU kernels of ops/attention.h (rowwise and prefill) or the CUDA kernels
// of attention_cuda.h.
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "attention_prefill_cpu.h"
#include "entry_util.h"
#include "lockstep/ops/attention.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "../tensor/cuda_util.h"
#include "attention_cuda.h"
#endif

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
      [&] {
        return fmt::format("{}: cu_seqlens {} must be 1-D I32 / I64 [b + 1]", op, cu.describe());
      });
  std::vector<int64_t> v(size_t(cu.numel()));
  for (int64_t i = 0; i < cu.numel(); ++i)
    v[size_t(i)] = cu.dtype() == DType::kI32 ? cu.ptr<int32_t>()[i] : cu.ptr<int64_t>()[i];
  check(v.front() == 0 && v.back() == tokens, [&] {
    return fmt::format("{}: cu_seqlens runs from {} to {}; want 0 to the {} tokens", op, v.front(),
                       v.back(), tokens);
  });
  for (size_t i = 1; i < v.size(); ++i)
    check(v[i] >= v[i - 1], [&] {
      return fmt::format("{}: cu_seqlens decreases at index {} ({} -> {})", op, i, v[i - 1], v[i]);
    });
  return v;
}

void check_shape(const AttentionShape& s, std::string_view op) {
  check(s.q_heads >= 1 && s.kv_heads >= 1 && s.q_heads % s.kv_heads == 0, [&] {
    return fmt::format("{}: q_heads {} and kv_heads {}; need kv_heads >= 1 dividing q_heads", op,
                       s.q_heads, s.kv_heads);
  });
  check(s.head_dim >= 1 && s.head_dim <= kAttentionMaxHeadDim, [&] {
    return fmt::format("{}: head_dim {} outside [1, {}]", op, s.head_dim, kAttentionMaxHeadDim);
  });
}

#if defined(LOCKSTEP_HAVE_CUDA)
// cu_seqlens for a CUDA call: a device tensor on `dev` as it is (I32 / I64 [b + 1], never read
// here), or host values checked and uploaded (no host wait).
Tensor device_cu(const Tensor& cu_in, const Device& dev, int64_t tokens, std::string_view op) {
  if (cu_in.defined() && cu_in.is_cuda()) {
    check(cu_in.device() == dev, [&] {
      return fmt::format("{}: cu_seqlens {} is on {} but q is on {}", op, cu_in.describe(),
                         cu_in.device().str(), dev.str());
    });
    check(cu_in.dim() == 1 && cu_in.numel() >= 1 &&
              (cu_in.dtype() == DType::kI32 || cu_in.dtype() == DType::kI64),
          [&] {
            return fmt::format("{}: cu_seqlens {} must be 1-D I32 / I64 [b + 1]", op,
                               cu_in.describe());
          });
    check(cu_in.numel() >= 2 || tokens == 0, [&] {
      return fmt::format("{}: cu_seqlens {} holds no sequence for {} tokens", op, cu_in.describe(),
                         tokens);
    });
    return cu_in.contiguous();
  }
  const std::vector<int64_t> v = cu_values(cu_in, tokens, op);
  return cuda::upload_i64(v, dev, Stream{});
}
#endif

}  // namespace

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                 const Tensor& cu_seqlens, const AttentionShape& s, AttentionKernel kernel,
                 Tensor* lse) {
  const char* op = "attention";
  const Device dev = same_device(op, {{&q_in, "q"}, {&k_in, "k"}, {&v_in, "v"}});
  const Tensor q = operand(q_in, op, "q"), k = operand(k_in, op, "k"), v = operand(v_in, op, "v");
  same_dtype(q, k, op);
  same_dtype(q, v, op);
  check_shape(s, op);
  const int64_t tokens = rows_of(q, s.q_heads * s.head_dim);
  check(q.numel() == tokens * s.q_heads * s.head_dim &&
            k.numel() == tokens * s.kv_heads * s.head_dim && v.numel() == k.numel(),
        [&] {
          return fmt::format(
              "attention: q {}, k {}, v {} do not match {} q heads, {} kv heads of {}",
              q.describe(), k.describe(), v.describe(), s.q_heads, s.kv_heads, s.head_dim);
        });
  Tensor out = Tensor::empty(q.dtype(), {tokens, s.q_heads * s.head_dim}, dev);
  Tensor l = Tensor::empty(q.dtype(), {tokens, s.q_heads}, dev);
  const AttentionDims dims{s.q_heads, s.kv_heads, s.head_dim};
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, {
      cuda::DeviceGuard guard(dev);
      const Tensor cu = device_cu(cu_seqlens, dev, tokens, op);
      const float sc = float(attention_scale(s.head_dim));
      if (kernel == AttentionKernel::kRowwise)
        attention_cuda::rowwise_forward(q, k, v, cu, dims, sc, out, l);
      else
        attention_cuda::prefill_forward(q, k, v, cu, dims, sc, out, l);
    });
    if (lse) *lse = l;
    return out;
  }
  const std::vector<int64_t> cu = cu_values(cu_seqlens, tokens, op);
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
  const Device dev = same_device(op, {{&q_in, "q"},
                                      {&k_in, "k"},
                                      {&v_in, "v"},
                                      {&out_in, "out"},
                                      {&lse_in, "lse"},
                                      {&dout_in, "dout"}});
  const Tensor q = operand(q_in, op, "q"), k = operand(k_in, op, "k"), v = operand(v_in, op, "v"),
               out = operand(out_in, op, "out"), lse = operand(lse_in, op, "lse"),
               dout = operand(dout_in, op, "dout");
  for (const Tensor* t : {&k, &v, &out, &lse, &dout}) same_dtype(q, *t, op);
  check_shape(s, op);
  const int64_t tokens = rows_of(q, s.q_heads * s.head_dim);
  check(q.numel() == tokens * s.q_heads * s.head_dim &&
            k.numel() == tokens * s.kv_heads * s.head_dim && v.numel() == k.numel(),
        [&] {
          return fmt::format("{}: q {}, k {}, v {} do not match {} q heads, {} kv heads of {}", op,
                             q.describe(), k.describe(), v.describe(), s.q_heads, s.kv_heads,
                             s.head_dim);
        });
  check(dout.numel() == q.numel() && out.numel() == q.numel() && lse.numel() == tokens * s.q_heads,
        [&] {
          return fmt::format("{}: dout {}, out {}, lse {} do not match q {}", op, dout.describe(),
                             out.describe(), lse.describe(), q.describe());
        });
  AttentionGrads g{Tensor::empty(q.dtype(), q.shape(), dev),
                   Tensor::empty(k.dtype(), k.shape(), dev),
                   Tensor::empty(v.dtype(), v.shape(), dev)};
  const AttentionDims dims{s.q_heads, s.kv_heads, s.head_dim};
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, {
      cuda::DeviceGuard guard(dev);
      const Tensor cu = device_cu(cu_seqlens, dev, tokens, op);
      attention_cuda::backward(q, k, v, out, lse, dout, cu, dims,
                               float(attention_scale(s.head_dim)), g.dq, g.dk, g.dv);
    });
    return g;
  }
  const std::vector<int64_t> cu = cu_values(cu_seqlens, tokens, op);
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
