// Shared pieces of the attention GPU tests (test_gpu_ops_attention*.cpp): packed batches, input
// generators and the float64 error bounds of the tensor-core paths (docs/ops.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/tensor/tensor.h"
#include "test_gpu.h"

namespace lockstep::gpu_test::attention_test {

struct Packed {
  std::vector<int64_t> lengths, cu;  // cu [b + 1]
  int64_t hq = 0, hkv = 0, D = 0, T = 0;
  Packed(std::vector<int64_t> lens, int64_t hq_, int64_t hkv_, int64_t d);
  std::string name() const;  // "4/2x64 [1,33,0]"
  Tensor cu_host() const;    // I64 on the host
  Tensor cu_i32() const;     // I32 on the host (to_gpu for a device copy)
};

struct Inputs {
  Tensor q, k, v;       // host F32 [T, Hq D], [T, Hkv D]
  bool q_exact = true;  // q values are bf16 numbers
  bool kv_exact = true;
};

// Bit-exact cases: values of make_values (normal with row scales 1e-3 .. 1e3, edge, zeros).
Inputs raw_inputs(const Packed& p, Dist d, uint64_t seed);

// Bounded cases: kBf16 (uniform [-1, 1], all bf16 numbers), kUniform (q not rounded), kPeaked
// (each query a multiple of one earlier key of its sequence: a softmax close to one-hot; a leaked
// future key or a lost tile shows at once), kZeroQ (q = 0: uniform weights).
enum class Kind { kBf16, kUniform, kPeaked, kZeroQ };
const char* kind_name(Kind k);
Inputs bounded_inputs(const Packed& p, Kind kind, uint64_t seed);

// GPU out / lse against the CPU's within the forward bound, rows (token, head) with
// (token * Hq + head) % row_step == 0 (all rows when 1); "" when within.
std::string check_forward_bound(const Packed& p, const Inputs& in, const Tensor& out_cpu,
                                const Tensor& lse_cpu, const Tensor& out_gpu, const Tensor& lse_gpu,
                                int64_t row_step);

// attention_backward on the CPU and twice on CUDA (poisoned) from the CPU forward's out / lse and
// a random dout; GPU vs CPU within the backward bound (every element), GPU runs byte for byte.
std::string backward_case(const Packed& p, Kind kind, bool device_cu, uint64_t seed);

}  // namespace lockstep::gpu_test::attention_test
