// `lockstep bench quantize`: the bytes every quantizer must move per second, on the CPU (a small
// shape, so it runs anywhere) and on CUDA (a >= 256 MB bf16 input, with the ratio to a device copy
// measured in the same run and, for the passes that must read the input twice, the ceiling that
// second read leaves). Part of the lockstep_bench library, not of liblockstep.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/quant/qtensor.h"

namespace lockstep::bench {

// Bytes of every part of q (a part both copies share, as the FP8 per-tensor scale_inv or the NVFP4
// amax, counted once): what a quantizer writes.
inline double qtensor_bytes(const QTensor& q) {
  std::vector<const void*> seen;
  double b = 0;
  for (const QData* d : {&q.rowwise, &q.colwise})
    for (const Tensor* t : {&d->data, &d->block_scale, &d->amax, &d->scale_inv}) {
      if (!t->defined()) continue;
      bool dup = false;
      for (const void* p : seen) dup = dup || p == t->raw();
      if (!dup) b += double(t->nbytes()), seen.push_back(t->raw());
    }
  return b;
}

struct QuantBenchRow {
  std::string name;  // "nvfp4 per_row (per-token)"
  double us = 0;     // median time per call
  double bytes = 0;  // bytes that must move: input read once + every output written once
  double gbps = 0;   // bytes / time
  double ratio = 0;  // gbps / device copy bandwidth (CUDA); 0 on the CPU
  // Two-read passes (an amax over the whole tensor or column before any code can be written):
  // the best ratio to copy they can reach, (R + W) / (2R + W) with R input and W output bytes;
  // 1 for one-read passes.
  double ceiling = 1;
  double target = 0;  // target of ratio / ceiling (0: none)
  bool two_read() const { return ceiling < 1; }
  double of_ceiling() const { return ceiling > 0 ? ratio / ceiling : 0; }
};

// rows x cols fp32 normal values on the host; filter: substring of the row names.
std::vector<QuantBenchRow> bench_quantize_cpu(int64_t rows, int64_t cols,
                                              const std::string& filter);

// rows x cols bf16 (pseudo-normal, generated on the device); CUDA builds only (throws otherwise).
std::vector<QuantBenchRow> bench_quantize_cuda(int64_t rows, int64_t cols,
                                               const std::string& filter, int iters = 20);

// The table `lockstep bench quantize` prints (the same for both devices).
std::string format_quant_bench(const std::vector<QuantBenchRow>& rows);

}  // namespace lockstep::bench
