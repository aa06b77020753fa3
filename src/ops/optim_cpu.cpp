// AdamW and global gradient-norm clipping CPU reference (ops/optim.h): the shared elementwise
// update (with the updated weight's amax), and a chunked float64 sum of squares combined in chunk
// and tensor order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "check.h"
#include "lockstep/ops/op_math.h"
#include "lockstep/ops/optim.h"

namespace lockstep::ops {

template <class T>
AdamWScalars<T> adamw_scalars(const AdamWConfig& cfg, int64_t step, T grad_scale) {
  detail::require(step >= 1, "adamw: step {}; need step >= 1 (the 1-based update number)", step);
  detail::require(cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1 &&
                      cfg.lr >= 0 && cfg.eps > 0 && cfg.weight_decay >= 0,
                  "adamw: lr {}, betas ({}, {}), eps {}, weight_decay {}; need betas in [0, 1), "
                  "eps > 0, lr and weight_decay >= 0",
                  cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay);
  AdamWScalars<T> s;
  s.decay = T(1.0 - cfg.lr * cfg.weight_decay);
  s.b1 = T(cfg.beta1);
  s.b2 = T(cfg.beta2);
  s.c1 = T(1.0 - cfg.beta1);
  s.c2 = T(1.0 - cfg.beta2);
  s.step_size = T(cfg.lr / (1.0 - std::pow(cfg.beta1, double(step))));
  s.bc2_sqrt = T(std::sqrt(1.0 - std::pow(cfg.beta2, double(step))));
  s.eps = T(cfg.eps);
  s.grad_scale = grad_scale;
  return s;
}

template <class T>
void adamw_step_cpu(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWConfig& cfg,
                    int64_t step, T grad_scale, float* amax, int64_t amax_domains) {
  detail::require(n >= 0, "adamw: {} parameters; need n >= 0", n);
  detail::require(amax_domains >= 1 && n % amax_domains == 0,
                  "adamw: {} amax domains must be >= 1 and divide the {} parameters", amax_domains,
                  n);
  const AdamWScalars<T> s = adamw_scalars(cfg, step, grad_scale);
  const int64_t per = n / amax_domains;
  for (int64_t d = 0; d < amax_domains; ++d) {
    const int64_t lo = d * per, hi = lo + per;
    uint32_t key = 0;
#pragma omp parallel for schedule(static) reduction(max : key) if (per >= detail::kParallelMinWork)
    for (int64_t i = lo; i < hi; ++i) {
      adamw_update(s, param[i], grad[i], m[i], v[i]);
      if (amax) key = std::max(key, adamw_amax_key(float(param[i])));
    }
    if (amax) amax[d] = adamw_amax_from_key(key, per > 0);
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
    for (int64_t i = 0; i < chunks[size_t(c)].size; ++i)
      acc = grad_norm_add(acc, chunks[size_t(c)].data[i]);
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

template AdamWScalars<float> adamw_scalars<float>(const AdamWConfig&, int64_t, float);
template AdamWScalars<double> adamw_scalars<double>(const AdamWConfig&, int64_t, double);
template void adamw_step_cpu<float>(float*, const float*, float*, float*, int64_t,
                                    const AdamWConfig&, int64_t, float, float*, int64_t);
template void adamw_step_cpu<double>(double*, const double*, double*, double*, int64_t,
                                     const AdamWConfig&, int64_t, double, float*, int64_t);
template double grad_norm_cpu<float>(std::span<const std::span<const float>>);
template double grad_norm_cpu<double>(std::span<const std::span<const double>>);
template double clip_grad_norm_cpu<float>(std::span<const std::span<float>>, double);
template double clip_grad_norm_cpu<double>(std::span<const std::span<double>>, double);

}  // namespace lockstep::ops
