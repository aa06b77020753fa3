// Tensor-level entries of RMSNorm and rotary embedding (ops/tensor_ops.h): checks, outputs on the
// inputs' device, dispatch to the CPU kernels of ops/rmsnorm.h and ops/rope.h or the CUDA kernels
// of norm_cuda.h.
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/rope.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "norm_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

namespace {

// rmsnorm, after x += res when res is defined (x then written in place).
Tensor rmsnorm_entry(const char* op, const Tensor& x_in, const Tensor& res_in, const Tensor& w_in,
                     double eps, Tensor* rstd, std::optional<DType> out) {
  const bool fused = res_in.defined();
  // same_device skips an undefined residual.
  const Device dev = same_device(op, {{&x_in, "x"}, {&w_in, "w"}, {&res_in, "residual"}});
  const Tensor x = operand(x_in, op, "x"), w = operand(w_in, op, "w");
  same_dtype(x, w, op);
  const int64_t d = w.numel();
  check(w.dim() == 1 && d >= 1 && x.numel() % d == 0, [&] {
    return fmt::format("{}: x {} does not have rows of the weight's {} elements", op, x.describe(),
                       d);
  });
  Tensor res;
  if (fused) {
    inplace_operand(x_in, op, "x");
    res = operand(res_in, op, "residual");
    same_dtype(x, res, op);
    check(res.numel() == x.numel() && (x.numel() == 0 || res.raw() != x.raw()), [&] {
      return fmt::format("{}: the residual {} must have x's {} elements and its own storage", op,
                         res.describe(), x.numel());
    });
  }
  const DType yt = output_dtype(x, out, op);
  const int64_t rows = rows_of(x, d);
  Tensor r = Tensor::empty(x.dtype(), {rows}, dev);
  if (rstd) *rstd = r;
  if (dev.is_cuda()) {
    Tensor y = Tensor::empty(yt, x.shape(), dev);
    [[maybe_unused]] const bool bf16 = yt == DType::kBF16;  // read by the CUDA call only
    // The kernel writes x only with a residual, where x is the caller's contiguous tensor.
    LOCKSTEP_OPS_CUDA(
        op,
        rmsnorm_fwd_cuda(const_cast<float*>(x.ptr<float>()), fused ? res.ptr<float>() : nullptr,
                         w.ptr<float>(), rows, d, float(eps), bf16 ? nullptr : y.ptr<float>(),
                         bf16 ? static_cast<uint16_t*>(y.raw()) : nullptr, r.ptr<float>(), dev));
    return y;
  }
  if (fused) {
    Tensor xw = x;
    add_inplace(xw, res);
  }
  Tensor y = Tensor::empty(x.dtype(), x.shape(), dev);
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    rmsnorm_fwd_cpu<T>(x.ptr<T>(), w.ptr<T>(), rows, d, T(eps), y.ptr<T>(), r.ptr<T>());
  });
  return yt == y.dtype() ? y : cast(y, yt);
}

}  // namespace

Tensor rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor* rstd,
               std::optional<DType> out) {
  return rmsnorm_entry("rmsnorm", x, Tensor(), w, eps, rstd, out);
}

Tensor add_rmsnorm(Tensor& x, const Tensor& residual, const Tensor& w, double eps, Tensor* rstd,
                   std::optional<DType> out) {
  if (!residual.defined()) return rmsnorm(x, w, eps, rstd, out);
  return rmsnorm_entry("add_rmsnorm", x, residual, w, eps, rstd, out);
}

Tensor rmsnorm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& w_in,
                        const Tensor& rstd_in, Tensor* dw) {
  const char* op = "rmsnorm_backward";
  const Device dev =
      same_device(op, {{&dy_in, "dy"}, {&x_in, "x"}, {&w_in, "w"}, {&rstd_in, "rstd"}});
  const Tensor dy = operand(dy_in, op, "dy"), x = operand(x_in, op, "x"),
               w = operand(w_in, op, "w"), rstd = operand(rstd_in, op, "rstd");
  same_dtype(dy, x, op);
  same_dtype(w, x, op);
  same_dtype(rstd, x, op);
  const int64_t d = w.numel(), rows = rows_of(x, d);
  check(d >= 1 && x.numel() % d == 0 && dy.numel() == x.numel() && rstd.numel() == rows, [&] {
    return fmt::format("{}: dy {}, x {}, w {}, rstd {} do not match", op, dy.describe(),
                       x.describe(), w.describe(), rstd.describe());
  });
  Tensor dx = Tensor::empty(x.dtype(), x.shape(), dev);
  Tensor g = Tensor::empty(x.dtype(), {d}, dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(
        op, rmsnorm_bwd_cuda(dy.ptr<float>(), x.ptr<float>(), w.ptr<float>(), rstd.ptr<float>(),
                             rows, d, dx.ptr<float>(), g.ptr<float>(), dev));
  } else {
    by_dtype(x, [&](auto t) {
      using T = decltype(t);
      rmsnorm_bwd_cpu<T>(dy.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<T>(), rows, d, dx.ptr<T>(),
                         g.ptr<T>());
    });
  }
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

RopeTable RopeTable::to(Device device, Stream stream) const {
  if (device.is_cuda())
    check(cos.dtype() == DType::kF32, [&] {
      return fmt::format("rope table {} to {}: a CUDA table is F32 (build it with DType::kF32)",
                         cos.describe(), device.str());
    });
  return RopeTable{cos.to(device, stream), sin.to(device, stream), max_pos, head_dim};
}

namespace {
void rope_apply(Tensor& x, const Tensor& positions_in, int64_t heads, const RopeTable& table,
                bool backward) {
  const char* op = backward ? "rope_backward" : "rope";
  const Device dev = same_device(op, {{&x, "x"},
                                      {&positions_in, "positions"},
                                      {&table.cos, "table.cos"},
                                      {&table.sin, "table.sin"}});
  check(x.defined() && x.is_contiguous() && x.dtype() == table.cos.dtype() &&
            table.sin.dtype() == table.cos.dtype(),
        [&] {
          return fmt::format("{}: x {} must be contiguous with the table's dtype ({})", op,
                             x.defined() ? x.describe() : "undefined", table.cos.describe());
        });
  operand(x, op, "x");  // (F32 / F64; F64 only on the CPU)
  const Tensor pos = index_operand(positions_in, op, "positions");
  const int64_t tokens = pos.numel();
  check(heads >= 1 && table.head_dim >= 2 && table.head_dim % 2 == 0 &&
            x.numel() == tokens * heads * table.head_dim,
        [&] {
          return fmt::format("{}: x {} is not [{} tokens, {} heads, {}]", op, x.describe(), tokens,
                             heads, table.head_dim);
        });
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, rope_cuda(x.ptr<float>(), pos.ptr<int32_t>(), tokens, heads,
                                    table.head_dim, table.cos.ptr<float>(), table.sin.ptr<float>(),
                                    table.max_pos, backward, dev));
    return;
  }
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

}  // namespace lockstep::ops
