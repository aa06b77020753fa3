// median_time_us: the one event timer of the CUDA benchmarks (lockstep bench quantize / gemm) and of
// the dev/ microbenchmarks, so that every figure in bench/RESULTS.md is measured the same way.
// Only CUDA-enabled code includes this header.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "lockstep/tensor/device_buffer.h"

namespace lockstep::cuda {

// Median over `samples` of the time per call in microseconds: events on `stream` around `batch`
// back-to-back calls fn(i), after 3 warm-up calls; i counts every call (for rotating buffers).
// Back-to-back calls hide one call's launch latency behind the previous one, as in a decode loop;
// batch = 1 times a single call including its launch.
inline double median_time_us(const std::function<void(int)>& fn, int samples, cudaStream_t stream = nullptr,
                             int batch = 1) {
  for (int i = 0; i < 3; ++i) fn(i);
  cudaEvent_t e0, e1;
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e0));
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  int call = 3;
  for (int i = 0; i < samples; ++i) {
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int b = 0; b < batch; ++b) fn(call++);
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(e1, stream));
    LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(double(ms) * 1e3 / batch);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace lockstep::cuda
