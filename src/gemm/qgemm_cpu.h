// The CPU GEMM path, private to the gemm layer: the fp32 core over decoded operands, the float64
// path of dense F64 operands, and the shared epilogue that every CPU path applies after the
// accumulation (so they cannot disagree after it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/gemm/oracle.h"
#include "lockstep/gemm/qgemm.h"
#include "operand.h"

namespace lockstep::gemm {

// W's inner values transposed into panels [P][K][16] (zero lanes past N), and for chunked W its
// chunk scales [P][C][16], so the innermost loop runs over 16 independent output elements.
struct PackedW {
  int64_t n = 0, k = 0, panels = 0, chunks = 0;
  std::vector<float> inner;
  std::vector<float> chunk_scale;
};
PackedW pack_w(const DecodedOperand& w);
// Raw D of rows [a0, a0 + M) of A (M = -1: all rows) into d [M, w.n]: the fp32 core.
void gemm_core(const DecodedOperand& a, const DecodedOperand& wdec, const PackedW& w, float* d,
               int64_t a0, int64_t M);
// Raw D [a.rows, w.rows] = RN(RN(outer_a * outer_w) * acc), acc in the docs/gemm.md order.
std::vector<float> gemm_decoded(const DecodedOperand& a, const DecodedOperand& w);
// Raw D of rows [a0, a0 + rows) of A written to d [rows, w.rows] (no copy of A's rows).
void gemm_decoded_rows_into(const DecodedOperand& a, int64_t a0, int64_t rows,
                            const DecodedOperand& w, float* d);
// Plain float64 D [M, N] = A [M, K] W [N, K]^T, ascending k.
std::vector<double> gemm_f64(const double* a, const double* w, int64_t M, int64_t N, int64_t K);
// The values of an optional F32 tensor on the host (empty when undefined).
std::vector<float> host_floats(const Tensor& t);

struct EpilogueArgs {
  float alpha = 1.0f;
  std::span<const float> bias;  // indexed by bias_offset + j
  bool swiglu = false;
  std::span<const float> router_prob;  // indexed by prob_row0 + i
  bool out_bf16 = false;
  bool row_amax = false;
  int64_t prob_row0 = 0;
  int64_t bias_offset = 0;
};
struct EpilogueOut {
  int64_t cols = 0;
  std::vector<float> d;  // fp32 (bf16-rounded values with out_bf16)
  std::vector<float> row_amax;
};
// The epilogue of qgemm.h on raw D [rows, n].
EpilogueOut apply_epilogue(std::span<const float> d, int64_t rows, int64_t n,
                           const EpilogueArgs& ep);
void check_epilogue(const GemmEpilogue& ep, int64_t M, int64_t N, int64_t bias_n,
                    const std::string& what);
GemmResult make_result(EpilogueOut&& e, int64_t rows, DType out_dtype, bool row_amax);

GemmResult qgemm_cpu(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg);
GemmResult grouped_qgemm_cpu(const GemmArg& a, std::span<const int64_t> offsets, const GemmArg& w,
                             const GemmConfig& cfg);

}  // namespace lockstep::gemm
