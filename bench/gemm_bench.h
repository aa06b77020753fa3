// `lockstep bench gemm`: the CUDA GEMMs' bandwidth (decode, MoE decode) and TFLOP/s (dense,
// grouped) against cuBLAS bf16 and a device copy measured in the same run. Part of the
// lockstep_bench library; CUDA builds only.
#pragma once

#include <string>
#include <vector>

namespace lockstep::bench {

struct GemmBenchRow {
  std::string section;        // "decode", "moe-decode", "small-m", "dense", "grouped"
  std::string name;           // "nvfp4 w4a16 14336x4096 M=1"
  double us = 0;              // median time per call
  double bytes = 0;           // packed weight bytes (data + scales) that must be read
  double gbps = 0;            // bytes / time
  double ratio_copy = 0;      // gbps / device copy bandwidth (decode); 0 when not applicable
  double tflops = 0;          // 2 M N K / time
  double baseline_us = 0;     // cuBLAS bf16 (or per-expert loop; small-m: the kernel named in
                              // the row) on the same shape, same run
  double ratio_baseline = 0;  // baseline_us / us (> 1: faster than bf16)
  double target = 0;          // target for the ratio that matters (0: none)
  bool target_is_copy = false;
};
struct GemmBenchResult {
  std::string gpu;
  double copy_gbps = 0;  // device-to-device copy, (read + write) bytes / time
  bool have_cublas = false;
  std::vector<GemmBenchRow> rows;
};
// The device's ceilings measured now: a 1 GiB device-to-device copy ((read + write) bytes / time)
// and cuBLAS bf16 on 8192^3 (2 M N K / time; 0 when cuBLAS is missing). Throws without CUDA.
struct DeviceRates {
  double copy_gbps = 0;
  double bf16_tflops = 0;
};
DeviceRates measure_device_rates(int iters = 10);

// filter: substring of section or name; quick: smaller shapes (smoke run). Throws without CUDA.
GemmBenchResult bench_gemm_cuda(const std::string& filter = "", bool quick = false, int iters = 20);

}  // namespace lockstep::bench
