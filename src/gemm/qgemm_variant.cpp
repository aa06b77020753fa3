// The kernel-variant table of qgemm_variant.h: names, the kernel each variant belongs to, and the
// reading of GemmConfig's kernel and variant fields.
#include "qgemm_variant.h"

#include <fmt/format.h>

#include <array>

namespace lockstep {
namespace {

struct VariantRow {
  GemmVariant variant;
  std::string_view name;
  GemmKernel kernel;
};

constexpr std::array<VariantRow, size_t(GemmVariant::kCount)> kVariants{{
    {GemmVariant::kAuto, "auto", GemmKernel::kAuto},
    {GemmVariant::kCpu, "cpu", GemmKernel::kCpu},
    {GemmVariant::kDecode, "cuda_decode", GemmKernel::kCudaDecode},
    {GemmVariant::kDecodeBlockSplit, "cuda_decode_block_split", GemmKernel::kCudaDecode},
    {GemmVariant::kTiled, "cuda_tiled", GemmKernel::kCudaTiled},
    {GemmVariant::kWgmma, "cuda_wgmma", GemmKernel::kCudaWgmma},
    {GemmVariant::kWgmmaInloop, "cuda_wgmma_inloop", GemmKernel::kCudaWgmma},
    {GemmVariant::kWgmmaStaged, "cuda_wgmma_staged", GemmKernel::kCudaWgmma},
    {GemmVariant::kWgmmaWreg128, "cuda_wgmma_wreg128", GemmKernel::kCudaWgmma},
    {GemmVariant::kWgmmaWreg256, "cuda_wgmma_wreg256", GemmKernel::kCudaWgmma},
    {GemmVariant::kWgmmaSmallM, "cuda_wgmma_small_m", GemmKernel::kCudaWgmma},
    {GemmVariant::kWgmmaSmallMWide, "cuda_wgmma_small_m_wide", GemmKernel::kCudaWgmma},
    {GemmVariant::kCublas, "cuda_cublas", GemmKernel::kCudaCublas},
}};

constexpr bool variants_in_order() {
  for (size_t i = 0; i < kVariants.size(); ++i)
    if (size_t(kVariants[i].variant) != i) return false;
  return true;
}
static_assert(variants_in_order(), "variant rows must follow their enumerators");

}  // namespace

std::string_view gemm_variant_name(GemmVariant v) { return kVariants[size_t(v)].name; }

std::optional<GemmVariant> gemm_variant_from_name(std::string_view name) {
  for (const VariantRow& r : kVariants)
    if (r.name == name) return r.variant;
  return std::nullopt;
}

GemmKernel gemm_kernel_of(GemmVariant v) { return kVariants[size_t(v)].kernel; }

GemmVariant gemm_variant_of(GemmKernel k) {
  // Each kernel's own row is the first of its rows.
  for (const VariantRow& r : kVariants)
    if (r.kernel == k) return r.variant;
  return GemmVariant::kAuto;
}

GemmVariant requested_variant(const GemmConfig& cfg, const std::string& what) {
  if (cfg.variant.empty()) return gemm_variant_of(cfg.kernel);
  const std::optional<GemmVariant> v = gemm_variant_from_name(cfg.variant);
  if (!v) {
    std::string known;
    for (const VariantRow& r : kVariants)
      known += (known.empty() ? "" : ", ") + std::string(r.name);
    throw GemmError(
        fmt::format("{}: unknown kernel variant '{}' (known: {})", what, cfg.variant, known));
  }
  if (cfg.kernel != GemmKernel::kAuto && gemm_kernel_of(*v) != cfg.kernel)
    throw GemmError(fmt::format("{}: variant {} is not a variant of kernel {}", what, cfg.variant,
                                gemm_kernel_name(cfg.kernel)));
  return *v;
}

void force_variant(GemmConfig& cfg, GemmVariant v) {
  cfg.kernel = gemm_kernel_of(v);
  cfg.variant = v == gemm_variant_of(cfg.kernel) ? std::string_view() : gemm_variant_name(v);
}

}  // namespace lockstep
