// The kernel variants behind the public GemmKernel choices (qgemm.h), private to the gemm layer,
// its tests, benchmarks and the kernel lab (dev/): every variant of a kernel gives the same bits,
// so users choose a kernel and the library its variant. GemmConfig::variant forces one by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/gemm/qgemm.h"

namespace lockstep {

enum class GemmVariant : uint8_t {
  kAuto,              // the library's choice (within GemmConfig::kernel when that is not kAuto)
  kCpu,               // the CPU path
  kDecode,            // small M, W streamed
  kDecodeBlockSplit,  // the decode kernel with its K split in whole blocks
  kTiled,             // mma.sync tiles, any M; the only one taking fp8 1x128 / 128x128
  kWgmma,             // the library's choice among the six wgmma variants below
  kWgmmaInloop,
  kWgmmaStaged,
  kWgmmaWreg128,
  kWgmmaWreg256,
  kWgmmaSmallM,      // 64 x 32 tiles, one warpgroup: few rows per group
  kWgmmaSmallMWide,  // 64 x 128 tiles, one warpgroup: few rows per group, many columns
  kCublas,           // exact bf16 dequantize + cuBLAS
  kCount,
};

// "cuda_wgmma_wreg128"; a kernel's own variant carries the kernel's name ("cuda_wgmma").
std::string_view gemm_variant_name(GemmVariant v);
std::optional<GemmVariant> gemm_variant_from_name(std::string_view name);
// The kernel a variant belongs to.
GemmKernel gemm_kernel_of(GemmVariant v);
// The variant that stands for the kernel as a whole (the library picks the variant).
GemmVariant gemm_variant_of(GemmKernel k);
// What `cfg` asks for: cfg.variant by name (a variant of cfg.kernel, or of any kernel with kAuto),
// else cfg.kernel's own. Throws GemmError (prefixed with `what`) for an unknown name or a variant
// of another kernel.
GemmVariant requested_variant(const GemmConfig& cfg, const std::string& what);
// Sets cfg.kernel and cfg.variant so that requested_variant(cfg) is v (tests and the lab).
void force_variant(GemmConfig& cfg, GemmVariant v);

}  // namespace lockstep
