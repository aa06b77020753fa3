// The harness of lockstep_test_gpu (one cross-backend test program, in the spirit of ggml's
// test-backend-ops): options and filters, per-case seeds, pass / fail accounting with a repro line,
// and the comparisons every op uses (quantized bytes exactly, values bit for bit with NaN == NaN).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gemm/qgemm_variant.h"
#include "lockstep/gemm/qgemm.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::gpu_test {

struct Options {
  std::string op, format, only, mode = "test";
  GemmVariant kernel = GemmVariant::kAuto;  // --kernel: every GEMM case runs this kernel variant
  bool reduced = false;                     // fewer shapes (compute-sanitizer runs)
  int shard = 0, shards = 1;                // --shard I/N: the cases whose name hashes to I mod N
  uint64_t seed = 0;
  int64_t rows = 16384, cols = 8192;  // --mode perf input
};
extern Options g_opt;

// The kernel variant a GEMM call reports it ran.
inline GemmVariant ran(const GemmResult& r) {
  return gemm_variant_from_name(r.variant).value_or(GemmVariant::kAuto);
}

// The op filter (--op, a comma-separated list) and format filter (--format; an empty `format`
// matches every filter).
bool want(const std::string& op, const std::string& format = "");
// The --only filter on a case name.
bool selected(const std::string& name);
// A per-case seed: the run's seed mixed with the case name (replayable with LOCKSTEP_TEST_SEED).
uint64_t case_seed(const std::string& name);
// Counts a case: err empty = passed, else failed with the message and a repro line.
void report(const std::string& name, const std::string& err);
// A case that cannot run here (a kernel this GPU or build lacks): counted apart.
void skip(const std::string& name, const std::string& why);

// Runs body unless --only filters the case out and reports its error string ("" = passed); an
// exception thrown by body is a failure naming it.
void run_case(const std::string& name, const std::function<std::string()>& body);

struct Shape {
  int64_t rows, cols;
};
// The name of a quantizer configuration in case names ("nvfp4 per_row row+col sr swz").
std::string quant_spec_name(const QuantConfig& s);
// quantize(x, s) on the CPU and on CUDA, byte for byte (check_q), over shapes x value
// distributions (normal, edge, zeros, NaN rows) x input dtypes (bf16, f32); case names start with
// prefix.
void quantize_cases(const std::string& prefix, const QuantConfig& s,
                    const std::vector<Shape>& shapes);

// ---- inputs
// --------------------------------------------------------------------------------------
enum class Dist { kNormal, kEdge, kZeros, kNanRows };
const char* dist_name(Dist d);
std::vector<float> make_values(int64_t rows, int64_t cols, Dist d, bool bf16, uint64_t seed);
// A host tensor of the values: BF16 (values already bf16 numbers) or F32.
Tensor host_tensor(const std::vector<float>& v, int64_t rows, int64_t cols, bool bf16);
Tensor to_gpu(const Tensor& t);
// Group offsets of `groups` groups of 0 .. max_rows rows (a quarter of them empty), each size
// rounded up to a multiple of `multiple`, drawn from `seed`.
std::vector<int64_t> ragged_offsets(int64_t groups, int64_t max_rows, int64_t multiple,
                                    uint64_t seed);
inline Device gpu() { return Device::cuda(0); }

// ---- comparisons
// --------------------------------------------------------------------------------- Metadata, and
// for each copy which parts exist, their shapes and bytes; "" when equal.
std::string compare_q(const QTensor& expect, const QTensor& got);
// Bytes of two tensors (any devices): shape, dtype and every bit; floats with NaN == NaN when
// nan_equal (dequantized values: GPU arithmetic and x86 give different NaN payloads).
std::string compare_t(const Tensor& expect, const Tensor& got, bool nan_equal, const char* what);

// A case of Tensor entries: cpu() once, gpu() twice with poisoned device allocations; every output
// equals the CPU's bits (NaN payloads aside), both GPU runs are identical, and the GPU runs copy
// nothing from the device to the host.
void check_outs(const std::string& name, const std::function<std::vector<Tensor>()>& cpu,
                const std::function<std::vector<Tensor>()>& gpu_fn);

// Runs cpu() and gpu() (gpu twice, outputs poisoned), requires the same refusals (QuantError /
// GemmError) and the same bytes, both runs alike.
void check_q(const std::string& name, const std::function<QTensor()>& cpu,
             const std::function<QTensor()>& gpu);

}  // namespace lockstep::gpu_test
