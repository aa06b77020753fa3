// Packed weights (gemm/packed.h): qgemm_packed and grouped_qgemm_packed equal qgemm and
// grouped_qgemm bit for bit for every weight format, including ragged groups and an empty one.
#include <gtest/gtest.h>

#include "lockstep/gemm/packed.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/quant/quantize.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep::test;

namespace {

Tensor randf(int64_t rows, int64_t cols, uint32_t stream) {
  Tensor t(DType::kF32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i)
    t.ptr<float>()[i] =
        float(num::philox_element_word(test_seed(), stream, uint64_t(i)) >> 8) / 8388608.0f - 1.0f;
  return t;
}

}  // namespace

TEST(GemmPacked, EqualsTheUnpackedGemmForEveryWeightFormat) {
  const int64_t M = 37, N = 128, K = 256, E = 3;  // fp8 128x128 needs 128-row groups
  const Tensor a = randf(M, K, 1), w = randf(E * N, K, 2);
  const std::vector<int64_t> off{0, 20, 20, M};  // an empty group
  const Tensor offt = Tensor::from_vector<int64_t>(off, {4}, DType::kI64);
  std::vector<QuantConfig> cfgs(5);
  cfgs[0].format = Format::kNvfp4, cfgs[0].scaling = Scaling::kPerRow;
  cfgs[1].format = Format::kNvfp4, cfgs[1].scaling = Scaling::kPerGroup;
  cfgs[2].format = Format::kMxfp8, cfgs[2].scaling = Scaling::kBlock1x32;
  cfgs[3].format = Format::kFp8, cfgs[3].scaling = Scaling::kBlock128x128;
  cfgs[4].format = Format::kFp8, cfgs[4].scaling = Scaling::kPerTensor;
  std::vector<int64_t> woff;
  for (int64_t e = 0; e <= E; ++e) woff.push_back(e * N);
  const Tensor ab = cast(a, DType::kBF16);
  for (const QuantConfig& c : cfgs) {
    const QTensor qw = quantize_grouped(w, woff, c, "w");
    QuantConfig ca = c;
    if (ca.scaling == Scaling::kPerGroup || ca.scaling == Scaling::kBlock128x128)
      ca.scaling = ca.format == Format::kFp8 ? Scaling::kBlock1x128 : Scaling::kPerRow;
    const QTensor qa = quantize(a, ca, "a");
    const std::string what = std::string(format_name(c.format)) + " " +
                             std::string(scaling_name(c.scaling)) + " seed " +
                             std::to_string(test_seed());
    expect_bits(grouped_qgemm_packed(qa, off, pack_weight(qw, E)).d, grouped_qgemm(qa, offt, qw).d,
                what + " grouped");
    expect_bits(grouped_qgemm_packed(ab, off, pack_weight(qw, E)).d, grouped_qgemm(ab, offt, qw).d,
                what + " grouped, bf16 A");
  }
  const Tensor wb = cast(w, DType::kBF16);
  expect_bits(qgemm_packed(ab, pack_weight(wb)).d, qgemm(ab, wb).d, "bf16 dense");
  expect_bits(qgemm_packed(a, pack_weight(w)).d, qgemm(a, w).d, "f32 dense");
  EXPECT_THROW(qgemm_packed(randf(M, K + 16, 3), pack_weight(w)), GemmError);
}
