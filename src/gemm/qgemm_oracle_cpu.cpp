// The float64 GEMM oracle (tests only): the docs/gemm.md definition with every accumulation in
// float64 (exact products of fp32 inner values, ascending k), plus the per-element sums of
// |terms| that the analytic error bound of the fp32 path is stated in.
#include <fmt/format.h>

#include <cmath>

#include "lockstep/gemm/oracle.h"
#include "lockstep/numerics/hd.h"
#include "qgemm_cpu.h"

namespace lockstep {

using gemm::DecodedOperand;
using gemm::kChunk;

GemmF64 qgemm_f64(const GemmArg& a, const GemmArg& w, Copy a_copy, Copy w_copy) {
  if (a.cols(a_copy) != w.cols(w_copy))
    throw GemmError(
        fmt::format("K mismatch: A {} and W {} must have the same number of columns (K)",
                    a.describe(a_copy, "a"), w.describe(w_copy, "w")));
  const DecodedOperand ad = gemm::decode_operand(a, a_copy, 0, a.rows(a_copy), "a");
  const DecodedOperand wd = gemm::decode_operand(w, w_copy, 0, w.rows(w_copy), "w");
  const int64_t M = ad.rows, N = wd.rows, K = ad.cols;
  const bool chunked = ad.chunked || wd.chunked;
  const int64_t chunk = chunked ? kChunk : std::max<int64_t>(K, 1);
  const int64_t chunks = chunked ? K / kChunk : 1;
  GemmF64 r;
  r.rows = M;
  r.cols = N;
  r.gamma_n = chunked ? kChunk + chunks : K;
  r.d64.resize(size_t(M * N));
  r.abs_terms.resize(size_t(M * N));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const float* ai = ad.inner.data() + i * K;
      const float* wj = wd.inner.data() + j * K;
      double acc = 0.0, abs_acc = 0.0;
      for (int64_t c = 0; c < chunks; ++c) {
        // The chunk scale is the fp32 number RN(sa_c * sw_c) of the definition (1 when unchunked).
        const float sa = ad.chunked ? ad.chunk_scale[size_t(i * ad.chunks + c)] : 1.0f;
        const float sw = wd.chunked ? wd.chunk_scale[size_t(j * wd.chunks + c)] : 1.0f;
        const double s = double(num::mul_rn(sa, sw));
        double p = 0.0, pa = 0.0;
        for (int64_t k = c * chunk; k < std::min(K, (c + 1) * chunk); ++k) {
          const double t = double(ai[k]) * double(wj[k]);  // exact: 24 + 24 bits < 53
          p += t;
          pa += std::fabs(t);
        }
        acc += s * p;
        abs_acc += std::fabs(s) * pa;
      }
      const double so = double(num::mul_rn(ad.outer[size_t(i)], wd.outer[size_t(j)]));
      r.d64[size_t(i * N + j)] = so * acc;
      r.abs_terms[size_t(i * N + j)] = std::fabs(so) * abs_acc;
    }
  return r;
}

double gemm_gamma(int64_t n) {
  const double nu = double(n) * 0x1p-24;
  return nu / (1.0 - nu);
}

GemmResult qgemm_oracle(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg) {
  const GemmF64 f = qgemm_f64(a, w, cfg.a_copy, cfg.w_copy);
  // D = fl32(s * acc64): s * acc64 above is one float64 product, exact whenever acc64 is an fp32
  // number, so on grid inputs this is RN(s * acc) of the fp32 path.
  std::vector<float> d(f.d64.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = float(f.d64[i]);
  const GemmEpilogue& ep = cfg.epilogue;
  gemm::check_epilogue(ep, f.rows, f.cols, f.cols, "qgemm oracle");
  const std::vector<float> bias = gemm::host_floats(ep.bias),
                           prob = gemm::host_floats(ep.router_prob);
  gemm::EpilogueArgs args{ep.alpha,    bias, ep.swiglu, prob, cfg.out_dtype == DType::kBF16,
                          ep.row_amax, 0,    0};
  return gemm::make_result(gemm::apply_epilogue(d, f.rows, f.cols, args), f.rows, cfg.out_dtype,
                           ep.row_amax);
}

}  // namespace lockstep
