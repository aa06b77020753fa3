// A GEMM weight operand decoded and packed once for the CPU kernels, for weights that many calls
// multiply (a policy version in the sampler, a weight version in the learner): qgemm_packed and
// grouped_qgemm_packed give exactly the bits of qgemm / grouped_qgemm with the operand itself,
// without decoding and packing W on every call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "lockstep/gemm/qgemm.h"

namespace lockstep {

namespace gemm {
struct PackedWeightData;
}

class PackedWeight {
 public:
  PackedWeight() = default;
  bool defined() const { return data_ != nullptr; }
  int64_t groups() const;
  int64_t rows() const;  // N of one group
  int64_t cols() const;  // K

 private:
  friend PackedWeight pack_weight(const GemmArg& w, int64_t groups);
  friend const gemm::PackedWeightData& packed_data(const PackedWeight& w);
  std::shared_ptr<const gemm::PackedWeightData> data_;
};

// The rowwise copy of W [groups * N, K] (a CPU operand: quantized, BF16 or F32), packed per group
// of N rows. Throws GemmError for operands the CPU path cannot read (F64, another device).
PackedWeight pack_weight(const GemmArg& w, int64_t groups = 1);
const gemm::PackedWeightData& packed_data(const PackedWeight& w);

// D = A W^T with the identity epilogue and F32 output (A rowwise), = qgemm(a, w) bit for bit.
GemmResult qgemm_packed(const GemmArg& a, const PackedWeight& w);
// Groups along M: rows offsets[e]..offsets[e+1] of A times group e of W, = grouped_qgemm(a,
// offsets, w) bit for bit.
GemmResult grouped_qgemm_packed(const GemmArg& a, std::span<const int64_t> offsets,
                                const PackedWeight& w);

}  // namespace lockstep
