// Tensor-level entries of RMSNorm and rotary embedding (ops/tensor_ops.h): checks, outputs on the
// inputs' device, dispatch to the CPU kernels of ops/rmsnorm.h and ops/rope.h.
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/rope.h"

namespace lockstep::ops {

using namespace detail;

Tensor rmsnorm(const Tensor& x_in, const Tensor& w_in, double eps, Tensor* rstd) {
  const Tensor x = cpu_operand(x_in, "rmsnorm", "x"), w = cpu_operand(w_in, "rmsnorm", "w");
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
  const Tensor dy = cpu_operand(dy_in, "rmsnorm_backward", "dy"),
               x = cpu_operand(x_in, "rmsnorm_backward", "x"),
               w = cpu_operand(w_in, "rmsnorm_backward", "w"),
               rstd = cpu_operand(rstd_in, "rmsnorm_backward", "rstd");
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

}  // namespace lockstep::ops
