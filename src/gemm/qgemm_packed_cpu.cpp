// Packed GEMM weights (gemm/packed.h): the decode and panel packing of qgemm_cpu done once, then
// the same fp32 core, so the bits equal the unpacked calls.
#include <fmt/format.h>

#include "lockstep/gemm/packed.h"
#include "qgemm_cpu.h"
#include "qgemm_variant.h"

namespace lockstep {
namespace gemm {
struct PackedWeightData {
  int64_t groups = 0, n = 0, k = 0;
  std::vector<DecodedOperand> decoded;  // outer scales per group (inner values dropped)
  std::vector<PackedW> packed;
};
}  // namespace gemm

int64_t PackedWeight::groups() const { return data_ ? data_->groups : 0; }
int64_t PackedWeight::rows() const { return data_ ? data_->n : 0; }
int64_t PackedWeight::cols() const { return data_ ? data_->k : 0; }

const gemm::PackedWeightData& packed_data(const PackedWeight& w) {
  if (!w.data_) throw GemmError("packed weight: undefined (pack_weight first)");
  return *w.data_;
}

PackedWeight pack_weight(const GemmArg& w, int64_t groups) {
  const std::string what = fmt::format("pack_weight W {}", w.describe(Copy::kRowwise, "w"));
  if (!w.device().is_cpu()) throw GemmError(what + ": the packed path runs on the CPU");
  if (!w.quantized() && w.t().dtype() == DType::kF64)
    throw GemmError(what + ": F64 operands take the float64 path, not a packed weight");
  const int64_t rows = w.rows(Copy::kRowwise);
  if (groups < 1 || rows % groups != 0)
    throw GemmError(fmt::format("{}: {} rows are not {} groups", what, rows, groups));
  auto d = std::make_shared<gemm::PackedWeightData>();
  d->groups = groups;
  d->n = rows / groups;
  d->k = w.cols(Copy::kRowwise);
  for (int64_t e = 0; e < groups; ++e) {
    gemm::DecodedOperand wd = gemm::decode_operand(w, Copy::kRowwise, e * d->n, d->n, "w");
    d->packed.push_back(gemm::pack_w(wd));
    wd.inner.clear();
    wd.inner.shrink_to_fit();
    d->decoded.push_back(std::move(wd));
  }
  PackedWeight p;
  p.data_ = std::move(d);
  return p;
}

GemmResult qgemm_packed(const GemmArg& a, const PackedWeight& w) {
  return grouped_qgemm_packed(a, std::vector<int64_t>{0, a.rows(Copy::kRowwise)}, w);
}

GemmResult grouped_qgemm_packed(const GemmArg& a, std::span<const int64_t> offsets,
                                const PackedWeight& w) {
  const gemm::PackedWeightData& p = packed_data(w);
  const std::string what = fmt::format("qgemm_packed A {}", a.describe(Copy::kRowwise, "a"));
  const int64_t rows = a.rows(Copy::kRowwise);
  if (!a.device().is_cpu()) throw GemmError(what + ": the packed path runs on the CPU");
  if (a.cols(Copy::kRowwise) != p.k)
    throw GemmError(
        fmt::format("{}: K mismatch (A has {} columns, W {})", what, a.cols(Copy::kRowwise), p.k));
  if (int64_t(offsets.size()) != p.groups + 1 || offsets.front() != 0 || offsets.back() != rows)
    throw GemmError(fmt::format("{}: {} offsets for {} weight groups over {} rows", what,
                                offsets.size(), p.groups, rows));
  const gemm::DecodedOperand ad = gemm::decode_operand(a, Copy::kRowwise, 0, rows, "a");
  GemmResult r;
  r.d = Tensor::empty(DType::kF32, {rows, p.n});  // the offsets cover every row
  for (int64_t e = 0; e < p.groups; ++e) {
    const int64_t r0 = offsets[size_t(e)], n = offsets[size_t(e + 1)] - r0;
    if (n < 0) throw GemmError(fmt::format("{}: offsets decrease at group {}", what, e));
    if (n > 0)
      gemm::gemm_core(ad, p.decoded[size_t(e)], p.packed[size_t(e)], r.d.ptr<float>() + r0 * p.n,
                      r0, n);
  }
  r.kernel = GemmKernel::kCpu;
  r.variant = gemm_variant_name(GemmVariant::kCpu);
  return r;
}

}  // namespace lockstep
