// median_time_us: the one event timer of the CUDA benchmarks (lockstep bench quantize / gemm) and
// of the dev/ microbenchmarks, so that every figure in bench/RESULTS.md is measured the same way.
// Only CUDA-enabled code includes this header.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "tensor/cuda_util.h"  // LOCKSTEP_CUDA_CHECK (src/ is on the benchmarks' include path)

namespace lockstep::bench {

// Median over `samples` of the time per call in microseconds: events on `stream` around `batch`
// back-to-back calls fn(i), after 3 warm-up calls; i counts every call (for rotating buffers).
// Back-to-back calls hide one call's launch latency behind the previous one, as in a decode loop;
// batch = 1 times a single call including its launch.
namespace timing_detail {
// Time per call in microseconds of one sample: `batch` calls fn(call++) between two events.
inline double sample_us(const std::function<void(int)>& fn, int& call, cudaStream_t stream,
                        int batch, cudaEvent_t e0, cudaEvent_t e1) {
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(e0, stream));
  for (int b = 0; b < batch; ++b) fn(call++);
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(e1, stream));
  LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return double(ms) * 1e3 / batch;
}
inline double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace timing_detail

inline double median_time_us(const std::function<void(int)>& fn, int samples,
                             cudaStream_t stream = nullptr, int batch = 1) {
  for (int i = 0; i < 3; ++i) fn(i);
  cudaEvent_t e0, e1;
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e0));
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  int call = 3;
  for (int i = 0; i < samples; ++i)
    t.push_back(timing_detail::sample_us(fn, call, stream, batch, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return timing_detail::median(t);
}

// Medians of the time per call of fa and of fb, sampled alternately (a, b, a, b, ...) so that a
// drift of the GPU's clocks or power state during a long run affects both alike and their ratio
// is stable (a baseline measured once, minutes before, can differ by 10 % on the H200).
inline std::pair<double, double> median_time_pair_us(const std::function<void(int)>& fa,
                                                     const std::function<void(int)>& fb,
                                                     int samples, cudaStream_t stream = nullptr,
                                                     int batch = 1) {
  for (int i = 0; i < 3; ++i) fa(i), fb(i);
  cudaEvent_t e0, e1;
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e0));
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> ta, tb;
  int ca = 3, cb = 3;
  for (int i = 0; i < samples; ++i) {
    ta.push_back(timing_detail::sample_us(fa, ca, stream, batch, e0, e1));
    tb.push_back(timing_detail::sample_us(fb, cb, stream, batch, e0, e1));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return {timing_detail::median(ta), timing_detail::median(tb)};
}

}  // namespace lockstep::bench
