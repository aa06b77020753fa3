// The optimizer step of the learner: AdamW on fp32 master weights, and global gradient-norm
// clipping with a fixed summation order. The per-element update and the sum-of-squares step are
// written once (LOCKSTEP_HD) and called by the CPU kernels here and by the CUDA kernels.
//
// AdamW (decoupled weight decay, as torch.optim.AdamW), scalars computed on the host in float64
// and rounded to T once (adamw_scalars): decay = 1 - lr * wd, b1, b2, c1 = 1 - b1, c2 = 1 - b2,
// step_size = lr / (1 - b1^step), bc2_sqrt = sqrt(1 - b2^step), eps, grad_scale. Per element
// (adamw_update), each step one rounded operation of T:
//   g = grad * grad_scale;  p = p * decay
//   m = b1 * m + c1 * g;    v = b2 * v + c2 * (g * g)
//   denom = sqrt(v) / bc2_sqrt + eps;  p = p - step_size * (m / denom)
// (PyTorch forms m with lerp; the two differ by rounding only.) Elementwise, so any thread count
// gives the same bits. Optionally the step also yields the amax of the updated parameter
// (CONTRACT.md section 0: max |p| with NaN ignored, +-inf as inf, the empty set 0; a non-empty set
// of only NaN gives the quiet NaN 0x7FC00000), as fp32 (an F64 parameter's amax is that of its
// values rounded to fp32), so a converter can quantize per tensor without reading the weight again.
// Max is associative and commutative, so any reduction order gives the same bits.
//
// Gradient norm: each tensor is cut into chunks of kGradNormChunk elements (a constant); a
// chunk's sum of squares is taken in float64 in ascending index order from 0 (grad_norm_add); a
// tensor's sum adds its chunk sums in chunk order from 0, the total adds tensor sums in list order
// from 0; norm = sqrt(total). Chunks run in parallel, the combination is serial, so the bits never
// depend on thread count or device.
#pragma once

#include <cstdint>
#include <span>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/op_math.h"

namespace lockstep::ops {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// The step's scalars, each rounded to T once from its float64 value.
template <class T>
struct AdamWScalars {
  T decay, b1, b2, c1, c2, step_size, bc2_sqrt, eps, grad_scale;
};
// std::invalid_argument for step < 1 or a configuration outside betas in [0, 1), eps > 0,
// lr and weight_decay >= 0.
template <class T>
AdamWScalars<T> adamw_scalars(const AdamWConfig& cfg, int64_t step, T grad_scale);

// One element: p, m, v updated in place from grad.
template <class T>
LOCKSTEP_HD void adamw_update(const AdamWScalars<T>& s, T& p, T grad, T& m, T& v) {
  const T g = grad * s.grad_scale;
  const T pd = p * s.decay;
  const T mi = s.b1 * m + s.c1 * g;
  const T vi = s.b2 * v + s.c2 * (g * g);
  const T denom = OpMath<T>::sqrt(vi) / s.bc2_sqrt + s.eps;
  m = mi;
  v = vi;
  p = pd - s.step_size * (mi / denom);
}

// The amax as an order-preserving key: 0 for NaN (ignored), else the bits of |p| in fp32 plus 1;
// the amax is the largest key over the set, read back by adamw_amax_from_key.
LOCKSTEP_HD inline uint32_t adamw_amax_key(float p) {
  return num::is_nan(p) ? 0u : (num::f32_bits(p) & 0x7FFFFFFFu) + 1u;
}
LOCKSTEP_HD inline float adamw_amax_from_key(uint32_t key, bool nonempty) {
  if (key != 0) return num::f32_from_bits(key - 1u);
  return nonempty ? num::f32_from_bits(0x7FC00000u) : 0.0f;
}

// param, grad, m, v: [n] T (param the fp32 master weights, m and v the moments, zero before step
// 1); step: the 1-based number of this update; grad_scale multiplies the gradient (a clipping
// coefficient, or 1); amax: when not null, receives [amax_domains] values, value d the amax of
// the updated param's elements [d * n / amax_domains, (d + 1) * n / amax_domains) (amax_domains
// divides n; the converter's outer domains: the whole weight, or each expert of a grouped one).
template <class T>
void adamw_step_cpu(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWConfig& cfg,
                    int64_t step, T grad_scale = T(1), float* amax = nullptr,
                    int64_t amax_domains = 1);

inline constexpr int64_t kGradNormChunk = 4096;

// One step of a chunk's sum of squares: acc + x^2 in float64 (two rounded operations).
template <class T>
LOCKSTEP_HD double grad_norm_add(double acc, T x) {
  const double d = double(x);
  return acc + d * d;
}

// The global L2 norm over a list of gradient tensors (each a flat span), in float64.
template <class T>
double grad_norm_cpu(std::span<const std::span<const T>> grads);

// torch.nn.utils.clip_grad_norm_: norm = grad_norm_cpu(grads), coef = max_norm / (norm + 1e-6);
// when coef < 1 every element becomes g * T(coef). Returns the norm before clipping; a non-finite
// norm is returned with the gradients left unchanged, so the caller can skip the step.
template <class T>
double clip_grad_norm_cpu(std::span<const std::span<T>> grads, double max_norm);

}  // namespace lockstep::ops
