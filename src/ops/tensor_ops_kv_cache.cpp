// Tensor-level entries of the KV cache (ops/tensor_ops.h, rule in ops/kv_cache.h): the layer
// tensors, the learner's in-place rounding, the sampler's cache writes and attention over the
// cache, dispatched to kv_cache_cpu.cpp or the CUDA kernels of attention_cuda.h.
#include <fmt/format.h>

#include <vector>

#include "entry_util.h"
#include "lockstep/ops/kv_cache.h"
#include "lockstep/ops/layout.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "../tensor/cuda_util.h"
#include "attention_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

namespace {

const char* kv_dtype_name(KvDtype d) { return d == KvDtype::kBf16 ? "bf16" : "fp8"; }

// The layer's tensors checked against each other; its raw view.
KvCacheView layer_view(const KvCacheLayer& L, std::string_view op) {
  check(L.k.defined() && L.v.defined() && L.k.dim() == 4 && L.v.shape() == L.k.shape(), [&] {
    return fmt::format("{}: cache k {} and v {} must be [slots, max_pos, Hkv, D]", op,
                       L.k.defined() ? L.k.describe() : "undefined",
                       L.v.defined() ? L.v.describe() : "undefined");
  });
  const DType want = L.dtype == KvDtype::kBf16 ? DType::kBF16 : DType::kU8;
  check(L.k.dtype() == want && L.v.dtype() == want && L.k.is_contiguous() && L.v.is_contiguous(),
        [&] {
          return fmt::format("{}: a {} cache holds contiguous {} codes; got k {}, v {}", op,
                             kv_dtype_name(L.dtype), lockstep::dtype_name(want), L.k.describe(),
                             L.v.describe());
        });
  check(L.v.device() == L.k.device(),
        [&] { return fmt::format("{}: cache k and v on different devices", op); });
  check(L.k.size(3) >= 1 && L.k.size(3) <= kAttentionMaxHeadDim, [&] {
    return fmt::format("{}: head_dim {} outside [1, {}]", op, L.k.size(3), kAttentionMaxHeadDim);
  });
  KvCacheView c;
  c.k = const_cast<void*>(L.k.raw());
  c.v = const_cast<void*>(L.v.raw());
  c.slots = L.k.size(0), c.max_pos = L.k.size(1), c.kv_heads = L.k.size(2),
  c.head_dim = L.k.size(3);
  c.dtype = L.dtype;
  if (L.dtype == KvDtype::kFp8E4M3) {
    const std::vector<int64_t> ss{c.slots, c.max_pos, c.kv_heads};
    for (const Tensor* t : {&L.k_scale, &L.v_scale})
      check(t->defined() && t->dtype() == DType::kF32 && t->shape() == ss && t->is_contiguous() &&
                t->device() == L.k.device(),
            [&] {
              return fmt::format(
                  "{}: an fp8 cache needs F32 scales [{}, {}, {}] beside its codes; got {}", op,
                  c.slots, c.max_pos, c.kv_heads, t->defined() ? t->describe() : "undefined");
            });
    c.k_scale = const_cast<float*>(L.k_scale.ptr<float>());
    c.v_scale = const_cast<float*>(L.v_scale.ptr<float>());
  }
  return c;
}

// Index tensor (slots / positions) of `rows` entries on the cache's device.
Tensor index_tensor(const Tensor& t, int64_t rows, const Device& dev, std::string_view op,
                    std::string_view name) {
  check(t.defined() && t.dim() == 1 && t.numel() == rows &&
            (t.dtype() == DType::kI32 || t.dtype() == DType::kI64),
        [&] {
          return fmt::format("{}: {} {} must be I32 / I64 [{}]", op, name,
                             t.defined() ? t.describe() : "undefined", rows);
        });
  check(t.device() == dev, [&] {
    return fmt::format("{}: {} {} is on {} but the cache is on {}", op, name, t.describe(),
                       t.device().str(), dev.str());
  });
  return t.contiguous();
}

// Host index values, each checked to lie in [0, limit).
std::vector<int64_t> host_indices(const Tensor& t, int64_t limit, std::string_view op,
                                  std::string_view name) {
  std::vector<int64_t> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[size_t(i)] = t.dtype() == DType::kI32 ? t.ptr<int32_t>()[i] : t.ptr<int64_t>()[i];
    check(v[size_t(i)] >= 0 && v[size_t(i)] < limit, [&] {
      return fmt::format("{}: {}[{}] = {} is outside [0, {})", op, name, i, v[size_t(i)], limit);
    });
  }
  return v;
}

}  // namespace

KvCacheLayer kv_cache_layer(int64_t slots, int64_t max_pos, int64_t kv_heads, int64_t head_dim,
                            KvDtype dtype, Device device) {
  check(slots >= 1 && max_pos >= 1 && kv_heads >= 1 && head_dim >= 1 &&
            head_dim <= kAttentionMaxHeadDim,
        [&] {
          return fmt::format(
              "kv_cache_layer: slots {}, max_pos {}, kv_heads {}, head_dim {}: need all >= 1 "
              "and head_dim <= {}",
              slots, max_pos, kv_heads, head_dim, kAttentionMaxHeadDim);
        });
  KvCacheLayer L;
  L.dtype = dtype;
  const DType codes = dtype == KvDtype::kBf16 ? DType::kBF16 : DType::kU8;
  L.k = Tensor(codes, {slots, max_pos, kv_heads, head_dim}, device);
  L.v = Tensor(codes, {slots, max_pos, kv_heads, head_dim}, device);
  if (dtype == KvDtype::kFp8E4M3) {
    L.k_scale = Tensor(DType::kF32, {slots, max_pos, kv_heads}, device);
    L.v_scale = Tensor(DType::kF32, {slots, max_pos, kv_heads}, device);
  }
  return L;
}

void kv_round_inplace(Tensor& x, int64_t kv_heads, KvDtype dtype) {
  const char* op = "kv_round";
  check(x.defined(), [&] { return fmt::format("{}: tensor 'x' is undefined", op); });
  if (x.dtype() == DType::kF64) return;  // gradient checks run unrounded values
  check(x.dtype() == DType::kF32 && x.is_contiguous() && kv_heads >= 1 && x.dim() >= 1 &&
            x.numel() % kv_heads == 0,
        [&] {
          return fmt::format("{}: x {} must be contiguous F32 [tokens, Hkv * D] with Hkv = {}", op,
                             x.describe(), kv_heads);
        });
  const int64_t rows = x.dim() == 1 ? 1 : x.size(0), width = rows == 0 ? 0 : x.numel() / rows;
  check(rows == 0 || width % kv_heads == 0, [&] {
    return fmt::format("{}: x {} rows of {} values do not split into {} kv heads", op, x.describe(),
                       width, kv_heads);
  });
  const int64_t D = width / kv_heads;
  if (x.numel() == 0) return;
  if (x.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, {
      cuda::DeviceGuard guard(x.device());
      attention_cuda::kv_round(x, kv_heads, D, dtype);
    });
    return;
  }
  kv_round_cpu(x.ptr<float>(), rows, kv_heads, D, dtype);
}

void kv_cache_write(KvCacheLayer& layer, const Tensor& k_in, const Tensor& v_in,
                    const Tensor& slots_in, const Tensor& positions_in) {
  const char* op = "kv_cache_write";
  const KvCacheView c = layer_view(layer, op);
  const Device dev = layer.k.device();
  const int64_t W = c.kv_heads * c.head_dim;
  check(k_in.defined() && v_in.defined(),
        [&] { return fmt::format("{}: k_rows / v_rows undefined", op); });
  const int64_t rows = k_in.numel() / W;
  for (const Tensor* t : {&k_in, &v_in})
    check(t->dtype() == DType::kF32 && t->numel() == rows * W && t->device() == dev, [&] {
      return fmt::format("{}: rows {} must be F32 [rows, {}] on {}", op, t->describe(), W,
                         dev.str());
    });
  const Tensor k = k_in.contiguous(), v = v_in.contiguous();
  const Tensor slots = index_tensor(slots_in, rows, dev, op, "slots");
  const Tensor positions = index_tensor(positions_in, rows, dev, op, "positions");
  if (rows == 0) return;
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, {
      cuda::DeviceGuard guard(dev);
      attention_cuda::kv_cache_write(c, k, v, slots, positions);
    });
    return;
  }
  const std::vector<int64_t> s = host_indices(slots, c.slots, op, "slots");
  const std::vector<int64_t> p = host_indices(positions, c.max_pos, op, "positions");
  kv_cache_write_cpu(c, k.ptr<float>(), v.ptr<float>(), s.data(), p.data(), rows);
}

Tensor cached_qkv_prologue(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                           double eps, const Tensor& positions_in, const RopeTable& rope,
                           KvCacheLayer& layer, const Tensor& slots_in, int64_t q_heads) {
  const char* op = "cached_qkv_prologue";
  const KvCacheView c = layer_view(layer, op);
  const Device dev = layer.k.device();
  const int64_t hkv = c.kv_heads, D = c.head_dim;
  check(q_heads >= 1 && q_heads % hkv == 0, [&] {
    return fmt::format("{}: {} q heads do not group over the cache's {} kv heads", op, q_heads,
                       hkv);
  });
  const int64_t W = (q_heads + 2 * hkv) * D;
  check(qkv.defined() && qkv.dtype() == DType::kF32 && qkv.dim() == 2 && qkv.size(1) == W, [&] {
    return fmt::format("{}: qkv {} must be F32 [tokens, {}] ({} q + 2 x {} kv heads of {})", op,
                       qkv.defined() ? qkv.describe() : "undefined", W, q_heads, hkv, D);
  });
  const int64_t T = qkv.size(0);
  if (!dev.is_cuda()) {
    // The specification: the four entries in order.
    std::vector<Tensor> p = split_cols(qkv, {q_heads * D, hkv * D, hkv * D});
    Tensor q = rmsnorm(p[0].view({T * q_heads, D}), q_norm, eps, nullptr).view({T, q_heads * D});
    Tensor k = rmsnorm(p[1].view({T * hkv, D}), k_norm, eps, nullptr).view({T, hkv * D});
    rope_inplace(q, positions_in, q_heads, rope);
    rope_inplace(k, positions_in, hkv, rope);
    kv_cache_write(layer, k, p[2].contiguous(), slots_in, positions_in);
    return q;
  }
  const Device on = same_device(op, {{&qkv, "qkv"},
                                     {&q_norm, "q_norm"},
                                     {&k_norm, "k_norm"},
                                     {&positions_in, "positions"},
                                     {&slots_in, "slots"},
                                     {&rope.cos, "rope.cos"},
                                     {&rope.sin, "rope.sin"}});
  check(on == dev, [&] {
    return fmt::format("{}: the tensors are on {} but the cache is on {}", op, on.str(), dev.str());
  });
  for (const Tensor* w : {&q_norm, &k_norm})
    check(w->defined() && w->dtype() == DType::kF32 && w->dim() == 1 && w->numel() == D, [&] {
      return fmt::format("{}: norm weight {} must be F32 [{}]", op,
                         w->defined() ? w->describe() : "undefined", D);
    });
  check(rope.head_dim == D && D % 2 == 0 && rope.cos.dtype() == DType::kF32 &&
            rope.sin.dtype() == DType::kF32,
        [&] {
          return fmt::format(
              "{}: the rope table ({}, head_dim {}) must be F32 with the cache's head_dim {} "
              "(even)",
              op, rope.cos.describe(), rope.head_dim, D);
        });
  const Tensor positions = index_operand(positions_in, op, "positions");
  check(positions.numel() == T,
        [&] { return fmt::format("{}: positions {} for {} tokens", op, positions.describe(), T); });
  const Tensor slots = index_tensor(slots_in, T, dev, op, "slots");
  const Tensor x = qkv.contiguous(), qw = q_norm.contiguous(), kw = k_norm.contiguous();
  Tensor q = Tensor::empty(DType::kF32, {T, q_heads * D}, dev);
  if (T == 0) return q;
  LOCKSTEP_OPS_CUDA(op, {
    cuda::DeviceGuard guard(dev);
    attention_cuda::cached_qkv_prologue(c, x, qw, kw, float(eps), positions, slots, rope.cos,
                                        rope.sin, rope.max_pos, q_heads, q);
  });
  return q;
}

Tensor attention_cached(const Tensor& q_in, const KvCacheLayer& layer, const Tensor& slots_in,
                        const Tensor& positions_in, const AttentionShape& s, Tensor* lse,
                        std::optional<DType> out_dtype) {
  const char* op = "attention_cached";
  const KvCacheView c = layer_view(layer, op);
  const Device dev = layer.k.device();
  check(s.kv_heads == c.kv_heads && s.head_dim == c.head_dim && s.q_heads >= 1 &&
            s.q_heads % s.kv_heads == 0,
        [&] {
          return fmt::format("{}: shape ({} q heads, {} kv heads of {}) does not fit the cache {}",
                             op, s.q_heads, s.kv_heads, s.head_dim, layer.k.describe());
        });
  check(q_in.defined() && q_in.dtype() == DType::kF32 && q_in.device() == dev &&
            q_in.numel() % (s.q_heads * s.head_dim) == 0,
        [&] {
          return fmt::format("{}: q {} must be F32 [rows, {}] on {}", op,
                             q_in.defined() ? q_in.describe() : "undefined", s.q_heads * s.head_dim,
                             dev.str());
        });
  const Tensor q = q_in.contiguous();
  const int64_t rows = q.numel() / (s.q_heads * s.head_dim);
  const Tensor slots = index_tensor(slots_in, rows, dev, op, "slots");
  const Tensor positions = index_tensor(positions_in, rows, dev, op, "positions");
  const DType yt = output_dtype(q, out_dtype, op);
  Tensor out = Tensor::empty(dev.is_cuda() ? yt : DType::kF32, {rows, s.q_heads * s.head_dim}, dev);
  Tensor l = lse ? Tensor::empty(DType::kF32, {rows, s.q_heads}, dev) : Tensor();
  const float scale = float(attention_scale(s.head_dim));
  if (rows > 0 && dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, {
      cuda::DeviceGuard guard(dev);
      attention_cuda::attention_cached(q, c, slots, positions, s.q_heads, scale, out,
                                       lse ? &l : nullptr);
    });
  } else if (rows > 0) {
    const std::vector<int64_t> sl = host_indices(slots, c.slots, op, "slots");
    const std::vector<int64_t> ps = host_indices(positions, c.max_pos, op, "positions");
    attention_cached_cpu(q.ptr<float>(), c, sl.data(), ps.data(), rows, s.q_heads, scale,
                         out.ptr<float>(), lse ? l.ptr<float>() : nullptr);
  }
  if (lse) *lse = l;
  return out.dtype() == yt ? out : cast(out, yt);
}

}  // namespace lockstep::ops
