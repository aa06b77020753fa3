// CUDA quantizers, host side: the call context and shared passes (quantize_cuda_plan.h), the
// rowwise copies of NVFP4, MXFP8 and FP8, and the entry points quantize / quantize_joint of
// quantize_cuda_entry.h. Output parts are pool tensors on the input's device, ordered on
// cfg.stream; validation has run in quantize.cpp. Compiles to nothing without LOCKSTEP_HAVE_CUDA.
#if defined(LOCKSTEP_HAVE_CUDA)
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"
#include "quantize_cuda_entry.h"
#include "quantize_cuda_plan.h"
#include "quantize_meta.h"

namespace lockstep::cuda {
namespace plan {

using namespace detail;

Input input_of(const Tensor& x, std::string_view name) {
  if (x.dim() != 2)
    throw QuantError(
        fmt::format("tensor '{}' {}: quantization takes 2-D tensors", name, x.describe()));
  if (x.dtype() != DType::kF32 && x.dtype() != DType::kBF16)
    throw QuantError(
        fmt::format("tensor '{}' {}: the CUDA quantizers take F32 or BF16 input (widen F16 first)",
                    name, x.describe()));
  if (!x.is_contiguous())
    throw QuantError(
        fmt::format("tensor '{}' {}: the CUDA quantizers read contiguous rows (a strided view "
                    "needs contiguous() first)",
                    name, x.describe()));
  Input in;
  in.ref = InputRef{x.raw(), x.dtype() == DType::kBF16, x.cols()};
  in.rows = x.rows();
  in.cols = x.cols();
  in.type_max = source_type_max(x.dtype());
  return in;
}

Ctx::Ctx(Device d, Stream s, std::span<const int64_t> offsets, int64_t rows)
    : dev(d), st(s), cs(cu(s)), scratch(d, s), grouped(!offsets.empty()) {
  if (grouped)
    off.assign(offsets.begin(), offsets.end());
  else
    off = {0, rows};
}

const int64_t* Ctx::d_off() {
  if (!d_off_p_) {
    d_off_ = upload_i64(off, dev, st);
    d_off_p_ = d_off_.ptr<int64_t>();
  }
  return d_off_p_;
}

int64_t Ctx::nbands() {
  if (!bands_made_) {
    sbase_.assign(size_t(groups() + 1), 0);
    for (int64_t g = 0; g < groups(); ++g) {
      const int64_t r0 = off[size_t(g)], r1 = off[size_t(g + 1)];
      for (int64_t r = r0; r < r1; r += kColTileRows)
        bands_.push_back(RowBand{r, int32_t(std::min<int64_t>(kColTileRows, r1 - r)), int32_t(g)});
      sbase_[size_t(g + 1)] = sbase_[size_t(g)] + (r1 - r0 + 127) / 128;
    }
    bands_made_ = true;
  }
  return int64_t(bands_.size());
}

const std::vector<int64_t>& Ctx::sbase() {
  nbands();
  return sbase_;
}

// One device buffer: [offsets (groups + 1 int64) | sbase (groups + 1 int64) | bands], one launch
// instead of one per table (each launch is host time a single call waits for).
void Ctx::upload_tile_meta() {
  nbands();
  static_assert(sizeof(RowBand) == 16, "two 64-bit words");
  const size_t n_off = off.size() * 2, n_sb = sbase_.size() * 2, n_b = bands_.size() * 4;
  std::vector<uint32_t> words(n_off + n_sb + n_b);
  std::memcpy(words.data(), off.data(), n_off * 4);
  std::memcpy(words.data() + n_off, sbase_.data(), n_sb * 4);
  std::memcpy(words.data() + n_off + n_sb, bands_.data(), n_b * 4);
  d_meta_ = Tensor::empty(DType::kU8, {int64_t(words.size() * 4)}, dev, st);
  upload_words(words.data(), words.size(), d_meta_.raw(), cs);
  const auto* base = static_cast<const uint32_t*>(d_meta_.raw());
  if (!d_off_p_) d_off_p_ = reinterpret_cast<const int64_t*>(base);
  d_sbase_p_ = reinterpret_cast<const int64_t*>(base + n_off);
  d_bands_p_ = reinterpret_cast<const RowBand*>(base + n_off + n_sb);
}

const RowBand* Ctx::bands() {
  if (!d_bands_p_) upload_tile_meta();
  return d_bands_p_;
}

const int64_t* Ctx::d_sbase() {
  if (!d_sbase_p_) upload_tile_meta();
  return d_sbase_p_;
}

uint32_t* Ctx::zero_keys(int64_t n) {
  uint32_t* k = scratch.get<uint32_t>(size_t(n));
  if (n > 0) LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(k, 0, size_t(n) * 4, cs));
  return k;
}

SrParams sr_of(const QuantConfig& c) { return SrParams{c.stochastic, c.seed, c.rng_stream}; }

float elem_max_of(const QuantConfig& c) {
  if (c.format == Format::kNvfp4) return num::kE2M1Max;
  return c.elem == ElemCodec::kE5M2 ? num::kE5M2Max : num::kE4M3Max;
}

Tensor alloc_scales(Ctx& c, int64_t srows, int64_t scols, ScaleLayout layout) {
  if (layout == ScaleLayout::kCompact) return c.u8({srows, scols});
  // Swizzled padding bytes must be zero; the kernels write every other byte.
  return Tensor(DType::kU8, {round_up(srows, 128) * round_up(scols, 4)}, c.dev, c.st);
}

ScaleOut scale_out(Tensor& t, int64_t scols, ScaleLayout layout) {
  return scale_view(t.ptr<uint8_t>(), scols, layout == ScaleLayout::kSwizzled);
}

Input hadamard_rows_into(Ctx& c, const Input& x) {
  Input h = x;
  uint16_t* out = c.scratch.get<uint16_t>(size_t(x.rows * x.cols));
  launch_hadamard(x.ref, x.rows, x.cols, out, /*out_bf16=*/true, c.cs);
  h.ref = InputRef{out, true, x.cols};
  return h;
}

Input hadamard_cols_into(Ctx& c, const Input& x) {
  Input h = x;
  uint16_t* out = c.scratch.get<uint16_t>(size_t(x.rows * x.cols));
  launch_hadamard_cols(x.ref, x.rows, x.cols, out, c.cs);
  h.ref = InputRef{out, true, x.cols};
  return h;
}

float* domain_pass(Ctx& c, const Input& x, int kind, int64_t ndom, int64_t tile_cols,
                   FinishParams f, const uint32_t* keys) {
  if (!keys) {
    uint32_t* k = c.zero_keys(ndom);
    AmaxParams a;
    a.rows = x.rows, a.cols = x.cols, a.nchunks = int((x.cols + 15) / 16), a.dom_kind = kind;
    a.offsets = kind == kDomGroup ? c.d_off() : nullptr, a.groups = c.groups(),
    a.tile_cols = tile_cols, a.keys = k;
    launch_domain_amax(x.ref, a, c.cs);
    keys = k;
  }
  f.ndom = ndom, f.keys = keys, f.cols = x.cols;
  f.offsets = kind == kDomGroup ? c.d_off() : nullptr;
  f.dom_val = c.scratch.get<float>(size_t(std::max<int64_t>(ndom, 1)));
  launch_finish(f, c.cs);
  return f.dom_val;
}

float* column_pass(Ctx& c, const Input& x, FinishParams f) {
  const int64_t ndom = c.groups() * x.cols;
  uint32_t* k = c.zero_keys(ndom);
  ColAmaxParams a;
  a.rows = x.rows, a.cols = x.cols, a.nchunks = int((x.cols + 15) / 16), a.offsets = c.d_off(),
  a.groups = c.groups();
  a.keys = k;
  launch_col_amax(x.ref, a, c.cs);
  f.ndom = ndom, f.keys = k, f.cols = x.cols, f.offsets = c.d_off(), f.dom_cols = x.cols;
  f.dom_val = c.scratch.get<float>(size_t(std::max<int64_t>(ndom, 1)));
  launch_finish(f, c.cs);
  return f.dom_val;
}

}  // namespace plan

namespace {
using namespace detail;
using plan::Ctx;
using plan::Input;

int64_t nvfp4_domains(const Ctx& c, const QuantConfig& cfg, int64_t rows) {
  if (cfg.scaling == Scaling::kPerRow) return rows;
  return cfg.scaling == Scaling::kPerGroup ? c.groups() : 1;
}

// NVFP4 rowwise copy of xr (x after the optional Hadamard transform). joint_keys: the shared key of
// a joint quantization. col2d (2-D blocks with a columnwise copy, its parts allocated): the kernel
// may write the columnwise copy from the same read, and then sets *col2d_written. Returns the A per
// domain for per tensor / per group scaling.
const float* nvfp4_rowwise(Ctx& c, const Input& xr, const QuantConfig& cfg, QData& out,
                           const uint32_t* joint_keys, bool joint_nonempty, QData* col2d = nullptr,
                           bool* col2d_written = nullptr) {
  const int64_t rows = xr.rows, cols = xr.cols, ndom = nvfp4_domains(c, cfg, rows);
  out.data = c.u8({rows, cols / 2});
  out.block_scale = plan::alloc_scales(c, rows, cols / 16, cfg.scale_layout);
  out.amax = c.f32({ndom});
  out.scale_rows = rows, out.scale_cols = cols / 16;
  const ScaleOut sc = plan::scale_out(out.block_scale, cols / 16, cfg.scale_layout);
  if (cfg.scaling == Scaling::kPerRow) {
    if (cols == 0)
      launch_fill_f32(out.amax.ptr<float>(), rows, 0.0f, c.cs);  // amax of nothing is 0
    RowParams p;
    p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.amax_mode = kAmaxRow;
    p.data = out.data.ptr<uint8_t>(), p.scale = sc, p.amax_out = out.amax.ptr<float>(),
    p.sr = plan::sr_of(cfg);
    launch_rows(xr.ref, RowFmt::kNvfp4, p, c.cs);
    return nullptr;
  }
  const int kind = cfg.scaling == Scaling::kPerGroup ? kDomGroup : kDomTensor;
  FinishParams f;
  f.tensor_nonempty = joint_keys ? joint_nonempty : rows * cols > 0;
  f.amax_out = out.amax.ptr<float>();
  const float* dom = plan::domain_pass(c, xr, kind, ndom, 0, f, joint_keys);
  if (rows == 0 || cols == 0) return dom;
  if (cfg.block2d) {
    Nvfp4TileParams p;
    p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.dom_kind = kind;
    p.dom_val = dom, p.offsets = kind == kDomGroup ? c.d_off() : nullptr, p.groups = c.groups();
    p.data = out.data.ptr<uint8_t>(), p.scale = sc, p.sr = plan::sr_of(cfg);
    if (col2d) {
      Nvfp4TileParams b = p;
      b.offsets = c.d_off(), b.bands = c.bands(), b.nbands = c.nbands();
      b.data_col = col2d->data.ptr<uint8_t>(), b.scale_col = col2d->block_scale.ptr<uint8_t>();
      b.scale_col_swizzled = !c.grouped && cfg.scale_layout == ScaleLayout::kSwizzled;
      if (launch_nvfp4_2d_both(xr.ref, b, c.cs)) {
        *col2d_written = true;
        return dom;
      }
    }
    launch_nvfp4_2d(xr.ref, p, c.cs);
    return dom;
  }
  RowParams p;
  p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.amax_mode = kAmaxDomain,
  p.dom_kind = kind;
  p.dom_val = dom, p.offsets = kind == kDomGroup ? c.d_off() : nullptr, p.groups = c.groups();
  p.data = out.data.ptr<uint8_t>(), p.scale = sc, p.sr = plan::sr_of(cfg);
  launch_rows(xr.ref, RowFmt::kNvfp4, p, c.cs);
  return dom;
}

// NVFP4, both copies. joint: the shared keys of a joint quantization (rowwise, columnwise).
void quantize_nvfp4(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q,
                    const uint32_t* joint_row = nullptr, const uint32_t* joint_col = nullptr,
                    bool joint_nonempty = false) {
  if (cfg.rowwise && cfg.colwise && !cfg.block2d && !cfg.hadamard &&
      cfg.scaling != Scaling::kPerRow) {
    plan::nvfp4_both_one_read(c, x, cfg, q, joint_row, joint_nonempty);
    return;
  }
  plan::RowwiseInfo ri;
  if (cfg.rowwise || (cfg.colwise && cfg.block2d)) {
    const Input xr = cfg.hadamard && x.rows * x.cols > 0 ? plan::hadamard_rows_into(c, x) : x;
    QData* col2d = cfg.colwise && cfg.block2d ? &q.colwise : nullptr;  // (no Hadamard with 2-D)
    if (col2d) plan::alloc_nvfp4_colwise(c, x.rows, x.cols, cfg, *col2d);
    ri.dom_amax =
        nvfp4_rowwise(c, xr, cfg, q.rowwise, joint_row, joint_nonempty, col2d, &ri.col2d_written);
    ri.same_values = !cfg.hadamard;
  }
  if (cfg.colwise) plan::nvfp4_colwise(c, x, cfg, q, ri, joint_col, joint_nonempty);
}

void quantize_mxfp8(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q) {
  const int64_t rows = x.rows, cols = x.cols;
  const bool e5m2 = cfg.elem == ElemCodec::kE5M2;
  if (cfg.rowwise) {
    q.rowwise.data = c.u8({rows, cols});
    q.rowwise.block_scale = plan::alloc_scales(c, rows, cols / 32, cfg.scale_layout);
    q.rowwise.scale_rows = rows, q.rowwise.scale_cols = cols / 32;
  }
  if (cfg.colwise) {
    q.colwise.data = c.u8({rows, cols});
    q.colwise.block_scale = c.u8({rows / 32, cols});
    q.colwise.scale_rows = rows / 32, q.colwise.scale_cols = cols;
  }
  if (rows == 0 || cols == 0) return;
  if (!cfg.colwise) {
    RowParams p;
    p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.amax_mode = kAmaxDomain;
    p.data = q.rowwise.data.ptr<uint8_t>(),
    p.scale = plan::scale_out(q.rowwise.block_scale, cols / 32, cfg.scale_layout);
    p.elem_max = plan::elem_max_of(cfg), p.e5m2 = e5m2, p.sr = plan::sr_of(cfg);
    launch_rows(x.ref, RowFmt::kMxfp8, p, c.cs);
    return;
  }
  MxTileParams p;
  p.rows = rows, p.cols = cols, p.rowwise = cfg.rowwise, p.colwise = true,
  p.elem_max = plan::elem_max_of(cfg);
  p.e5m2 = e5m2, p.sr = plan::sr_of(cfg);
  if (cfg.rowwise)
    p.data = q.rowwise.data.ptr<uint8_t>(),
    p.scale = plan::scale_out(q.rowwise.block_scale, cols / 32, cfg.scale_layout);
  p.data_col = q.colwise.data.ptr<uint8_t>(), p.scale_col = q.colwise.block_scale.ptr<uint8_t>();
  launch_mxfp8_tile(x.ref, p, c.cs);
}

}  // namespace

namespace plan {

void fp8_rowwise(Ctx& c, const Input& x, const QuantConfig& cfg, QData& o) {
  const int64_t rows = x.rows, cols = x.cols, tile_cols = (cols + 127) / 128;
  o.data = c.u8({rows, cols});
  int64_t sr = 1, sc = 1;
  switch (cfg.scaling) {
    case Scaling::kPerRow:
      sr = rows;
      break;
    case Scaling::kBlock1x128:
      sr = rows, sc = tile_cols;
      break;
    case Scaling::kBlock128x128:
      sr = (rows + 127) / 128, sc = tile_cols;
      break;
    case Scaling::kPerGroup:
      sr = c.groups();
      break;
    default:
      break;
  }
  o.scale_rows = sr, o.scale_cols = sc;
  o.scale_inv = c.f32({sr, sc});
  RowParams p;
  p.rows = rows, p.cols = cols, p.nchunks = int((cols + 15) / 16);
  p.data = o.data.ptr<uint8_t>(), p.elem_max = elem_max_of(cfg), p.eps = cfg.eps,
  p.type_max = x.type_max;
  p.pow2 = cfg.pow2, p.e5m2 = cfg.elem == ElemCodec::kE5M2, p.sr = sr_of(cfg);
  p.scale_inv_out = o.scale_inv.ptr<float>(), p.tile_cols = tile_cols;
  if (cfg.scaling == Scaling::kPerRow) {
    p.amax_mode = kAmaxRow;
    if (cols == 0)  // the amax of nothing is 0: the scale rule still applies (eps may raise it)
      launch_fill_f32(
          p.scale_inv_out, rows,
          num::fp8_scale_inv(num::fp8_scale(0.0f, p.elem_max, cfg.eps, x.type_max, cfg.pow2)),
          c.cs);
    launch_rows(x.ref, RowFmt::kFp8, p, c.cs);
    return;
  }
  if (cfg.scaling == Scaling::kBlock1x128) {
    p.amax_mode = kAmaxLanes8;
    launch_rows(x.ref, RowFmt::kFp8, p, c.cs);
    return;
  }
  // Domains that need an amax pass first: per tensor, per group, 128x128 tiles.
  const int kind = cfg.scaling == Scaling::kPerGroup       ? kDomGroup
                   : cfg.scaling == Scaling::kBlock128x128 ? kDomTile128
                                                           : kDomTensor;
  FinishParams f;
  f.tensor_nonempty = rows * cols > 0, f.fp8 = true, f.elem_max = p.elem_max, f.eps = cfg.eps,
  f.type_max = x.type_max;
  f.pow2 = cfg.pow2, f.scale_inv_out = p.scale_inv_out;
  p.dom_val = domain_pass(c, x, kind, sr * sc, tile_cols, f);
  p.amax_mode = kAmaxDomain, p.dom_kind = kind, p.groups = c.groups();
  p.offsets = kind == kDomGroup ? c.d_off() : nullptr;
  launch_rows(x.ref, RowFmt::kFp8, p, c.cs);
}

}  // namespace plan

QTensor quantize(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                 std::string_view name) {
  const Input in = plan::input_of(x, name);
  DeviceGuard guard(x.device());
  Ctx c(x.device(), cfg.stream, offsets, in.rows);
  // The columnwise tile kernels read the bands, the offsets and the block bases: one upload first.
  if (cfg.colwise && cfg.format != Format::kMxfp8 && in.rows * in.cols > 0) c.bands();
  QTensor q = quantized_meta(cfg, in.rows, in.cols, offsets);
  switch (cfg.format) {
    case Format::kNvfp4:
      quantize_nvfp4(c, in, cfg, q);
      break;
    case Format::kMxfp8:
      quantize_mxfp8(c, in, cfg, q);
      break;
    case Format::kFp8:
      if (cfg.colwise)
        plan::fp8_with_colwise(c, in, cfg, q);
      else
        plan::fp8_rowwise(c, in, cfg, q.rowwise);
      break;
    default:
      throw QuantError(
          fmt::format("tensor '{}': format {} is not quantized", name, format_name(cfg.format)));
  }
  if (!cfg.rowwise) q.rowwise = QData{};
  return q;
}

QTensor quantize_with_amax(const Tensor& x, std::span<const int64_t> offsets, const Tensor& amax,
                           const QuantConfig& cfg, std::string_view name) {
  const Input in = plan::input_of(x, name);
  DeviceGuard guard(x.device());
  Ctx c(x.device(), cfg.stream, offsets, in.rows);
  QTensor q = quantized_meta(cfg, in.rows, in.cols, offsets);
  const int64_t ndom = nvfp4_domains(c, cfg, in.rows);
  uint32_t* keys = c.zero_keys(ndom);
  launch_amax_keys(amax.ptr<float>(), keys, ndom, c.cs);
  nvfp4_rowwise(c, in, cfg, q.rowwise, keys, in.rows * in.cols > 0);
  return q;
}

std::vector<QTensor> quantize_joint(std::span<const Tensor> xs, const QuantConfig& cfg,
                                    std::span<const std::string> names) {
  std::vector<QTensor> out;
  if (xs.empty()) return out;
  auto name_of = [&](size_t i) { return names.empty() ? std::string("tensor") : names[i]; };
  std::vector<Input> ins;
  for (size_t i = 0; i < xs.size(); ++i) ins.push_back(plan::input_of(xs[i], name_of(i)));
  DeviceGuard guard(xs[0].device());
  Ctx shared(xs[0].device(), cfg.stream, {}, 0);
  // The joint amax is over what is quantized: after the optional Hadamard transform, and for the
  // columnwise copies over the values down the columns (the same values without the transform).
  uint32_t* keys_row = shared.zero_keys(1);
  uint32_t* keys_col = cfg.colwise && cfg.hadamard ? shared.zero_keys(1) : keys_row;
  int64_t count = 0;
  for (const Input& x : ins) {
    count += x.rows * x.cols;
    if (x.rows * x.cols == 0) continue;
    Ctx c(shared.dev, shared.st, {}, x.rows);
    AmaxParams a;
    a.dom_kind = kDomTensor, a.keys = keys_row;
    const Input xr = cfg.hadamard ? plan::hadamard_rows_into(c, x) : x;
    a.rows = xr.rows, a.cols = xr.cols, a.nchunks = int((xr.cols + 15) / 16);
    launch_domain_amax(xr.ref, a, c.cs);
    if (keys_col != keys_row) {
      const Input xc = plan::hadamard_cols_into(c, x);
      a.keys = keys_col;
      launch_domain_amax(xc.ref, a, c.cs);
    }
  }  // (each Ctx returns its scratch to the pool, ordered after the passes)
  for (size_t i = 0; i < ins.size(); ++i) {
    Ctx c(shared.dev, shared.st, {}, ins[i].rows);
    QTensor q = quantized_meta(cfg, ins[i].rows, ins[i].cols, {});
    quantize_nvfp4(c, ins[i], cfg, q, keys_row, keys_col, count > 0);
    if (!cfg.rowwise) q.rowwise = QData{};
    out.push_back(std::move(q));
  }
  return out;
}

}  // namespace lockstep::cuda
#endif  // LOCKSTEP_HAVE_CUDA
