// GEMM helpers of lockstep_test_gpu (test_gpu_gemm.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gemm/operand.h"
#include "gemm/qgemm_cuda_types.h"
#include "lockstep/numerics/hd.h"
#include "test_gpu_gemm.h"

namespace lockstep::gpu_test {

using gemm_test::bf16_kind;
using gemm_test::q_kind;

namespace {
// fp8 block kinds with power-of-two scales: RN(part * s_c) is exact on grid inputs.
Kind fp8_block_kind(Scaling s) {
  Kind k = q_kind(Format::kFp8, s);
  k.spec.pow2 = true;
  k.label += "/pow2";
  return k;
}
}  // namespace

std::vector<Pairing> pairings() {
  return {
      {bf16_kind(), q_kind(Format::kNvfp4, Scaling::kPerRow)},  // w4a16
      {bf16_kind(), q_kind(Format::kNvfp4, Scaling::kPerTensor)},
      {bf16_kind(), q_kind(Format::kMxfp8, Scaling::kBlock1x32)},
      {bf16_kind(), q_kind(Format::kFp8, Scaling::kPerRow)},
      {q_kind(Format::kNvfp4, Scaling::kPerRow), q_kind(Format::kNvfp4, Scaling::kPerRow)},
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kMxfp8, Scaling::kBlock1x32)},
      {q_kind(Format::kFp8, Scaling::kPerRow), q_kind(Format::kFp8, Scaling::kPerTensor)},
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32),
       q_kind(Format::kNvfp4, Scaling::kPerRow)},  // w4a8
      {bf16_kind(), bf16_kind()},
      {fp8_block_kind(Scaling::kBlock1x128), fp8_block_kind(Scaling::kBlock128x128)},
      {bf16_kind(), fp8_block_kind(Scaling::kBlock128x128)},
      {fp8_block_kind(Scaling::kBlock1x128), q_kind(Format::kNvfp4, Scaling::kPerRow)},
      {q_kind(Format::kFp8, Scaling::kBlock1x128),
       q_kind(Format::kFp8, Scaling::kBlock128x128)},  // fp32 scales
  };
}

bool chunked(const Kind& k) {
  return !k.bf16 && k.spec.format == Format::kFp8 &&
         (k.spec.scaling == Scaling::kBlock1x128 || k.spec.scaling == Scaling::kBlock128x128);
}

DevHeld dev(const Held& h) {
  DevHeld d;
  if (h.q) d.q = h.q->to(gpu());
  d.t = h.t.to(gpu());
  return d;
}

bool applicable(GemmVariant k, bool any_chunked, int64_t rows_per_group, int64_t K,
                bool host_offsets) {
  switch (k) {
    case GemmVariant::kTiled:
      return K % 32 == 0;
    case GemmVariant::kDecode:
    case GemmVariant::kDecodeBlockSplit:
      return !any_chunked && rows_per_group <= 16 && K % 128 == 0;
    case GemmVariant::kWgmma:
    case GemmVariant::kWgmmaInloop:
    case GemmVariant::kWgmmaStaged:
    case GemmVariant::kWgmmaWreg128:
    case GemmVariant::kWgmmaWreg256:
    case GemmVariant::kWgmmaSmallM:
    case GemmVariant::kWgmmaSmallMWide:
      return !any_chunked && cuda::wgmma_available(K);
    case GemmVariant::kCublas:
      return !any_chunked && host_offsets && cuda::cublas_available() && K % 16 == 0;
    default:
      return false;
  }
}

std::vector<GemmVariant> kernels_for(bool any_chunked, int64_t rows_per_group, int64_t K,
                                     bool host_offsets) {
  if (g_opt.kernel != GemmVariant::kAuto) {
    if (applicable(g_opt.kernel, any_chunked, rows_per_group, K, host_offsets))
      return {g_opt.kernel};
    return {};
  }
  std::vector<GemmVariant> ks;
  for (GemmVariant k :
       {GemmVariant::kTiled, GemmVariant::kDecode, GemmVariant::kWgmma, GemmVariant::kCublas})
    if (applicable(k, any_chunked, rows_per_group, K, host_offsets)) ks.push_back(k);
  return ks;
}

bool kernel_matches(GemmVariant asked, GemmVariant ran) {
  const auto wgmma = [](GemmVariant k) {
    return k == GemmVariant::kWgmma || k == GemmVariant::kWgmmaInloop ||
           k == GemmVariant::kWgmmaStaged || k == GemmVariant::kWgmmaWreg128 ||
           k == GemmVariant::kWgmmaWreg256 || k == GemmVariant::kWgmmaSmallM ||
           k == GemmVariant::kWgmmaSmallMWide;
  };
  if (wgmma(asked)) return wgmma(ran) && ran != GemmVariant::kWgmma;
  return asked == ran;
}

std::string kernel_label(GemmVariant k) { return std::string(gemm_variant_name(k)); }

namespace {
GemmResult to_host(GemmResult r) {
  r.d = r.d.to(Device::cpu());
  if (r.row_amax.defined()) r.row_amax = r.row_amax.to(Device::cpu());
  return r;
}
}  // namespace

GemmResult gpu_qgemm(const GemmArg& a, const GemmArg& w, GemmConfig cfg) {
  set_poison_device_allocations(true);
  try {
    GemmResult r = to_host(qgemm(a, w, cfg));
    set_poison_device_allocations(false);
    return r;
  } catch (...) {
    set_poison_device_allocations(false);
    throw;
  }
}

GemmResult gpu_grouped(const GemmArg& a, const Tensor& offsets, const GemmArg& w, GemmConfig cfg) {
  set_poison_device_allocations(true);
  try {
    GemmResult r = to_host(grouped_qgemm(a, offsets, w, cfg));
    set_poison_device_allocations(false);
    return r;
  } catch (...) {
    set_poison_device_allocations(false);
    throw;
  }
}

bool same_bits(const Tensor& x_in, const Tensor& y_in, const std::string& what) {
  const Tensor x = x_in.to(Device::cpu()).contiguous(), y = y_in.to(Device::cpu()).contiguous();
  if (x.shape() != y.shape() || x.dtype() != y.dtype()) {
    std::printf("  %s: %s vs %s\n", what.c_str(), x.describe().c_str(), y.describe().c_str());
    return false;
  }
  const std::vector<float> a = to_f32(x), b = to_f32(y);
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (num::f32_bits(a[i]) != num::f32_bits(b[i]) && bad++ < 3)
      std::printf("  %s: element %zu: %.9g vs %.9g\n", what.c_str(), i, a[i], b[i]);
  return bad == 0;
}

std::string within_bound(const Tensor& got, const GemmF64& ref) {
  const std::vector<float> d = to_f32(got.to(Device::cpu()));
  if (d.size() != ref.d64.size())
    return " size " + std::to_string(d.size()) + " vs " + std::to_string(ref.d64.size());
  const double g = gemm_gamma(ref.gamma_n) * (1.0 + 0x1p-20);
  int64_t bad = 0;
  double worst = 0;
  for (size_t e = 0; e < d.size(); ++e) {
    const double err = std::fabs(double(d[e]) - ref.d64[e]);
    if (!(err <= g * ref.abs_terms[e])) ++bad;
    if (ref.abs_terms[e] > 0) worst = std::max(worst, err / (g * ref.abs_terms[e]));
  }
  if (bad == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, " %lld elements outside the bound (worst %.3g x the bound)",
                (long long)bad, worst);
  return buf;
}

bool any_order_exact(const GemmArg& a, const GemmArg& w, Copy a_copy, Copy w_copy) {
  const gemm::DecodedOperand da = gemm::decode_operand(a, a_copy, 0, a.rows(a_copy), "a");
  const gemm::DecodedOperand dw = gemm::decode_operand(w, w_copy, 0, w.rows(w_copy), "w");
  const int64_t K = da.cols;
  for (int64_t i = 0; i < da.rows; ++i)
    for (int64_t j = 0; j < dw.rows; ++j) {
      double s = 0, gmin = 1e300;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(da.inner[size_t(i * K + k)]) * double(dw.inner[size_t(j * K + k)]);
        if (p == 0) continue;
        s += std::fabs(p);
        int e;
        double m = std::frexp(std::fabs(p), &e);
        int z = 0;  // largest power of two dividing p: scale the mantissa to an integer
        while (m != std::floor(m)) m *= 2, ++z;
        gmin = std::min(gmin, std::ldexp(1.0, e - z));
        if (!(double(float(p)) == p)) return false;
      }
      if (s >= std::ldexp(gmin, 24)) return false;
    }
  return true;
}

std::vector<float> grid_values_narrow(const Kind& k, int64_t rows, int64_t cols, uint64_t seed,
                                      int64_t amax_col) {
  return gemm_test::grid_values(k, rows, cols, seed, amax_col, gemm_test::GridSpread{3, 7});
}

}  // namespace lockstep::gpu_test
