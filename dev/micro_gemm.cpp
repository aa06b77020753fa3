// Lab: every CUDA GEMM kernel forced on one shape through qgemm (GemmConfig::kernel), its median
// time and TFLOP/s, and whether its bits equal the tiled kernel's where the kernel is
// batch-invariant (the kernels share one chain per family; the wgmma variants must agree with each
// other bit for bit). Random bf16 activations against a packed weight of the chosen format. Build:
// cmake -DLOCKSTEP_CUDA=ON -DLOCKSTEP_DEV=ON, target micro_gemm. Run: micro_gemm [M N K
// [nvfp4|mxfp8|fp8|bf16]]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_fill.h"
#include "cuda_timing.h"
#include "gemm/qgemm_variant.h"
#include "lockstep/gemm/qgemm.h"
#include "lockstep/quant/quantize.h"

using namespace lockstep;

int main(int argc, char** argv) {
  const int64_t M = argc > 3 ? std::atoll(argv[1]) : 4096,
                N = argc > 3 ? std::atoll(argv[2]) : 4096,
                K = argc > 3 ? std::atoll(argv[3]) : 4096;
  const auto fmt = format_from_name(argc > 4 ? argv[4] : "nvfp4");
  if (!fmt) {
    std::fprintf(stderr, "micro_gemm: unknown format\n");
    return 2;
  }
  const Device dev = Device::cuda();
  const Tensor a = bench::random_bf16(M, K, 1, dev), wt = bench::random_bf16(N, K, 2, dev);
  QuantConfig qc;
  qc.format = *fmt;
  qc.scaling = *fmt == Format::kMxfp8 ? Scaling::kBlock1x32
               : *fmt == Format::kFp8 ? Scaling::kPerRow
                                      : Scaling::kPerRow;
  const bool dense = *fmt == Format::kBf16;
  const QTensor w = dense ? QTensor{} : quantize(wt, qc);
  const GemmArg wa = dense ? GemmArg(wt) : GemmArg(w);
  synchronize(dev);
  std::printf("%lld x %lld x %lld, bf16 A, %s W\n", (long long)M, (long long)N, (long long)K,
              format_name(*fmt).data());
  std::printf("%-24s %-24s %10s %9s %s\n", "asked", "ran", "us", "TFLOP/s", "bits vs tiled");
  std::vector<float> ref;
  for (GemmVariant k :
       {GemmVariant::kTiled, GemmVariant::kDecode, GemmVariant::kDecodeBlockSplit,
        GemmVariant::kWgmma, GemmVariant::kWgmmaInloop, GemmVariant::kWgmmaStaged,
        GemmVariant::kWgmmaWreg128, GemmVariant::kWgmmaWreg256, GemmVariant::kCublas}) {
    GemmConfig cfg;
    force_variant(cfg, k);
    try {
      const GemmResult r = qgemm(a, wa, cfg);
      const std::vector<float> d = to_f32(r.d.to(Device::cpu()));
      const double us = bench::median_time_us([&](int) { (void)qgemm(a, wa, cfg); }, 10);
      std::string same = "-";
      if (k == GemmVariant::kTiled)
        ref = d;
      else
        same = d == ref ? "equal" : "differ (another chain)";
      std::printf("%-24s %-24s %10.1f %9.1f %s\n", gemm_variant_name(k).data(),
                  std::string(r.variant).c_str(), us,
                  2.0 * double(M) * double(N) * double(K) / us * 1e-6, same.c_str());
    } catch (const GemmError& e) {
      std::printf("%-24s refused: %s\n", gemm_variant_name(k).data(), e.what());
    }
  }
  return 0;
}
