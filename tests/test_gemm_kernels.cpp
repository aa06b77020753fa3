// The kernel choice of a GEMM call: the public GemmKernel names what a user chooses, each CUDA
// kernel's variants stay reachable by name (GemmConfig::variant) for tests and the lab, and CPU
// operands refuse any CUDA kernel or variant with a message naming it.
#include <gtest/gtest.h>

#include "gemm/qgemm_variant.h"
#include "lockstep/gemm/qgemm.h"
#include "test_util.h"

using namespace lockstep;

TEST(GemmKernels, PublicKernelsAreTheUsersChoices) {
  std::vector<std::string> names;
  for (size_t k = 0; k < size_t(GemmKernel::kCount); ++k)
    names.emplace_back(gemm_kernel_name(GemmKernel(k)));
  EXPECT_EQ(names, (std::vector<std::string>{"auto", "cpu", "cuda_decode", "cuda_wgmma",
                                             "cuda_cublas", "cuda_tiled"}));
  for (const std::string& n : names) EXPECT_EQ(gemm_kernel_name(*gemm_kernel_from_name(n)), n);
  EXPECT_FALSE(gemm_kernel_from_name("cuda_wgmma_wreg128"));  // a variant, not a user's choice
}

TEST(GemmKernels, EveryVariantBelongsToOneKernelAndIsReachableByName) {
  for (size_t i = 0; i < size_t(GemmVariant::kCount); ++i) {
    const GemmVariant v = GemmVariant(i);
    const std::string name(gemm_variant_name(v));
    ASSERT_EQ(gemm_variant_from_name(name), v) << name;
    GemmConfig cfg;
    force_variant(cfg, v);
    EXPECT_EQ(cfg.kernel, gemm_kernel_of(v)) << name;
    EXPECT_EQ(requested_variant(cfg, "t"), v) << name;
  }
  EXPECT_EQ(gemm_kernel_of(GemmVariant::kWgmmaWreg256), GemmKernel::kCudaWgmma);
  EXPECT_EQ(gemm_kernel_of(GemmVariant::kWgmmaSmallM), GemmKernel::kCudaWgmma);
  EXPECT_EQ(gemm_variant_name(GemmVariant::kWgmmaSmallM), "cuda_wgmma_small_m");
  EXPECT_EQ(gemm_kernel_of(GemmVariant::kWgmmaSmallMWide), GemmKernel::kCudaWgmma);
  EXPECT_EQ(gemm_variant_from_name("cuda_wgmma_small_m_wide"), GemmVariant::kWgmmaSmallMWide);
  EXPECT_EQ(gemm_kernel_of(GemmVariant::kDecodeBlockSplit), GemmKernel::kCudaDecode);
  EXPECT_EQ(gemm_variant_of(GemmKernel::kCudaWgmma), GemmVariant::kWgmma);
}

TEST(GemmKernels, CpuOperandsReportTheCpuAndRefuseCudaChoices) {
  const Tensor a = test::mat({1, 2, 3, 4}, 2, 2), w = test::mat({1, 0, 0, 1}, 2, 2);
  const GemmResult r = qgemm(a, w);
  EXPECT_EQ(r.kernel, GemmKernel::kCpu);
  EXPECT_EQ(r.variant, "cpu");
  GemmConfig cfg;
  cfg.variant = "cuda_wgmma_wreg128";
  std::string e = test::error_of<GemmError>([&] { qgemm(a, w, cfg); });
  EXPECT_NE(e.find("kernel cuda_wgmma_wreg128 runs on CUDA operands only"), std::string::npos) << e;
  cfg.variant = "cuda_wgmma_wreg64";
  e = test::error_of<GemmError>([&] { qgemm(a, w, cfg); });
  EXPECT_NE(e.find("unknown kernel variant 'cuda_wgmma_wreg64'"), std::string::npos) << e;
  cfg.kernel = GemmKernel::kCudaDecode;
  cfg.variant = "cuda_wgmma_inloop";
  e = test::error_of<GemmError>([&] { qgemm(a, w, cfg); });
  EXPECT_NE(e.find("not a variant of kernel cuda_decode"), std::string::npos) << e;
  cfg = {};
  cfg.kernel = GemmKernel::kCudaTiled;
  e = test::error_of<GemmError>([&] { qgemm(a, w, cfg); });
  EXPECT_NE(e.find("kernel cuda_tiled runs on CUDA operands only"), std::string::npos) << e;
}
