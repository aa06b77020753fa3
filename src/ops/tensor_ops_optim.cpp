// Tensor-level entries of the optimizer (ops/tensor_ops.h): the AdamW step (with the updated
// weight's amax) and the global gradient norm; checks and dispatch to the CPU kernels of
// ops/optim.h or the CUDA kernels of optim_cuda.h.
#include <fmt/format.h>

#include <vector>

#include "entry_util.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "optim_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

void adamw_step(Tensor& param, const Tensor& grad_in, Tensor& m, Tensor& v, const AdamWConfig& cfg,
                int64_t step, double grad_scale, Tensor* amax, int64_t amax_domains) {
  const char* op = "adamw_step";
  const Device dev = same_device(op, {{&param, "param"}, {&grad_in, "grad"}, {&m, "m"}, {&v, "v"}});
  operand(param, op, "param");
  operand(m, op, "m");
  operand(v, op, "v");
  const Tensor grad = operand(grad_in, op, "grad");
  check(param.is_contiguous() && m.is_contiguous() && v.is_contiguous() &&
            grad.numel() == param.numel() && m.numel() == param.numel() &&
            v.numel() == param.numel() && grad.dtype() == param.dtype() &&
            m.dtype() == param.dtype() && v.dtype() == param.dtype(),
        [&] {
          return fmt::format(
              "{}: param {}, grad {}, m {}, v {} must match (contiguous param, m, v)", op,
              param.describe(), grad.describe(), m.describe(), v.describe());
        });
  check(amax_domains >= 1 && amax_domains <= 65535 && param.numel() % amax_domains == 0, [&] {
    return fmt::format(
        "{}: {} amax domains must be in [1, 65535] and divide param {}'s {} elements", op,
        amax_domains, param.describe(), param.numel());
  });
  if (amax && !(amax->defined() && amax->dtype() == DType::kF32 && amax->numel() == amax_domains &&
                amax->device() == dev && amax->is_contiguous()))
    *amax = Tensor::empty(DType::kF32, {amax_domains}, dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(
        op, adamw_step_cuda(param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(),
                            param.numel(), adamw_scalars<float>(cfg, step, float(grad_scale)),
                            amax ? amax->ptr<float>() : nullptr, amax_domains, dev));
    return;
  }
  by_dtype(param, [&](auto t) {
    using T = decltype(t);
    adamw_step_cpu<T>(param.ptr<T>(), grad.ptr<T>(), m.ptr<T>(), v.ptr<T>(), param.numel(), cfg,
                      step, T(grad_scale), amax ? amax->ptr<float>() : nullptr, amax_domains);
  });
}

double grad_norm(std::span<const Tensor> grads) {
  const char* op = "grad_norm";
  if (grads.empty()) return 0.0;
  std::vector<Tensor> gs;
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string name = fmt::format("grads[{}]", i);
    gs.push_back(operand(grads[i], op, name));
    check(gs.back().dtype() == gs.front().dtype(), [&] {
      return fmt::format("{}: {} {} and grads[0] {} differ in dtype", op, name,
                         gs.back().describe(), gs.front().describe());
    });
    check(gs.back().device() == gs.front().device(), [&] {
      return fmt::format(
          "{}: {} {} is on {} but grads[0] is on {}; an op runs where all of its "
          "tensors live",
          op, name, gs.back().describe(), gs.back().device().str(), gs.front().device().str());
    });
  }
  const Device dev = gs.front().device();
  if (dev.is_cuda()) {
    std::vector<const float*> ptrs;
    std::vector<int64_t> sizes;
    for (const Tensor& g : gs) {
      ptrs.push_back(g.ptr<float>());
      sizes.push_back(g.numel());
    }
    LOCKSTEP_OPS_CUDA(op, return grad_norm_cuda(ptrs, sizes, dev));
  }
  return by_dtype(gs.front(), [&](auto t) {
    using T = decltype(t);
    std::vector<std::span<const T>> views;
    for (const Tensor& g : gs) views.push_back(g.data<T>());
    return grad_norm_cpu<T>(views);
  });
}

}  // namespace lockstep::ops
