// AdamW and global gradient-norm clipping CPU reference (ops/optim.h): elementwise update, and a
// chunked float64 sum of squares combined in chunk and tensor order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "check.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/optim.h"

namespace lockstep::ops {

template <class T>
void adamw_step_cpu(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWConfig& cfg,
                    int64_t step, T grad_scale) {
  detail::require(n >= 0 && step >= 1, "adamw: {} parameters at step {}; need step >= 1", n, step);
  detail::require(cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1 &&
                      cfg.lr >= 0 && cfg.eps > 0 && cfg.weight_decay >= 0,
                  "adamw: lr {}, betas ({}, {}), eps {}, weight_decay {}; need betas in [0, 1), "
                  "eps > 0, lr and weight_decay >= 0",
                  cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay);
  const T decay = T(1.0 - cfg.lr * cfg.weight_decay);
  const T b1 = T(cfg.beta1), b2 = T(cfg.beta2);
  const T c1 = T(1.0 - cfg.beta1), c2 = T(1.0 - cfg.beta2);
  const T step_size = T(cfg.lr / (1.0 - std::pow(cfg.beta1, double(step))));
  const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(cfg.beta2, double(step))));
  const T eps = T(cfg.eps);
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * grad_scale;
    const T p = param[i] * decay;
    const T mi = b1 * m[i] + c1 * g;
    const T vi = b2 * v[i] + c2 * (g * g);
    const T denom = OpMath<T>::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - step_size * (mi / denom);
  }
}

template <class T>
double grad_norm_cpu(std::span<const std::span<const T>> grads) {
  struct Chunk {
    const T* data;
    int64_t size;
  };
  std::vector<Chunk> chunks;
  for (const auto& g : grads)
    for (int64_t c0 = 0; c0 < int64_t(g.size()); c0 += kGradNormChunk)
      chunks.push_back({g.data() + c0, std::min<int64_t>(kGradNormChunk, int64_t(g.size()) - c0)});
  std::vector<double> partial(chunks.size());
  const int64_t nchunks = int64_t(chunks.size());
#pragma omp parallel for schedule(static) if (nchunks >= 8)
  for (int64_t c = 0; c < nchunks; ++c) {
    double acc = 0;
    for (int64_t i = 0; i < chunks[size_t(c)].size; ++i) {
      const double x = double(chunks[size_t(c)].data[i]);
      acc += x * x;
    }
    partial[size_t(c)] = acc;
  }
  double total = 0;
  size_t c = 0;
  for (const auto& g : grads) {
    double tensor_sum = 0;
    for (int64_t c0 = 0; c0 < int64_t(g.size()); c0 += kGradNormChunk) tensor_sum += partial[c++];
    total += tensor_sum;
  }
  return std::sqrt(total);
}

template <class T>
double clip_grad_norm_cpu(std::span<const std::span<T>> grads, double max_norm) {
  detail::require(max_norm > 0, "clip_grad_norm: max_norm {} must be > 0", max_norm);
  std::vector<std::span<const T>> views(grads.begin(), grads.end());
  const double norm = grad_norm_cpu<T>(views);
  const double coef = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || !(coef < 1.0)) return norm;
  const T c = T(coef);
  for (const auto& g : grads) {
    const int64_t n = int64_t(g.size());
    T* p = g.data();
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * c;
  }
  return norm;
}

template void adamw_step_cpu<float>(float*, const float*, float*, float*, int64_t,
                                    const AdamWConfig&, int64_t, float);
template void adamw_step_cpu<double>(double*, const double*, double*, double*, int64_t,
                                     const AdamWConfig&, int64_t, double);
template double grad_norm_cpu<float>(std::span<const std::span<const float>>);
template double grad_norm_cpu<double>(std::span<const std::span<const double>>);
template double clip_grad_norm_cpu<float>(std::span<const std::span<float>>, double);
template double clip_grad_norm_cpu<double>(std::span<const std::span<double>>, double);

}  // namespace lockstep::ops
