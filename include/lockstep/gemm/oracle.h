// Verification tools for GEMM kernels (tests and kernel engineers): the float64 oracle of the
// qgemm definition and the analytic error bound of the fp32 path (docs/gemm.md "Error bound").
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/gemm/qgemm.h"

namespace lockstep {

// Float64 values for error analysis (no epilogue): d64[i, j] = s * acc64 with s = RN(oa * ow),
// and abs_terms[i, j] = |s| * sum_c |chunk scale| * sum_k |inner_a * inner_w|, so that
// |qgemm D - d64| <= gamma(gamma_n) * abs_terms for the CPU path.
struct GemmF64 {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> d64;
  std::vector<double> abs_terms;
  int64_t gamma_n = 0;  // K for a plain sum; 128 + K / 128 with FP8 chunks
};
GemmF64 qgemm_f64(const GemmArg& a, const GemmArg& w, Copy a_copy = Copy::kRowwise,
                  Copy w_copy = Copy::kRowwise);

// The same definition with every accumulation in float64, then D = fl32(RN(outer_a * outer_w) *
// acc64) and the epilogue of cfg: equal to the CPU qgemm bit for bit whenever the fp32 sums are
// exact (inputs on the format grid). Host operands, F32 output.
GemmResult qgemm_oracle(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg = {});

// gamma_n = n u / (1 - n u), u = 2^-24.
double gemm_gamma(int64_t n);

}  // namespace lockstep
