// Tensor-level entry of the AdamW step (ops/tensor_ops.h): checks and dispatch to the kernels of
// ops/optim.h.
#include <fmt/format.h>

#include "entry_util.h"

namespace lockstep::ops {

using namespace detail;

void adamw_step(Tensor& param, const Tensor& grad_in, Tensor& m, Tensor& v, const AdamWConfig& cfg,
                int64_t step, double grad_scale) {
  const char* op = "adamw_step";
  require_cpu(param, op, "param");
  const Tensor grad = cpu_operand(grad_in, op, "grad");
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

}  // namespace lockstep::ops
