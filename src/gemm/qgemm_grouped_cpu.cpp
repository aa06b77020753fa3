// The grouped (MoE) GEMMs on the CPU: groups along M (fprop, dgrad: each group's rows times its own
// W) and groups along K (wgrad: D_e = A_e^T W_e). Each group runs the same fp32 chain as a dense
// call on its rows, so a group's output equals the dense GEMM of that group bit for bit.
#include <fmt/format.h>

#include <algorithm>

#include "qgemm_cpu.h"

namespace lockstep::gemm {
namespace {

void check_offsets(std::span<const int64_t> offsets, int64_t rows, const std::string& what) {
  if (offsets.size() < 2)
    throw GemmError(
        fmt::format("{}: offsets need groups + 1 >= 2 entries, got {}", what, offsets.size()));
  if (offsets.front() != 0 || offsets.back() != rows)
    throw GemmError(
        fmt::format("{}: offsets must start at 0 and end at the {} grouped rows (got {} .. {})",
                    what, rows, offsets.front(), offsets.back()));
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (offsets[e + 1] < offsets[e])
      throw GemmError(fmt::format("{}: offsets decrease at group {} ({} > {})", what, e, offsets[e],
                                  offsets[e + 1]));
}

bool is_f64(const GemmArg& x) { return !x.quantized() && x.t().dtype() == DType::kF64; }

// Group e of a grouped operand, as an operand of its own (a view).
struct GroupOperand {
  QTensor q;
  Tensor t;
  GemmArg arg() const { return t.defined() ? GemmArg(t) : GemmArg(q); }
};

GroupOperand group_of(const GemmArg& x, std::span<const int64_t> offsets, int64_t e,
                      const std::string& what) {
  GroupOperand g;
  if (!x.quantized()) {
    g.t = x.t().slice_rows(offsets[size_t(e)], offsets[size_t(e + 1)]);
    return g;
  }
  const QTensor& q = x.q();
  if (!std::equal(q.group_offsets.begin(), q.group_offsets.end(), offsets.begin(), offsets.end()))
    throw GemmError(
        fmt::format("{}: the quantized operand's group offsets do not match the call's offsets "
                    "(quantize it with quantize_grouped and the same offsets)",
                    what));
  g.q = group_view(q, e);
  return g;
}

std::vector<int64_t> host_i64(const Tensor& t, size_t n, const std::string& what,
                              const char* which) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  if (h.dtype() != DType::kI64 || h.dim() != 1 || (n != size_t(-1) && size_t(h.numel()) != n))
    throw GemmError(fmt::format("{}: {} must be a 1-D I64 tensor{}, got {}", what, which,
                                n == size_t(-1) ? "" : fmt::format(" of {} entries", n),
                                h.describe()));
  auto v = h.data<int64_t>();
  return {v.begin(), v.end()};
}

// Groups along K: D_e = A_e^T W_e, output [groups * Na, Nw].
GemmResult k_grouped(const GemmArg& a, std::span<const int64_t> offsets, const GemmArg& w,
                     const GemmConfig& cfg, const std::string& what) {
  if (cfg.w_copy != Copy::kColwise)
    throw GemmError(
        fmt::format("{}: groups along K (a_copy = colwise) need w_copy = colwise as well", what));
  const GemmEpilogue& ep = cfg.epilogue;
  if (ep.bias.defined() || ep.swiglu || ep.router_prob.defined() || cfg.group_rows.defined())
    throw GemmError(fmt::format("{}: groups along K take alpha and row_amax only", what));
  const int64_t rows = a.rows(Copy::kRowwise);
  if (w.rows(Copy::kRowwise) != rows)
    throw GemmError(fmt::format("{}: A and W must have the same grouped rows ({} and {})", what,
                                rows, w.rows(Copy::kRowwise)));
  check_offsets(offsets, rows, what);
  const int64_t E = int64_t(offsets.size()) - 1, Na = a.cols(Copy::kRowwise),
                Nw = w.cols(Copy::kRowwise);
  if (is_f64(a) || is_f64(w)) {
    if (!is_f64(a) || !is_f64(w))
      throw GemmError(fmt::format("{}: the float64 path needs both operands F64", what));
    std::vector<double> out(size_t(E * Na * Nw), 0.0);
    for (int64_t e = 0; e < E; ++e) {
      const GroupOperand ag = group_of(a, offsets, e, what), wg = group_of(w, offsets, e, what);
      const std::vector<double> av = dense_f64(ag.arg(), Copy::kColwise),
                                wv = dense_f64(wg.arg(), Copy::kColwise);
      const int64_t K = offsets[size_t(e + 1)] - offsets[size_t(e)];
      const std::vector<double> d = gemm_f64(av.data(), wv.data(), Na, Nw, K);
      for (size_t i = 0; i < d.size(); ++i) out[size_t(e * Na * Nw) + i] = double(ep.alpha) * d[i];
    }
    GemmResult r;
    r.d = Tensor::from_vector<double>(out, {E * Na, Nw}, DType::kF64);
    r.kernel = GemmKernel::kCpu;
    return r;
  }
  std::vector<float> raw(size_t(E * Na * Nw), 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const GroupOperand ag = group_of(a, offsets, e, what), wg = group_of(w, offsets, e, what);
    const DecodedOperand ad = decode_operand(ag.arg(), Copy::kColwise, 0, Na, "a");
    const DecodedOperand wd = decode_operand(wg.arg(), Copy::kColwise, 0, Nw, "w");
    const std::vector<float> d = gemm_decoded(ad, wd);
    std::copy(d.begin(), d.end(), raw.begin() + e * Na * Nw);
  }
  EpilogueArgs args{ep.alpha, {}, false, {}, cfg.out_dtype == DType::kBF16, ep.row_amax, 0, 0};
  return make_result(apply_epilogue(raw, E * Na, Nw, args), E * Na, cfg.out_dtype, ep.row_amax);
}

}  // namespace

GemmResult grouped_qgemm_cpu(const GemmArg& a, std::span<const int64_t> offsets, const GemmArg& w,
                             const GemmConfig& cfg) {
  const std::string what = fmt::format("grouped_qgemm A {} x W {}", a.describe(cfg.a_copy, "a"),
                                       w.describe(cfg.w_copy, "w"));
  if (cfg.a_copy == Copy::kColwise) return k_grouped(a, offsets, w, cfg, what);
  const int64_t rows = a.rows(Copy::kRowwise), K = a.cols(Copy::kRowwise);
  check_offsets(offsets, rows, what);
  const int64_t E = int64_t(offsets.size()) - 1;
  const int64_t N = grouped_w_rows_per_group(w, cfg.w_copy, E, K, what);
  std::vector<int64_t> w_offsets(size_t(E + 1));
  for (int64_t e = 0; e <= E; ++e)
    w_offsets[size_t(e)] = e * (cfg.w_copy == Copy::kRowwise ? N : K);
  std::vector<int64_t> tokens;
  if (cfg.group_rows.defined()) {
    tokens = host_i64(cfg.group_rows, size_t(E), what, "group_rows");
    for (int64_t e = 0; e < E; ++e)
      if (tokens[size_t(e)] < 0 || tokens[size_t(e)] > offsets[size_t(e + 1)] - offsets[size_t(e)])
        throw GemmError(fmt::format("{}: group {} has {} rows but group_rows says {}", what, e,
                                    offsets[size_t(e + 1)] - offsets[size_t(e)],
                                    tokens[size_t(e)]));
  }
  const GemmEpilogue& ep = cfg.epilogue;
  check_epilogue(ep, rows, N, E * N, what);
  auto w_group = [&](int64_t e, GroupOperand& g) -> Copy {
    if (cfg.w_copy == Copy::kRowwise) {
      if (w.quantized())
        g.q = w.q();
      else
        g.t = w.t();
      return Copy::kRowwise;
    }
    g = group_of(w, w_offsets, e, what);
    return Copy::kColwise;
  };
  const int64_t oc = ep.swiglu ? N / 2 : N;
  if (is_f64(a) || is_f64(w)) {
    if (!is_f64(a) || !is_f64(w))
      throw GemmError(fmt::format("{}: the float64 path needs both operands F64", what));
    if (ep.swiglu || ep.row_amax || ep.router_prob.defined())
      throw GemmError(fmt::format("{}: the float64 path takes alpha and bias only", what));
    const std::vector<double> av = dense_f64(a, Copy::kRowwise);
    std::vector<double> bias;
    if (ep.bias.defined()) {
      const Tensor b = cast(ep.bias.to(Device::cpu()), DType::kF64).contiguous();
      bias.assign(b.data<double>().begin(), b.data<double>().end());
    }
    std::vector<double> out(size_t(rows * N), 0.0);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[size_t(e)];
      const int64_t n_rows = tokens.empty() ? offsets[size_t(e + 1)] - r0 : tokens[size_t(e)];
      GroupOperand g;
      const Copy wc = w_group(e, g);
      std::vector<double> wv = dense_f64(g.arg(), wc);
      if (cfg.w_copy == Copy::kRowwise)
        wv = std::vector<double>(wv.begin() + e * N * K, wv.begin() + (e + 1) * N * K);
      const std::vector<double> d = gemm_f64(av.data() + r0 * K, wv.data(), n_rows, N, K);
      for (int64_t i = 0; i < n_rows; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double v = double(ep.alpha) * d[size_t(i * N + j)];
          if (!bias.empty()) v += bias[size_t(e * N + j)];
          out[size_t((r0 + i) * N + j)] = v;
        }
    }
    GemmResult r;
    r.d = Tensor::from_vector<double>(out, {rows, N}, DType::kF64);
    r.kernel = GemmKernel::kCpu;
    return r;
  }
  const DecodedOperand a_all = decode_operand(a, Copy::kRowwise, 0, rows, "a");
  // Identity epilogue: each group's rows are written straight into the result (padding rows past
  // group_rows stay +0).
  const bool identity = ep.alpha == 1.0f && !ep.bias.defined() && !ep.swiglu && !ep.row_amax &&
                        cfg.out_dtype == DType::kF32;
  GemmResult direct;
  if (identity)  // every row is written unless group_rows leaves padding rows (+0)
    direct.d =
        tokens.empty() ? Tensor::empty(DType::kF32, {rows, N}) : Tensor(DType::kF32, {rows, N});
  const std::vector<float> bias = host_floats(ep.bias), prob = host_floats(ep.router_prob);
  std::vector<float> out(identity ? 0 : size_t(rows * oc), 0.0f),
      amax(ep.row_amax ? size_t(rows) : 0, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[size_t(e)];
    const int64_t n_rows = tokens.empty() ? offsets[size_t(e + 1)] - r0 : tokens[size_t(e)];
    GroupOperand g;
    const Copy wc = w_group(e, g);
    // Validates W even for empty groups.
    const DecodedOperand wd =
        decode_operand(g.arg(), wc, cfg.w_copy == Copy::kRowwise ? e * N : 0, N, "w");
    if (n_rows == 0) continue;
    if (identity) {
      gemm_decoded_rows_into(a_all, r0, n_rows, wd, direct.d.ptr<float>() + r0 * N);
      continue;
    }
    std::vector<float> d(static_cast<size_t>(n_rows * N));
    gemm_decoded_rows_into(a_all, r0, n_rows, wd, d.data());
    EpilogueArgs args{ep.alpha,    bias, ep.swiglu, prob, cfg.out_dtype == DType::kBF16,
                      ep.row_amax, r0,   e * N};
    const EpilogueOut o = apply_epilogue(d, n_rows, N, args);
    std::copy(o.d.begin(), o.d.end(), out.begin() + r0 * oc);
    if (ep.row_amax) std::copy(o.row_amax.begin(), o.row_amax.end(), amax.begin() + r0);
  }
  if (identity) {
    direct.kernel = GemmKernel::kCpu;
    return direct;
  }
  EpilogueOut all{oc, std::move(out), std::move(amax)};
  return make_result(std::move(all), rows, cfg.out_dtype, ep.row_amax);
}

}  // namespace lockstep::gemm
