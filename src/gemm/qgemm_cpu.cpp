// The fast deterministic CPU GEMM (fp32, the accumulation order of docs/gemm.md), the shared
// epilogue and the grouped (MoE) GEMM. Blocking is over output rows and columns only, never over
// k, so every output element runs the same chain of fp32 operations whatever M, threads or tiles.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>

#include "lockstep/gemm/qgemm.h"
#include "lockstep/numerics/hd.h"
#include "lockstep/numerics/transcendental.h"

namespace lockstep {
namespace {

constexpr int kPanel = 16;  // W rows per packed panel (vector lanes: one output element each)
constexpr int kRowBlock = 4;

// W inner values transposed into panels [P][K][16] (zero lanes past N), and for chunked W its
// chunk scales [P][C][16], so the innermost loop runs over 16 independent output elements.
struct PackedW {
  int64_t n = 0, k = 0, panels = 0, chunks = 0;
  std::vector<float> inner;
  std::vector<float> chunk_scale;
};

PackedW pack_w(const DecodedOperand& w) {
  PackedW p;
  p.n = w.rows;
  p.k = w.cols;
  p.panels = (w.rows + kPanel - 1) / kPanel;
  p.chunks = w.chunks;
  p.inner.assign(size_t(p.panels * p.k * kPanel), 0.0f);
  if (w.chunked) p.chunk_scale.assign(size_t(p.panels * p.chunks * kPanel), 1.0f);
#pragma omp parallel for schedule(static)
  for (int64_t pi = 0; pi < p.panels; ++pi)
    for (int l = 0; l < kPanel; ++l) {
      const int64_t j = pi * kPanel + l;
      if (j >= w.rows) break;
      for (int64_t k = 0; k < p.k; ++k) p.inner[size_t((pi * p.k + k) * kPanel + l)] = w.inner[size_t(j * p.k + k)];
      for (int64_t c = 0; c < p.chunks; ++c)
        p.chunk_scale[size_t((pi * p.chunks + c) * kPanel + l)] = w.chunk_scale[size_t(j * p.chunks + c)];
    }
  return p;
}

// One tile: R rows of A (a row pointers) x one W panel. acc = the docs/gemm.md chain:
//   plain:   acc = +0; for k ascending: acc = RN(acc + RN(ia_k * iw_k))
//   chunked: acc = +0; per chunk c: p = +0; for k in c ascending: p = RN(p + RN(ia_k * iw_k));
//            acc = RN(acc + RN(p * RN(sa_c * sw_c)))    (sa_c = 1 / sw_c = 1 for unchunked sides)
// Host code is built with -ffp-contract=off, so `x + a * b` is two roundings, never an FMA.
template <int R>
void tile(const float* const* arows, const float* const* ascale, int64_t a_chunks, const PackedW& w,
          int64_t pi, float (&acc)[kRowBlock][kPanel]) {
  const float* wp = w.inner.data() + pi * w.k * kPanel;
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < kPanel; ++l) acc[r][l] = 0.0f;
  const bool chunked = a_chunks > 0 || w.chunks > 0;
  if (!chunked) {
    for (int64_t k = 0; k < w.k; ++k) {
      const float* wk = wp + k * kPanel;
      for (int r = 0; r < R; ++r) {
        const float av = arows[r][k];
        for (int l = 0; l < kPanel; ++l) acc[r][l] = acc[r][l] + av * wk[l];
      }
    }
    return;
  }
  const int64_t chunks = w.k / kGemmChunk;
  for (int64_t c = 0; c < chunks; ++c) {
    float part[kRowBlock][kPanel];
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < kPanel; ++l) part[r][l] = 0.0f;
    for (int64_t k = c * kGemmChunk; k < (c + 1) * kGemmChunk; ++k) {
      const float* wk = wp + k * kPanel;
      for (int r = 0; r < R; ++r) {
        const float av = arows[r][k];
        for (int l = 0; l < kPanel; ++l) part[r][l] = part[r][l] + av * wk[l];
      }
    }
    const float* ws = w.chunks > 0 ? w.chunk_scale.data() + (pi * w.chunks + c) * kPanel : nullptr;
    for (int r = 0; r < R; ++r) {
      const float sa = a_chunks > 0 ? ascale[r][c] : 1.0f;
      for (int l = 0; l < kPanel; ++l) {
        const float s = num::mul_rn(sa, ws ? ws[l] : 1.0f);
        acc[r][l] = num::add_rn(acc[r][l], num::mul_rn(part[r][l], s));
      }
    }
  }
}

// Raw D [a.rows, w.n] = RN(RN(outer_a * outer_w) * acc) for decoded A and packed W.
std::vector<float> gemm_core(const DecodedOperand& a, const DecodedOperand& wdec, const PackedW& w) {
  const int64_t M = a.rows, N = w.n;
  std::vector<float> d(size_t(M * N));
  const int64_t row_blocks = (M + kRowBlock - 1) / kRowBlock;
  const int64_t tiles = row_blocks * w.panels;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rb = t / w.panels, pi = t % w.panels;
    const int64_t i0 = rb * kRowBlock;
    const int R = int(std::min<int64_t>(kRowBlock, M - i0));
    const float* arows[kRowBlock];
    const float* ascale[kRowBlock];
    for (int r = 0; r < R; ++r) {
      arows[r] = a.inner.data() + (i0 + r) * a.cols;
      ascale[r] = a.chunked ? a.chunk_scale.data() + (i0 + r) * a.chunks : nullptr;
    }
    float acc[kRowBlock][kPanel];
    const int64_t ac = a.chunked ? a.chunks : 0;
    switch (R) {
      case 4: tile<4>(arows, ascale, ac, w, pi, acc); break;
      case 3: tile<3>(arows, ascale, ac, w, pi, acc); break;
      case 2: tile<2>(arows, ascale, ac, w, pi, acc); break;
      default: tile<1>(arows, ascale, ac, w, pi, acc); break;
    }
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < kPanel; ++l) {
        const int64_t j = pi * kPanel + l;
        if (j >= N) break;
        const float s = num::mul_rn(a.outer[size_t(i0 + r)], wdec.outer[size_t(j)]);
        d[size_t((i0 + r) * N + j)] = num::mul_rn(s, acc[r][l]);
      }
  }
  return d;
}

void check_pair(const GemmOperand& a, const GemmOperand& w) {
  if (a.n_cols() != w.n_cols())
    throw GemmError(fmt::format("K mismatch: A {} and W {} must have the same number of columns (K)", a.describe(),
                                w.describe()));
}

void check_epilogue(const GemmEpilogue& ep, int64_t M, int64_t N, int64_t bias_n, const std::string& what) {
  if (!ep.bias.empty() && int64_t(ep.bias.size()) != bias_n)
    throw GemmError(fmt::format("{}: bias has {} values, want {}", what, ep.bias.size(), bias_n));
  if (ep.swiglu && N % 2 != 0)
    throw GemmError(fmt::format("{}: swiglu needs an even N = 2I ([gate | up] halves), got N = {}", what, N));
  if (!ep.router_prob.empty() && int64_t(ep.router_prob.size()) != M)
    throw GemmError(fmt::format("{}: router_prob has {} values, want M = {}", what, ep.router_prob.size(), M));
  if (!ep.router_prob.empty() && !ep.swiglu)
    throw GemmError(fmt::format("{}: router_prob is applied by the swiglu epilogue; enable swiglu", what));
}

}  // namespace

double gemm_gamma(int64_t n) {
  const double nu = double(n) * 0x1p-24;
  return nu / (1.0 - nu);
}

GemmResult apply_gemm_epilogue(std::span<const float> d, int64_t rows, int64_t n, const GemmEpilogue& ep,
                               int64_t prob_row0, int64_t bias_offset) {
  GemmResult out;
  out.rows = rows;
  out.cols = ep.swiglu ? n / 2 : n;
  const int64_t oc = out.cols;
  out.d.resize(size_t(rows * oc));
  if (ep.out_bf16) out.d_bf16.resize(size_t(rows * oc));
  if (ep.row_amax) out.row_amax.resize(size_t(rows));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* di = d.data() + i * n;
    auto value = [&](int64_t j) {
      float v = num::mul_rn(ep.alpha, di[j]);
      if (!ep.bias.empty()) v = num::add_rn(v, ep.bias[size_t(bias_offset + j)]);
      return v;
    };
    float amax = num::amax_empty();
    for (int64_t c = 0; c < oc; ++c) {
      float y;
      if (ep.swiglu) {
        const float p = ep.router_prob.empty() ? 1.0f : ep.router_prob[size_t(prob_row0 + i)];
        y = num::swiglu_weighted_f32(value(c), value(oc + c), p);
      } else {
        y = value(c);
      }
      if (ep.out_bf16) {
        const uint16_t h = num::f32_to_bf16(y);
        out.d_bf16[size_t(i * oc + c)] = h;
        y = num::bf16_to_f32(h);
      }
      out.d[size_t(i * oc + c)] = y;
      amax = num::amax_fold(amax, y);
    }
    if (ep.row_amax) out.row_amax[size_t(i)] = oc == 0 ? 0.0f : amax;
  }
  return out;
}

GemmResult qgemm_cpu(const GemmOperand& a, const GemmOperand& w, const GemmEpilogue& ep) {
  check_pair(a, w);
  check_epilogue(ep, a.n_rows(), w.n_rows(), w.n_rows(), fmt::format("qgemm A {} x W {}", a.describe(), w.describe()));
  const DecodedOperand ad = decode_gemm_operand(a);
  const DecodedOperand wd = decode_gemm_operand(w);
  const PackedW wp = pack_w(wd);
  const std::vector<float> d = gemm_core(ad, wd, wp);
  return apply_gemm_epilogue(d, ad.rows, wd.rows, ep);
}

GemmResult grouped_qgemm_cpu(const GemmOperand& a, std::span<const int64_t> offsets, const GemmOperand& w,
                             const GemmEpilogue& ep, std::span<const int64_t> group_rows) {
  check_pair(a, w);
  const std::string what = fmt::format("grouped_qgemm A {} x W {}", a.describe(), w.describe());
  if (offsets.size() < 2)
    throw GemmError(fmt::format("{}: offsets need experts + 1 >= 2 entries, got {}", what, offsets.size()));
  const int64_t E = int64_t(offsets.size()) - 1;
  if (offsets.front() != 0 || offsets.back() != a.n_rows())
    throw GemmError(fmt::format("{}: offsets must start at 0 and end at A's rows {} (got {} .. {})", what, a.n_rows(),
                                offsets.front(), offsets.back()));
  for (int64_t e = 0; e < E; ++e)
    if (offsets[size_t(e + 1)] < offsets[size_t(e)])
      throw GemmError(fmt::format("{}: offsets decrease at group {} ({} > {})", what, e, offsets[size_t(e)],
                                  offsets[size_t(e + 1)]));
  if (w.n_rows() % E != 0)
    throw GemmError(fmt::format("{}: W rows {} are not experts ({}) x N", what, w.n_rows(), E));
  const int64_t N = w.n_rows() / E;
  if (!group_rows.empty()) {
    if (int64_t(group_rows.size()) != E)
      throw GemmError(fmt::format("{}: group_rows has {} entries, want {}", what, group_rows.size(), E));
    for (int64_t e = 0; e < E; ++e)
      if (group_rows[size_t(e)] < 0 || group_rows[size_t(e)] > offsets[size_t(e + 1)] - offsets[size_t(e)])
        throw GemmError(fmt::format("{}: group {} has {} rows but group_rows says {}", what, e,
                                    offsets[size_t(e + 1)] - offsets[size_t(e)], group_rows[size_t(e)]));
  }
  check_epilogue(ep, a.n_rows(), N, E * N, what);
  const DecodedOperand ad_all = decode_gemm_operand(a);
  GemmResult out;
  out.rows = a.n_rows();
  out.cols = ep.swiglu ? N / 2 : N;
  out.d.assign(size_t(out.rows * out.cols), 0.0f);
  if (ep.out_bf16) out.d_bf16.assign(out.d.size(), 0);
  if (ep.row_amax) out.row_amax.assign(size_t(out.rows), 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[size_t(e)];
    const int64_t rows = group_rows.empty() ? offsets[size_t(e + 1)] - r0 : group_rows[size_t(e)];
    const DecodedOperand wd = decode_gemm_operand(w, e * N, N);  // validates W even for empty groups
    if (rows == 0) continue;
    DecodedOperand ad;
    ad.rows = rows;
    ad.cols = ad_all.cols;
    ad.inner.assign(ad_all.inner.begin() + r0 * ad.cols, ad_all.inner.begin() + (r0 + rows) * ad.cols);
    ad.outer.assign(ad_all.outer.begin() + r0, ad_all.outer.begin() + r0 + rows);
    ad.chunked = ad_all.chunked;
    ad.chunks = ad_all.chunks;
    if (ad.chunked)
      ad.chunk_scale.assign(ad_all.chunk_scale.begin() + r0 * ad.chunks, ad_all.chunk_scale.begin() + (r0 + rows) * ad.chunks);
    const std::vector<float> d = gemm_core(ad, wd, pack_w(wd));
    const GemmResult g = apply_gemm_epilogue(d, rows, N, ep, r0, e * N);
    std::copy(g.d.begin(), g.d.end(), out.d.begin() + r0 * out.cols);
    if (ep.out_bf16) std::copy(g.d_bf16.begin(), g.d_bf16.end(), out.d_bf16.begin() + r0 * out.cols);
    if (ep.row_amax) std::copy(g.row_amax.begin(), g.row_amax.end(), out.row_amax.begin() + r0);
  }
  return out;
}

}  // namespace lockstep
