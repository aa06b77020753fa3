// Shared by the GEMM parts of lockstep_test_gpu: operand pairings, device copies of held operands,
// the kernels a case runs (every applicable one, or the one --kernel forces), one device GEMM call
// with poisoned outputs, and bit comparisons.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "../gemm_operands.h"
#include "lockstep/gemm/oracle.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

using gemm_test::Held;
using gemm_test::Kind;

struct Pairing {
  Kind a, w;
};
// The pairings of the GEMM tests: w4a16, nvfp4 x nvfp4, mxfp8, fp8 (tensor / row / block), w4a8,
// bf16 x bf16, fp8 1x128 x 128x128 (chunked, power-of-two and fp32 scales).
std::vector<Pairing> pairings();
bool chunked(const Kind& k);

// A held operand's device copy (the same bytes).
struct DevHeld {
  std::optional<QTensor> q;
  Tensor t;
  GemmArg op() const { return q ? GemmArg(*q) : GemmArg(t); }
};
DevHeld dev(const Held& h);

// Whether `k` takes a case: chunked operands, rows per group, K, host offsets.
bool applicable(GemmVariant k, bool any_chunked, int64_t rows_per_group, int64_t K,
                bool host_offsets);
// The kernels a case runs: --kernel alone (empty when it cannot take the case), else every
// applicable one.
std::vector<GemmVariant> kernels_for(bool any_chunked, int64_t rows_per_group, int64_t K,
                                     bool host_offsets = true);
// Whether the reported kernel is the one asked for (a wgmma request reports one of its variants).
bool kernel_matches(GemmVariant asked, GemmVariant ran);
std::string kernel_label(GemmVariant k);

// qgemm on device operands with poisoned outputs; the result copied to the host.
GemmResult gpu_qgemm(const GemmArg& a, const GemmArg& w, GemmConfig cfg);
GemmResult gpu_grouped(const GemmArg& a, const Tensor& offsets, const GemmArg& w, GemmConfig cfg);

// Bit equality of two host F32 results (first differences printed).
bool same_bits(const Tensor& x, const Tensor& y, const std::string& what);
// |gpu - d64| <= gamma(gamma_n) |abs_terms| element-wise (docs/gemm.md section 5); "" when within.
std::string within_bound(const Tensor& got, const GemmF64& ref);
// The premise of bit-exactness in any summation order (sum |products| < 2^24 G, G the largest
// power of two dividing every product), for host operands.
bool any_order_exact(const GemmArg& a, const GemmArg& w, Copy a_copy = Copy::kRowwise,
                     Copy w_copy = Copy::kRowwise);
// Format-grid values with a narrow spread (lossless quantization, exact sums).
std::vector<float> grid_values_narrow(const Kind& k, int64_t rows, int64_t cols, uint64_t seed,
                                      int64_t amax_col);

}  // namespace lockstep::gpu_test
