// The MoE producer fusions' CPU definitions (quant/moe_fused.h) are the unfused compositions:
// gather then per-row NVFP4, and weighted SwiGLU then per-row NVFP4. The CUDA fused kernels are
// tested against these functions by lockstep_test_backend.
#include <gtest/gtest.h>

#include <random>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/quant/moe_fused.h"

using namespace lockstep;

namespace {
std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
QuantSpec per_row() {
  QuantSpec s;
  s.scaling = Scaling::kPerRow;
  return s;
}
}  // namespace

TEST(MoeFused, PermuteQuantizeIsGatherThenPerRowQuantize) {
  const uint64_t seed = std::random_device{}();
  const int64_t tokens = 9, cols = 64;
  auto x = randn(size_t(tokens * cols), seed);
  const MatrixF32 m{x, tokens, cols, 3.4028234663852886e38f, "x"};
  const std::vector<int32_t> src{3, 0, 8, -1, 5, 5, 1, -1};  // repeats and padding rows
  const std::vector<int64_t> offsets{0, 4, 4, 8};
  QTensor fused = permute_quantize_nvfp4_cpu(m, src, offsets, per_row());
  std::vector<float> gathered(src.size() * size_t(cols), 0.0f);
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] >= 0) std::copy_n(x.begin() + src[i] * cols, cols, gathered.begin() + int64_t(i) * cols);
  QTensor ref = quantize_grouped(MatrixF32{gathered, int64_t(src.size()), cols, 3.4028234663852886e38f, "g"}, offsets,
                                 per_row());
  EXPECT_EQ(fused.data, ref.data) << "seed " << seed;
  EXPECT_EQ(fused.block_scale, ref.block_scale);
  EXPECT_EQ(fused.amax, ref.amax);
  EXPECT_EQ(fused.amax[3], 0.0f);  // padding row
}

TEST(MoeFused, SwigluQuantizeIsWeightedSwigluThenPerRowQuantize) {
  const uint64_t seed = std::random_device{}();
  const int64_t rows = 7, h = 48;
  auto fc1 = randn(size_t(rows * 2 * h), seed);
  auto prob = randn(size_t(rows), seed + 1);
  const MatrixF32 m{fc1, rows, 2 * h, 3.4028234663852886e38f, "fc1"};
  std::vector<float> y(size_t(rows * h));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < h; ++c)
      y[size_t(r * h + c)] = num::swiglu_weighted_f32(fc1[size_t(r * 2 * h + c)], fc1[size_t(r * 2 * h + h + c)], prob[size_t(r)]);
  EXPECT_EQ(swiglu_weighted_cpu(m, prob), y);
  QTensor fused = swiglu_quantize_nvfp4_cpu(m, prob, per_row());
  QTensor ref = quantize(MatrixF32{y, rows, h, 3.4028234663852886e38f, "y"}, per_row());
  EXPECT_EQ(fused.data, ref.data) << "seed " << seed;
  EXPECT_EQ(fused.block_scale, ref.block_scale);
  EXPECT_EQ(fused.amax, ref.amax);
}
