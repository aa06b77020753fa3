// The CUDA backend of qgemm and grouped_qgemm (qgemm_cuda_entry.h): device operands made into
// kernel operands on the device (qgemm_operand_cuda.h), the group table from host or device
// offsets, the output and row amax as pool tensors, all ordered on cfg.stream with no host wait.
// Compiles to nothing without LOCKSTEP_HAVE_CUDA.
#if defined(LOCKSTEP_HAVE_CUDA)
#include "qgemm_cuda_entry.h"

#include <fmt/format.h>

#include <algorithm>

#include "qgemm_cpu.h"
#include "qgemm_operand_cuda.h"

namespace lockstep::cuda {
namespace {

const float* epilogue_tensor(const Tensor& t, Device dev, const std::string& what,
                             const char* name) {
  if (!t.defined()) return nullptr;
  if (t.dtype() != DType::kF32 || !t.is_contiguous() || t.device() != dev)
    throw GemmError(fmt::format("{}: epilogue {} must be a contiguous F32 tensor on {} (got {})",
                                what, name, dev.str(), t.describe()));
  return t.ptr<float>();
}

DeviceEpilogue device_epilogue(const GemmConfig& cfg, Device dev, const std::string& what) {
  DeviceEpilogue ep;
  ep.alpha = cfg.epilogue.alpha;
  ep.swiglu = cfg.epilogue.swiglu;
  ep.out_bf16 = cfg.out_dtype == DType::kBF16;
  ep.bias = epilogue_tensor(cfg.epilogue.bias, dev, what, "bias");
  ep.router_prob = epilogue_tensor(cfg.epilogue.router_prob, dev, what, "router_prob");
  return ep;
}

// The output [rows, cols] of the call (dtype out_dtype) and its view.
struct Output {
  Tensor d;
  GemmOutView view(int64_t offset = 0) {
    GemmOutView v;
    if (d.dtype() == DType::kBF16)
      v.d_bf16 = d.ptr<uint16_t>() + offset;
    else
      v.d_f32 = d.ptr<float>() + offset;
    return v;
  }
};

GemmResult finish(Output& o, const GemmConfig& cfg, GemmVariant ran) {
  GemmResult r;
  r.d = o.d;
  r.kernel = gemm_kernel_of(ran);
  r.variant = gemm_variant_name(ran);
  if (cfg.epilogue.row_amax) {
    const int64_t rows = o.d.rows(), cols = o.d.cols();
    r.row_amax = Tensor::empty(DType::kF32, {rows}, o.d.device(), cfg.stream);
    launch_row_amax(o.d.raw(), o.d.dtype() == DType::kBF16, rows, cols, r.row_amax.ptr<float>(),
                    cu(cfg.stream));
  }
  return r;
}

void check_device(const GemmArg& x, const std::string& what) {
  if (!x.device().is_cuda())
    throw GemmError(fmt::format("{}: the CUDA GEMM takes device operands", what));
}

std::vector<int64_t> host_i64(const Tensor& t, const std::string& what, const char* which) {
  if (t.dtype() != DType::kI64 || t.dim() != 1)
    throw GemmError(
        fmt::format("{}: {} must be a 1-D I64 tensor, got {}", what, which, t.describe()));
  const Tensor h = t.contiguous();
  auto v = h.data<int64_t>();
  return {v.begin(), v.end()};
}

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

bool chunked(const GemmArg& x) {
  return x.quantized() && x.q().format == Format::kFp8 &&
         (x.q().scaling == Scaling::kBlock1x128 || x.q().scaling == Scaling::kBlock128x128);
}

// Groups along K (wgrad): D_e = A_e^T W_e per group, looping over the groups on the host (each
// group's K is its row count, padded with zero elements to a multiple of 64 for the kernels).
GemmResult k_grouped(const GemmArg& a, const Tensor& offsets, const GemmArg& w,
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
  // The group sizes are needed on the host: from a host offsets tensor, else from the quantized
  // operands' own (host) group offsets, which the call's offsets must equal.
  std::vector<int64_t> off;
  if (offsets.is_cpu()) {
    off = host_i64(offsets, what, "offsets");
  } else {
    for (const GemmArg* x : {&a, &w})
      if (off.empty() && x->quantized()) off = x->q().group_offsets;
    if (off.empty())
      throw GemmError(fmt::format(
          "{}: groups along K loop over the groups on the host: pass the offsets as a host "
          "tensor (the offsets are on {} and no operand carries host group offsets)",
          what, offsets.device().str()));
  }
  check_offsets(off, rows, what);
  for (const GemmArg* x : {&a, &w})
    if (x->quantized() && x->q().group_offsets != off)
      throw GemmError(
          fmt::format("{}: the quantized operand's group offsets do not match the call's offsets "
                      "(quantize it with quantize_grouped and the same offsets)",
                      what));
  const int64_t E = int64_t(off.size()) - 1, Na = a.cols(Copy::kRowwise),
                Nw = w.cols(Copy::kRowwise);
  const Device dev = a.device();
  Output o{Tensor::empty(cfg.out_dtype, {E * Na, Nw}, dev, cfg.stream)};
  DeviceEpilogue dep;
  dep.alpha = ep.alpha;
  dep.out_bf16 = cfg.out_dtype == DType::kBF16;
  const int64_t granule = chunked(a) || chunked(w) ? 128 : 64;
  GemmVariant kernel = GemmVariant::kAuto;
  const int64_t dense_off[2] = {0, Na};
  const DeviceGroupTable table = make_group_table(dense_off, 0, {}, dev, cfg.stream);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[size_t(e)], r1 = off[size_t(e + 1)],
                  kp = (r1 - r0 + granule - 1) / granule * granule;
    Scratch s(dev,
              cfg.stream);  // this group's padded pieces, returned to the pool after its launches
    auto piece = [&](const GemmArg& x, const char* name) {
      if (x.quantized()) {
        const QTensor g = group_view(x.q(), e);
        return prepare_operand(GemmArg(g), Copy::kColwise, name, s, kp);
      }
      const Tensor rows_e = x.t().slice_rows(r0, r1);
      return prepare_operand(GemmArg(rows_e), Copy::kColwise, name, s, kp);
    };
    const GemmOperandView av = piece(a, "a"), wv = piece(w, "w");
    kernel = qgemm_device(av, wv, Nw, table, dep, o.view(e * Na * Nw), s,
                          requested_variant(cfg, what), cfg.order, cu(cfg.stream));
  }
  return finish(o, cfg, kernel);
}

}  // namespace

GemmResult qgemm(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg) {
  const std::string what =
      fmt::format("qgemm A {} x W {}", a.describe(cfg.a_copy, "a"), w.describe(cfg.w_copy, "w"));
  check_device(a, what);
  const int64_t M = a.rows(cfg.a_copy), N = w.rows(cfg.w_copy), K = a.cols(cfg.a_copy);
  if (K != w.cols(cfg.w_copy))
    throw GemmError(
        fmt::format("{}: K mismatch (A has {} columns, W {})", what, K, w.cols(cfg.w_copy)));
  gemm::check_epilogue(cfg.epilogue, M, N, N, what);
  const Device dev = a.device();
  DeviceGuard guard(dev);
  Scratch s(dev, cfg.stream);
  const GemmOperandView av = prepare_operand(a, cfg.a_copy, "a", s),
                        wv = prepare_operand(w, cfg.w_copy, "w", s);
  const int64_t off[2] = {0, M};
  const DeviceGroupTable table = make_group_table(off, 0, {}, dev, cfg.stream);
  const DeviceEpilogue ep = device_epilogue(cfg, dev, what);
  Output o{Tensor::empty(cfg.out_dtype, {M, cfg.epilogue.swiglu ? N / 2 : N}, dev, cfg.stream)};
  const GemmVariant k = qgemm_device(av, wv, N, table, ep, o.view(), s,
                                     requested_variant(cfg, what), cfg.order, cu(cfg.stream));
  return finish(o, cfg, k);
}

GemmResult grouped_qgemm(const GemmArg& a, const Tensor& offsets, const GemmArg& w,
                         const GemmConfig& cfg) {
  const std::string what = fmt::format("grouped_qgemm A {} x W {}", a.describe(cfg.a_copy, "a"),
                                       w.describe(cfg.w_copy, "w"));
  check_device(a, what);
  const Device dev = a.device();
  DeviceGuard guard(dev);
  if (cfg.a_copy == Copy::kColwise) return k_grouped(a, offsets, w, cfg, what);
  const int64_t rows = a.rows(Copy::kRowwise), K = a.cols(Copy::kRowwise), E = offsets.numel() - 1;
  if (E < 1)
    throw GemmError(
        fmt::format("{}: offsets need groups + 1 >= 2 entries, got {}", what, offsets.numel()));
  if (!offsets.is_cpu() && offsets.device() != dev)
    throw GemmError(fmt::format("{}: offsets {} are on another device than the operands", what,
                                offsets.describe()));
  const int64_t N = gemm::grouped_w_rows_per_group(w, cfg.w_copy, E, K, what);
  gemm::check_epilogue(cfg.epilogue, rows, N, E * N, what);
  Scratch s(dev, cfg.stream);
  const GemmOperandView av = prepare_operand(a, Copy::kRowwise, "a", s);
  const GemmOperandView wv = cfg.w_copy == Copy::kRowwise
                                 ? prepare_operand(w, Copy::kRowwise, "w", s)
                                 : prepare_grouped_w_colwise(w, E, K, "w", s);
  // The group table: on the host when the offsets (and group_rows) are, else built on the device
  // with cfg.max_group_rows (or the row count) as the bound on rows per group.
  DeviceGroupTable table;
  const bool host_rows = !cfg.group_rows.defined() || cfg.group_rows.is_cpu();
  if (offsets.is_cpu() && host_rows) {
    const std::vector<int64_t> off = host_i64(offsets, what, "offsets");
    check_offsets(off, rows, what);
    std::vector<int64_t> tokens;
    if (cfg.group_rows.defined()) {
      tokens = host_i64(cfg.group_rows, what, "group_rows");
      if (int64_t(tokens.size()) != E)
        throw GemmError(fmt::format("{}: group_rows must be a 1-D I64 tensor of {} entries, got {}",
                                    what, E, cfg.group_rows.describe()));
      for (int64_t e = 0; e < E; ++e)
        if (tokens[size_t(e)] < 0 || tokens[size_t(e)] > off[size_t(e + 1)] - off[size_t(e)])
          throw GemmError(fmt::format("{}: group {} has {} rows but group_rows says {}", what, e,
                                      off[size_t(e + 1)] - off[size_t(e)], tokens[size_t(e)]));
    }
    if (a.quantized() && a.q().scaling == Scaling::kPerGroup && a.q().group_offsets != off)
      throw GemmError(
          fmt::format("{}: A's per_group offsets do not match the call's offsets", what));
    table = make_group_table(off, N, tokens, dev, cfg.stream);
  } else {
    // Host metadata goes up through kernel parameters (no staging copy that could wait).
    const Tensor d_off = offsets.is_cpu()
                             ? upload_i64(host_i64(offsets, what, "offsets"), dev, cfg.stream)
                             : offsets;
    if (d_off.dtype() != DType::kI64 || d_off.dim() != 1 || !d_off.is_contiguous())
      throw GemmError(fmt::format("{}: offsets must be a contiguous 1-D I64 tensor, got {}", what,
                                  offsets.describe()));
    Tensor d_tok;
    if (cfg.group_rows.defined()) {
      d_tok = cfg.group_rows.is_cpu()
                  ? upload_i64(host_i64(cfg.group_rows, what, "group_rows"), dev, cfg.stream)
                  : cfg.group_rows;
      if (d_tok.dtype() != DType::kI64 || d_tok.numel() != E || !d_tok.is_contiguous() ||
          d_tok.device() != dev)
        throw GemmError(fmt::format(
            "{}: group_rows must be a contiguous 1-D I64 tensor of {} entries on {}, got {}", what,
            E, dev.str(), cfg.group_rows.describe()));
    }
    const int64_t bound = cfg.max_group_rows >= 0 ? std::min(cfg.max_group_rows, rows) : rows;
    s.keep(d_off);
    if (d_tok.defined()) s.keep(d_tok);
    table = make_group_table_device(d_off.ptr<int64_t>(), int(E),
                                    d_tok.defined() ? d_tok.ptr<int64_t>() : nullptr, N, bound,
                                    rows, dev, cfg.stream);
  }
  const DeviceEpilogue ep = device_epilogue(cfg, dev, what);
  Output o{Tensor::empty(cfg.out_dtype, {rows, cfg.epilogue.swiglu ? N / 2 : N}, dev, cfg.stream)};
  const GemmVariant k = qgemm_device(av, wv, N, table, ep, o.view(), s,
                                     requested_variant(cfg, what), cfg.order, cu(cfg.stream));
  return finish(o, cfg, k);
}

}  // namespace lockstep::cuda
#endif  // LOCKSTEP_HAVE_CUDA
