// The float64 GEMM oracle (tests only): the docs/gemm.md definition with every accumulation in
// float64 (exact products of fp32 inner values, ascending k), plus the per-element sums of
// |terms| that the analytic error bound of the fp32 path is stated in.
#include <fmt/format.h>

#include <cmath>

#include "lockstep/gemm/qgemm.h"
#include "lockstep/numerics/hd.h"

namespace lockstep {

GemmF64 qgemm_f64_cpu(const GemmOperand& a, const GemmOperand& w) {
  if (a.n_cols() != w.n_cols())
    throw GemmError(fmt::format("K mismatch: A {} and W {} must have the same number of columns (K)", a.describe(),
                                w.describe()));
  const DecodedOperand ad = decode_gemm_operand(a);
  const DecodedOperand wd = decode_gemm_operand(w);
  const int64_t M = ad.rows, N = wd.rows, K = ad.cols;
  const bool chunked = ad.chunked || wd.chunked;
  const int64_t chunk = chunked ? kGemmChunk : std::max<int64_t>(K, 1);
  const int64_t chunks = chunked ? K / kGemmChunk : 1;
  GemmF64 r;
  r.rows = M;
  r.cols = N;
  r.gamma_n = chunked ? kGemmChunk + chunks : K;
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

GemmResult qgemm_oracle_cpu(const GemmOperand& a, const GemmOperand& w, const GemmEpilogue& ep) {
  const GemmF64 f = qgemm_f64_cpu(a, w);
  // D = fl32(s * acc64): s * acc64 above is one float64 product, exact whenever acc64 is an fp32
  // number, so on grid inputs this is RN(s * acc) of the fp32 path.
  std::vector<float> d(f.d64.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = float(f.d64[i]);
  if (!ep.bias.empty() && int64_t(ep.bias.size()) != f.cols)
    throw GemmError(fmt::format("qgemm oracle: bias has {} values, want {}", ep.bias.size(), f.cols));
  if (!ep.router_prob.empty() && int64_t(ep.router_prob.size()) != f.rows)
    throw GemmError(fmt::format("qgemm oracle: router_prob has {} values, want {}", ep.router_prob.size(), f.rows));
  if (ep.swiglu && f.cols % 2 != 0) throw GemmError("qgemm oracle: swiglu needs an even N");
  return apply_gemm_epilogue(d, f.rows, f.cols, ep);
}

}  // namespace lockstep
