// The deterministic CPU GEMM (fp32, the accumulation order of docs/gemm.md), the shared epilogue,
// the grouped (MoE) GEMMs and the float64 path for dense F64 operands. Blocking is over output rows
// and columns only, never over k, so every output element runs the same chain of fp32 operations
// whatever M, threads or tiles.
#include "qgemm_cpu.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "../tensor/cpu_parallel.h"
#include "lockstep/numerics/hd.h"
#include "lockstep/numerics/transcendental.h"

namespace lockstep::gemm {
namespace {
// Below this much work a loop runs on one thread: a parallel region costs microseconds, and the
// OpenMP if clause changes only how many threads run it, never a value.

constexpr int kPanel = 16;  // W rows per packed panel (vector lanes: one output element each)
constexpr int kRowBlock = 4;

}  // namespace

PackedW pack_w(const DecodedOperand& w) {
  PackedW p;
  p.n = w.rows;
  p.k = w.cols;
  p.panels = (w.rows + kPanel - 1) / kPanel;
  p.chunks = w.chunks;
  p.inner.assign(size_t(p.panels * p.k * kPanel), 0.0f);
  if (w.chunked) p.chunk_scale.assign(size_t(p.panels * p.chunks * kPanel), 1.0f);
#pragma omp parallel for schedule(static) if (p.n * p.k >= lockstep::detail::kParallelMinWork)
  for (int64_t pi = 0; pi < p.panels; ++pi)
    for (int l = 0; l < kPanel; ++l) {
      const int64_t j = pi * kPanel + l;
      if (j >= w.rows) break;
      for (int64_t k = 0; k < p.k; ++k)
        p.inner[size_t((pi * p.k + k) * kPanel + l)] = w.inner[size_t(j * p.k + k)];
      for (int64_t c = 0; c < p.chunks; ++c)
        p.chunk_scale[size_t((pi * p.chunks + c) * kPanel + l)] =
            w.chunk_scale[size_t(j * p.chunks + c)];
    }
  return p;
}

// One tile: R rows of A (a row pointers) x one W panel. acc = the docs/gemm.md chain:
//   plain:   acc = +0; for k ascending: acc = RN(acc + RN(ia_k * iw_k))
//   chunked: acc = +0; per chunk c: p = +0; for k in c ascending: p = RN(p + RN(ia_k * iw_k));
//            acc = RN(acc + RN(p * RN(sa_c * sw_c)))    (sa_c = 1 / sw_c = 1 for unchunked sides)
// Host code is built with -ffp-contract=off, so `x + a * b` is two roundings, never an FMA.
namespace {

template <int R>
[[gnu::always_inline]] inline void tile(const float* const* arows, const float* const* ascale,
                                        int64_t a_chunks, const PackedW& w, int64_t pi,
                                        float (&acc)[kRowBlock][kPanel]) {
  const float* wp = w.inner.data() + pi * w.k * kPanel;
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < kPanel; ++l) acc[r][l] = 0.0f;
  const bool chunked = a_chunks > 0 || w.chunks > 0;
  if (!chunked) {
    // One 16-lane vector accumulator per row (GCC vector extension: zmm, 2 ymm or 4 xmm by the
    // clone's target); lane l performs exactly acc = RN(acc + RN(a_k * w_k)) in ascending k.
    typedef float V16 __attribute__((vector_size(64)));
    V16 v[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) v[r] = V16{};
    for (int64_t k = 0; k < w.k; ++k) {
      V16 wk;
      std::memcpy(&wk, wp + k * kPanel, sizeof wk);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) v[r] = v[r] + arows[r][k] * wk;
    }
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < kPanel; ++l) acc[r][l] = v[r][l];
    return;
  }
  const int64_t chunks = w.k / kChunk;
  for (int64_t c = 0; c < chunks; ++c) {
    float part[kRowBlock][kPanel];
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < kPanel; ++l) part[r][l] = 0.0f;
    for (int64_t k = c * kChunk; k < (c + 1) * kChunk; ++k) {
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

}  // namespace

// Raw D [a.rows, w.n] = RN(RN(outer_a * outer_w) * acc) for decoded A and packed W. Compiled for
// several instruction sets (chosen at load time); every clone performs the same rounded operations
// in the same order (no contraction: -ffp-contract=off), only the vector width differs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
[[gnu::target_clones("avx512f", "avx2", "default")]]
#endif
void gemm_core(const DecodedOperand& a, const DecodedOperand& wdec, const PackedW& w, float* d,
               int64_t a0, int64_t M) {
  if (M < 0) M = a.rows - a0;
  const int64_t N = w.n;
  const int64_t row_blocks = (M + kRowBlock - 1) / kRowBlock;
  const int64_t tiles = row_blocks * w.panels;
#pragma omp parallel for schedule(dynamic, \
                                  4) if (M * N * w.k >= 8 * lockstep::detail::kParallelMinWork)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rb = t / w.panels, pi = t % w.panels;
    const int64_t i0 = rb * kRowBlock;
    const int R = int(std::min<int64_t>(kRowBlock, M - i0));
    const float* arows[kRowBlock];
    const float* ascale[kRowBlock];
    for (int r = 0; r < R; ++r) {
      arows[r] = a.inner.data() + (a0 + i0 + r) * a.cols;
      ascale[r] = a.chunked ? a.chunk_scale.data() + (a0 + i0 + r) * a.chunks : nullptr;
    }
    float acc[kRowBlock][kPanel];
    const int64_t ac = a.chunked ? a.chunks : 0;
    switch (R) {
      case 4:
        tile<4>(arows, ascale, ac, w, pi, acc);
        break;
      case 3:
        tile<3>(arows, ascale, ac, w, pi, acc);
        break;
      case 2:
        tile<2>(arows, ascale, ac, w, pi, acc);
        break;
      default:
        tile<1>(arows, ascale, ac, w, pi, acc);
        break;
    }
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < kPanel; ++l) {
        const int64_t j = pi * kPanel + l;
        if (j >= N) break;
        const float s = num::mul_rn(a.outer[size_t(a0 + i0 + r)], wdec.outer[size_t(j)]);
        d[size_t((i0 + r) * N + j)] = num::mul_rn(s, acc[r][l]);
      }
  }
}

void gemm_decoded_rows_into(const DecodedOperand& a, int64_t a0, int64_t rows,
                            const DecodedOperand& w, float* d) {
  gemm_core(a, w, pack_w(w), d, a0, rows);
}

// One fp32 GEMM of decoded operands: raw D [a.rows, w.rows].
std::vector<float> gemm_decoded(const DecodedOperand& a, const DecodedOperand& w) {
  std::vector<float> d(static_cast<size_t>(a.rows * w.rows));
  gemm_core(a, w, pack_w(w), d.data(), 0, -1);
  return d;
}

// Plain float64 GEMM, ascending k: D [M, N] = A [M, K] W[N, K]^T.
std::vector<double> gemm_f64(const double* a, const double* w, int64_t M, int64_t N, int64_t K) {
  std::vector<double> d(size_t(M * N));
#pragma omp parallel for schedule(static) if (M * N * K >= 8 * lockstep::detail::kParallelMinWork)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += a[i * K + k] * w[j * K + k];
      d[size_t(i * N + j)] = acc;
    }
  return d;
}

std::vector<float> host_floats(const Tensor& t) {
  return t.defined() ? to_f32(t.to(Device::cpu())) : std::vector<float>{};
}

EpilogueOut apply_epilogue(std::span<const float> d, int64_t rows, int64_t n,
                           const EpilogueArgs& ep) {
  EpilogueOut out;
  out.cols = ep.swiglu ? n / 2 : n;
  const int64_t oc = out.cols;
  out.d.resize(size_t(rows * oc));
  if (ep.row_amax) out.row_amax.resize(size_t(rows));
#pragma omp parallel for schedule(static) if (rows * n >= lockstep::detail::kParallelMinWork)
  for (int64_t i = 0; i < rows; ++i) {
    const float* di = d.data() + i * n;
    auto value = [&](int64_t j) {
      float v = num::mul_rn(ep.alpha, di[j]);
      if (!ep.bias.empty()) v = num::add_rn(v, ep.bias[size_t(ep.bias_offset + j)]);
      return v;
    };
    float amax = num::amax_empty();
    for (int64_t c = 0; c < oc; ++c) {
      float y;
      if (ep.swiglu) {
        const float p = ep.router_prob.empty() ? 1.0f : ep.router_prob[size_t(ep.prob_row0 + i)];
        y = num::swiglu_weighted_f32(value(c), value(oc + c), p);
      } else {
        y = value(c);
      }
      if (ep.out_bf16) y = num::bf16_to_f32(num::f32_to_bf16(y));
      out.d[size_t(i * oc + c)] = y;
      if (ep.row_amax) amax = num::amax_fold(amax, y);
    }
    if (ep.row_amax) out.row_amax[size_t(i)] = oc == 0 ? 0.0f : amax;
  }
  return out;
}

void check_epilogue(const GemmEpilogue& ep, int64_t M, int64_t N, int64_t bias_n,
                    const std::string& what) {
  if (ep.bias.defined() && ep.bias.numel() != bias_n)
    throw GemmError(fmt::format("{}: bias has {} values, want {}", what, ep.bias.numel(), bias_n));
  if (ep.swiglu && N % 2 != 0)
    throw GemmError(
        fmt::format("{}: swiglu needs an even N = 2I ([gate | up] halves), got N = {}", what, N));
  if (ep.router_prob.defined() && ep.router_prob.numel() != M)
    throw GemmError(
        fmt::format("{}: router_prob has {} values, want M = {}", what, ep.router_prob.numel(), M));
  if (ep.router_prob.defined() && !ep.swiglu)
    throw GemmError(
        fmt::format("{}: router_prob is applied by the swiglu epilogue; enable swiglu", what));
}

GemmResult make_result(EpilogueOut&& e, int64_t rows, DType out_dtype, bool row_amax) {
  GemmResult r;
  r.d = from_f32(e.d, {rows, e.cols}, out_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32);
  if (row_amax) r.row_amax = from_f32(e.row_amax, {rows});
  r.kernel = GemmKernel::kCpu;
  return r;
}

GemmResult qgemm_cpu(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg) {
  const std::string what =
      fmt::format("qgemm A {} x W {}", a.describe(cfg.a_copy, "a"), w.describe(cfg.w_copy, "w"));
  const int64_t M = a.rows(cfg.a_copy), N = w.rows(cfg.w_copy), K = a.cols(cfg.a_copy);
  if (K != w.cols(cfg.w_copy))
    throw GemmError(
        fmt::format("{}: K mismatch (A has {} columns, W {})", what, K, w.cols(cfg.w_copy)));
  check_epilogue(cfg.epilogue, M, N, N, what);
  const bool f64 = !a.quantized() && !w.quantized() &&
                   (a.t().dtype() == DType::kF64 || w.t().dtype() == DType::kF64);
  if (f64) {
    if (a.t().dtype() != w.t().dtype())
      throw GemmError(fmt::format("{}: the float64 path needs both operands F64", what));
    if (cfg.epilogue.swiglu || cfg.epilogue.row_amax || cfg.epilogue.router_prob.defined())
      throw GemmError(fmt::format("{}: the float64 path takes alpha and bias only", what));
    const std::vector<double> av = dense_f64(a, cfg.a_copy), wv = dense_f64(w, cfg.w_copy);
    std::vector<double> d = gemm_f64(av.data(), wv.data(), M, N, K);
    std::vector<double> bias;
    if (cfg.epilogue.bias.defined()) {
      const Tensor b = cast(cfg.epilogue.bias.to(Device::cpu()), DType::kF64).contiguous();
      bias.assign(b.data<double>().begin(), b.data<double>().end());
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double& v = d[size_t(i * N + j)];
        v = double(cfg.epilogue.alpha) * v;
        if (!bias.empty()) v += bias[size_t(j)];
      }
    GemmResult r;
    r.d = Tensor::from_vector<double>(d, {M, N}, DType::kF64);
    r.kernel = GemmKernel::kCpu;
    return r;
  }
  const DecodedOperand ad = decode_operand(a, cfg.a_copy, 0, M, "a");
  const DecodedOperand wd = decode_operand(w, cfg.w_copy, 0, N, "w");
  const GemmEpilogue& e = cfg.epilogue;
  if (e.alpha == 1.0f && !e.bias.defined() && !e.swiglu && !e.row_amax &&
      cfg.out_dtype == DType::kF32) {
    // The epilogue is the identity (RN(1 * v) = v): write D straight into the result.
    GemmResult r;
    r.d = Tensor::empty(DType::kF32, {M, N});
    gemm_core(ad, wd, pack_w(wd), r.d.ptr<float>(), 0, -1);
    r.kernel = GemmKernel::kCpu;
    return r;
  }
  const std::vector<float> d = gemm_decoded(ad, wd);
  const std::vector<float> bias = host_floats(cfg.epilogue.bias),
                           prob = host_floats(cfg.epilogue.router_prob);
  EpilogueArgs ep{cfg.epilogue.alpha,
                  bias,
                  cfg.epilogue.swiglu,
                  prob,
                  cfg.out_dtype == DType::kBF16,
                  cfg.epilogue.row_amax,
                  0,
                  0};
  return make_result(apply_epilogue(d, M, N, ep), M, cfg.out_dtype, cfg.epilogue.row_amax);
}

}  // namespace lockstep::gemm
