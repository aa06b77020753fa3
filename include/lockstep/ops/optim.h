// The optimizer step of the learner: AdamW on fp32 master weights, and global gradient-norm
// clipping with a fixed summation order. CPU reference kernels for T in {float, double}.
//
// AdamW (decoupled weight decay, as torch.optim.AdamW), scalars computed in float64 and rounded
// to T once: decay = 1 - lr * wd, b1, b2, c1 = 1 - b1, c2 = 1 - b2,
// step_size = lr / (1 - b1^step), bc2_sqrt = sqrt(1 - b2^step). Per element, each step one
// rounded operation of T:
//   g = grad * grad_scale;  p = p * decay
//   m = b1 * m + c1 * g;    v = b2 * v + c2 * (g * g)
//   denom = sqrt(v) / bc2_sqrt + eps;  p = p - step_size * (m / denom)
// (PyTorch forms m with lerp; the two differ by rounding only.) Elementwise, so any thread count
// gives the same bits.
//
// Gradient norm: each tensor is cut into chunks of kGradNormChunk elements (a constant); a
// chunk's sum of squares is taken in float64 in ascending index order from 0; a tensor's sum adds
// its chunk sums in chunk order, the total adds tensor sums in list order; norm = sqrt(total).
// Chunks run in parallel, the combination is serial, so the bits never depend on thread count.
#pragma once

#include <cstdint>
#include <span>

namespace lockstep::ops {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// param, grad, m, v: [n] T (param the fp32 master weights, m and v the moments, zero before step
// 1); step: the 1-based number of this update; grad_scale multiplies the gradient (a clipping
// coefficient, or 1).
template <class T>
void adamw_step_cpu(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWConfig& cfg,
                    int64_t step, T grad_scale = T(1));

inline constexpr int64_t kGradNormChunk = 4096;

// The global L2 norm over a list of gradient tensors (each a flat span), in float64.
template <class T>
double grad_norm_cpu(std::span<const std::span<const T>> grads);

// torch.nn.utils.clip_grad_norm_: norm = grad_norm_cpu(grads), coef = max_norm / (norm + 1e-6);
// when coef < 1 every element becomes g * T(coef). Returns the norm before clipping; a non-finite
// norm is returned with the gradients left unchanged, so the caller can skip the step.
template <class T>
double clip_grad_norm_cpu(std::span<const std::span<T>> grads, double max_norm);

}  // namespace lockstep::ops
