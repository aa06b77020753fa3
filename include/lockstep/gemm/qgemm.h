// Quantized dense and grouped GEMMs D = A W^T (A [M, K], W [N, K]) for every operand pairing
// (bf16, fp8, mxfp8, nvfp4, mixed), with the fused epilogues. docs/gemm.md states the semantics:
// the fp32 accumulation order, where block scales apply, the epilogue order and the error bound.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/gemm/operand.h"

namespace lockstep {

// Applied to D[i, j] = RN(RN(outer_a(i) * outer_w(j)) * acc[i, j]) in this order:
//   1. v = RN(alpha * D)                        (alpha = 1 is the identity, bit for bit)
//   2. v = RN(v + bias[j])                      when bias is given
//   3. swiglu: y[i, c] = RN(RN(silu(v[i, c]) * v[i, I + c]) * p_i), c < I = N / 2,
//      p_i = router_prob[i] (1 when absent), silu of numerics/transcendental.h; output [M, I]
//   4. bf16 RNE when out_bf16
//   5. row_amax[i] = amax (CONTRACT.md section 0) of output row i as written (after step 4),
//      which is the outer amax a per-row NVFP4 quantization of the output would compute.
struct GemmEpilogue {
  float alpha = 1.0f;
  std::span<const float> bias;         // [N] (grouped: [experts * N]); empty = none
  bool swiglu = false;                 // N = 2I: columns [0, I) gate, [I, 2I) up
  std::span<const float> router_prob;  // [M] (grouped: [sum_rows]); empty = 1
  bool out_bf16 = false;
  bool row_amax = false;
};

// Output [rows, cols] (cols = N, or N / 2 with swiglu).
struct GemmResult {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> d;          // fp32; with out_bf16, the widened bf16 values
  std::vector<uint16_t> d_bf16;  // bf16 bits when out_bf16, else empty
  std::vector<float> row_amax;   // [rows] when asked, else empty
};

// The fast deterministic CPU GEMM: fp32, each output element accumulated in the order of
// docs/gemm.md (sequential ascending k; FP8 blocks: per 128-chunk partial sums), blocked over
// rows and columns only and parallel with OpenMP. Row i's bits depend only on row i of A and on W.
GemmResult qgemm_cpu(const GemmOperand& a, const GemmOperand& w, const GemmEpilogue& ep = {});

// The float64 oracle: the same definition with every accumulation (k sums, chunk scaling) in
// float64, then D = fl32(RN(outer_a * outer_w) * acc64) and the same epilogue. Equal to
// qgemm_cpu bit for bit whenever the fp32 sums are exact (inputs on the format grid).
GemmResult qgemm_oracle_cpu(const GemmOperand& a, const GemmOperand& w, const GemmEpilogue& ep = {});

// Float64 values for error analysis (no epilogue): d64[i, j] = s * acc64 with s = RN(oa * ow),
// and abs_terms[i, j] = |s| * sum_c |chunk scale| * sum_k |inner_a * inner_w|, so that
// |qgemm_cpu D - d64| <= gamma(gamma_n) * abs_terms (docs/gemm.md "Error bound").
struct GemmF64 {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> d64;
  std::vector<double> abs_terms;
  int64_t gamma_n = 0;  // K for a plain sum; 128 + K / 128 with FP8 chunks
};
GemmF64 qgemm_f64_cpu(const GemmOperand& a, const GemmOperand& w);
// gamma_n = n u / (1 - n u), u = 2^-24.
double gemm_gamma(int64_t n);

// Grouped (MoE) GEMM. a: [sum_rows, K] with offsets[0] = 0 <= ... <= offsets[E] = sum_rows
// (groups may be empty); w: [E * N, K], rows [e N, (e + 1) N) are expert e (quantize it with
// quantize_grouped + per_group, or per_row, for per-expert domains). Output [sum_rows, N]
// (N / 2 with swiglu); rows of group e equal qgemm_cpu(rows of group e, expert e) bit for bit.
// group_rows (optional, E entries): the first group_rows[e] rows of group e are tokens, the rest
// padding rows whose output is +0 (and row amax 0) whatever the epilogue. Bias is [E * N].
GemmResult grouped_qgemm_cpu(const GemmOperand& a, std::span<const int64_t> offsets,
                             const GemmOperand& w, const GemmEpilogue& ep = {},
                             std::span<const int64_t> group_rows = {});

// The epilogue alone on raw D [rows, N] (row i of D is output row i; router_prob is indexed by
// prob_row0 + i). Shared by every CPU path so that they cannot disagree after the accumulation.
GemmResult apply_gemm_epilogue(std::span<const float> d, int64_t rows, int64_t n,
                               const GemmEpilogue& ep, int64_t prob_row0 = 0,
                               int64_t bias_offset = 0);

}  // namespace lockstep
