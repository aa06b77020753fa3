// The MoE producer fusions' CPU definitions (quant/moe_fused.h) are the unfused compositions:
// gather then per-row NVFP4, and weighted SwiGLU then per-row NVFP4. The CUDA fused kernels are
// tested against these functions by lockstep_test_backend.
#include <gtest/gtest.h>

#include <random>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/quant/moe_fused.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep::test;

namespace {
std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
QuantConfig per_row() {
  QuantConfig s;
  s.format = Format::kNvfp4;
  s.scaling = Scaling::kPerRow;
  return s;
}
}  // namespace

TEST(MoeFused, PermuteQuantizeIsGatherThenPerRowQuantize) {
  const uint64_t seed = test_seed();
  const int64_t tokens = 9, cols = 64;
  auto x = randn(size_t(tokens * cols), seed);
  const Tensor m = mat(x, tokens, cols);
  const std::vector<int32_t> src{3, 0, 8, -1, 5, 5, 1, -1};  // repeats and padding rows
  const std::vector<int64_t> offsets{0, 4, 4, 8};
  QTensor fused =
      permute_quantize(m, Tensor::from_vector<int32_t>(src, {8}, DType::kI32), offsets, per_row());
  std::vector<float> gathered(src.size() * size_t(cols), 0.0f);
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] >= 0)
      std::copy_n(x.begin() + src[i] * cols, cols, gathered.begin() + int64_t(i) * cols);
  QTensor ref = quantize_grouped(mat(gathered, int64_t(src.size()), cols), offsets, per_row());
  EXPECT_EQ(rowwise(fused).data, rowwise(ref).data) << "seed " << seed;
  EXPECT_EQ(rowwise(fused).block_scale, rowwise(ref).block_scale);
  EXPECT_EQ(rowwise(fused).amax, rowwise(ref).amax);
  EXPECT_EQ(rowwise(fused).amax[3], 0.0f);  // padding row
}

TEST(MoeFused, SwigluQuantizeIsWeightedSwigluThenPerRowQuantize) {
  const uint64_t seed = test_seed();
  const int64_t rows = 7, h = 48;
  auto fc1 = randn(size_t(rows * 2 * h), seed);
  auto prob = randn(size_t(rows), seed + 1);
  const Tensor m = mat(fc1, rows, 2 * h);
  const Tensor pt = Tensor::from_vector<float>(prob, {rows}, DType::kF32);
  std::vector<float> y(size_t(rows * h));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < h; ++c)
      y[size_t(r * h + c)] = num::swiglu_weighted_f32(
          fc1[size_t(r * 2 * h + c)], fc1[size_t(r * 2 * h + h + c)], prob[size_t(r)]);
  EXPECT_EQ(floats(swiglu_weighted(m, pt)), y);
  QTensor fused = swiglu_quantize(m, pt, per_row());
  QTensor ref = quantize(mat(y, rows, h), per_row());
  EXPECT_EQ(rowwise(fused).data, rowwise(ref).data) << "seed " << seed;
  EXPECT_EQ(rowwise(fused).block_scale, rowwise(ref).block_scale);
  EXPECT_EQ(rowwise(fused).amax, rowwise(ref).amax);
}
