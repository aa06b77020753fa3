// CUDA quantizers, host side: validation identical to the CPU reference, output allocation and
// metadata, which kernels run in which order, and the host convenience API of quantize_cuda.h.
// Built by the host compiler; compiles to nothing without LOCKSTEP_HAVE_CUDA.
#if defined(LOCKSTEP_HAVE_CUDA)
#include <fmt/format.h>

#include <algorithm>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"
#include "lockstep/quant/quantize_cuda.h"
#include "quantize_cuda_params.h"

namespace lockstep::cuda {
namespace {
using namespace detail;

std::string where(const DeviceMatrix& x) { return fmt::format("tensor '{}' [{}, {}]", x.name, x.rows, x.cols); }

// The same validation as the CPU reference, so both backends refuse the same inputs.
void validate(const DeviceMatrix& x, std::span<const int64_t> offsets, const QuantConfig& spec) {
  validate_quant_input(x.name, x.rows, x.cols, offsets, spec);
}

InputRef ref_of(const DeviceMatrix& x) { return InputRef{x.data, x.type == InputType::kBF16, x.cols}; }

ScaleOut scale_out(DeviceQTensor& q) {
  ScaleOut s;
  s.p = q.block_scale.as<uint8_t>();
  s.cols = q.meta.scale_cols;
  s.padded_cols = round_up(q.meta.scale_cols, 4);
  s.swizzled = q.meta.scale_layout == ScaleLayout::kSwizzled;
  return s;
}

void alloc_scales(DeviceQTensor& q, int64_t srows, int64_t scols, ScaleLayout layout, cudaStream_t st) {
  q.meta.scale_rows = srows;
  q.meta.scale_cols = scols;
  q.meta.scale_layout = layout;
  const size_t n = layout == ScaleLayout::kCompact ? size_t(srows * scols) : size_t(round_up(srows, 128) * round_up(scols, 4));
  q.block_scale.resize(n);
  // Swizzled padding bytes must be zero; the quantize kernel writes every other byte directly.
  if (layout == ScaleLayout::kSwizzled) q.block_scale.fill(0, st);
}

SrParams sr_of(const QuantConfig& s) { return SrParams{s.stochastic, s.seed, s.rng_stream}; }

float elem_max_of(const QuantConfig& s) {
  if (s.format == Format::kNvfp4) return num::kE2M1Max;
  return s.elem == ElemCodec::kE5M2 ? num::kE5M2Max : num::kE4M3Max;
}

void run_domain_amax(const DeviceMatrix& x, int kind, const int64_t* d_offsets, int64_t groups, int64_t tile_cols,
                     uint32_t* keys, cudaStream_t st) {
  AmaxParams a;
  a.rows = x.rows, a.cols = x.cols, a.nchunks = int((x.cols + 15) / 16), a.dom_kind = kind;
  a.offsets = d_offsets, a.groups = groups, a.tile_cols = tile_cols, a.keys = keys;
  launch_domain_amax(ref_of(x), a, st);
}

void prepare_nvfp4_output(DeviceQTensor& q, int64_t rows, int64_t cols, const QuantConfig& spec, int64_t ndom,
                          std::span<const int64_t> offsets, cudaStream_t st) {
  q.meta = QTensor{};
  q.meta.format = Format::kNvfp4;
  q.meta.scaling = spec.scaling;
  q.meta.elem = ElemCodec::kE4M3;
  q.meta.block2d = spec.block2d;
  q.meta.rows = rows;
  q.meta.cols = cols;
  q.meta.group_offsets.assign(offsets.begin(), offsets.end());
  q.data.resize(size_t(rows * cols / 2));
  alloc_scales(q, rows, cols / 16, spec.scale_layout, st);
  q.amax.resize(size_t(ndom) * sizeof(float));
  q.scale_inv.resize(0), q.data_colwise.resize(0), q.block_scale_colwise.resize(0);
}

RowParams nvfp4_row_params(int64_t rows, int64_t cols, const QuantConfig& spec, DeviceQTensor& q) {
  RowParams p;
  p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.amax_mode = kAmaxRow;
  p.data = q.data.as<uint8_t>(), p.scale = scale_out(q), p.amax_out = q.amax.as<float>(), p.sr = sr_of(spec);
  return p;
}

// NVFP4 with the outer amax already in q.ws_dom (per tensor / group / joint), or per row.
void quantize_nvfp4_body(const DeviceMatrix& x, const QuantConfig& spec, DeviceQTensor& q, const DeviceGroups* groups,
                         cudaStream_t st) {
  const int dom_kind = spec.scaling == Scaling::kPerGroup ? kDomGroup : kDomTensor;
  const int64_t* d_off = groups ? groups->device.as<int64_t>() : nullptr;
  const int64_t ng = groups ? groups->groups() : 0;
  if (spec.scaling == Scaling::kPerRow) {
    if (x.cols == 0) launch_fill_f32(q.amax.as<float>(), x.rows, 0.0f, st);  // amax of nothing is 0
    launch_rows(ref_of(x), RowFmt::kNvfp4, nvfp4_row_params(x.rows, x.cols, spec, q), st);
    return;
  }
  if (x.rows == 0 || x.cols == 0) return;
  if (spec.block2d) {
    Nvfp4TileParams p;
    p.rows = x.rows, p.cols = x.cols, p.nchunks = int(x.cols / 16), p.dom_kind = dom_kind;
    p.dom_val = q.ws_dom.as<float>(), p.offsets = d_off, p.groups = ng;
    p.data = q.data.as<uint8_t>(), p.scale = scale_out(q), p.sr = sr_of(spec);
    launch_nvfp4_2d(ref_of(x), p, st);
    return;
  }
  RowParams p;
  p.rows = x.rows, p.cols = x.cols, p.nchunks = int(x.cols / 16), p.amax_mode = kAmaxDomain, p.dom_kind = dom_kind;
  p.dom_val = q.ws_dom.as<float>(), p.offsets = d_off, p.groups = ng;
  p.data = q.data.as<uint8_t>(), p.scale = scale_out(q), p.sr = sr_of(spec);
  launch_rows(ref_of(x), RowFmt::kNvfp4, p, st);
}

void nvfp4_domain_amax(const DeviceMatrix& x, const QuantConfig& spec, DeviceQTensor& q, const DeviceGroups* groups,
                       cudaStream_t st) {
  const bool grouped = spec.scaling == Scaling::kPerGroup;
  const int64_t ndom = grouped ? groups->groups() : 1;
  const int64_t* d_off = grouped ? groups->device.as<int64_t>() : nullptr;
  q.ws_keys.resize(size_t(ndom) * 4);
  q.ws_keys.fill(0, st);
  q.ws_dom.resize(size_t(ndom) * 4);
  run_domain_amax(x, grouped ? kDomGroup : kDomTensor, d_off, grouped ? groups->groups() : 0, 0, q.ws_keys.as<uint32_t>(), st);
  FinishParams f;
  f.ndom = ndom, f.keys = q.ws_keys.as<uint32_t>(), f.offsets = d_off;
  f.cols = x.cols, f.tensor_nonempty = x.rows * x.cols > 0, f.dom_val = q.ws_dom.as<float>(), f.amax_out = q.amax.as<float>();
  launch_finish(f, st);
}

void quantize_mxfp8_body(const DeviceMatrix& x, const QuantConfig& spec, DeviceQTensor& q, cudaStream_t st) {
  const bool e5m2 = spec.elem == ElemCodec::kE5M2;
  if (x.rows == 0 || x.cols == 0) return;
  if (!spec.colwise) {
    RowParams p;
    p.rows = x.rows, p.cols = x.cols, p.nchunks = int(x.cols / 16), p.amax_mode = kAmaxDomain;
    p.data = q.data.as<uint8_t>(), p.scale = scale_out(q), p.elem_max = elem_max_of(spec), p.e5m2 = e5m2, p.sr = sr_of(spec);
    launch_rows(ref_of(x), RowFmt::kMxfp8, p, st);
    return;
  }
  MxTileParams p;
  p.rows = x.rows, p.cols = x.cols, p.rowwise = spec.rowwise, p.colwise = true, p.elem_max = elem_max_of(spec), p.e5m2 = e5m2;
  if (spec.rowwise) p.data = q.data.as<uint8_t>(), p.scale = scale_out(q);
  p.data_col = q.data_colwise.as<uint8_t>(), p.scale_col = q.block_scale_colwise.as<uint8_t>(), p.sr = sr_of(spec);
  launch_mxfp8_tile(ref_of(x), p, st);
}

void quantize_fp8_body(const DeviceMatrix& x, const QuantConfig& spec, DeviceQTensor& q, const DeviceGroups* groups,
                       cudaStream_t st) {
  const int64_t rows = x.rows, cols = x.cols;
  RowParams p;
  p.rows = rows, p.cols = cols, p.nchunks = int((cols + 15) / 16);
  p.data = q.data.as<uint8_t>(), p.elem_max = elem_max_of(spec), p.eps = spec.eps, p.type_max = x.type_max;
  p.pow2 = spec.pow2, p.e5m2 = spec.elem == ElemCodec::kE5M2, p.sr = sr_of(spec);
  p.scale_inv_out = q.scale_inv.as<float>();
  p.tile_cols = (cols + 127) / 128;
  switch (spec.scaling) {
    case Scaling::kPerRow:
      p.amax_mode = kAmaxRow;
      if (cols == 0)  // the amax of nothing is 0: the scale rule still applies (eps may raise it)
        launch_fill_f32(q.scale_inv.as<float>(), rows,
                        num::fp8_scale_inv(num::fp8_scale(0.0f, p.elem_max, spec.eps, x.type_max, spec.pow2)), st);
      launch_rows(ref_of(x), RowFmt::kFp8, p, st);
      return;
    case Scaling::kBlock1x128:
      p.amax_mode = kAmaxLanes8;
      launch_rows(ref_of(x), RowFmt::kFp8, p, st);
      return;
    default: break;
  }
  // Domains that need an amax pass first: per tensor, per group, 128x128 tiles.
  int kind = kDomTensor;
  int64_t ndom = 1;
  const int64_t* d_off = nullptr;
  int64_t ng = 0;
  if (spec.scaling == Scaling::kPerGroup) kind = kDomGroup, ndom = groups->groups(), d_off = groups->device.as<int64_t>(), ng = groups->groups();
  if (spec.scaling == Scaling::kBlock128x128) kind = kDomTile128, ndom = ((rows + 127) / 128) * p.tile_cols;
  q.ws_keys.resize(size_t(ndom) * 4);
  q.ws_keys.fill(0, st);
  q.ws_dom.resize(size_t(ndom) * 4);
  run_domain_amax(x, kind, d_off, ng, p.tile_cols, q.ws_keys.as<uint32_t>(), st);
  FinishParams f;
  f.ndom = ndom, f.keys = q.ws_keys.as<uint32_t>(), f.offsets = kind == kDomGroup ? d_off : nullptr, f.cols = cols;
  f.tensor_nonempty = rows * cols > 0, f.fp8 = true, f.elem_max = p.elem_max, f.eps = spec.eps, f.type_max = x.type_max;
  f.pow2 = spec.pow2, f.dom_val = q.ws_dom.as<float>(), f.scale_inv_out = q.scale_inv.as<float>();
  launch_finish(f, st);
  p.amax_mode = kAmaxDomain, p.dom_kind = kind, p.dom_val = q.ws_dom.as<float>(), p.offsets = d_off, p.groups = ng;
  launch_rows(ref_of(x), RowFmt::kFp8, p, st);
}

// Output buffers and metadata for MXFP8 and FP8 (NVFP4: prepare_nvfp4_output).
void prepare_output(DeviceQTensor& q, const DeviceMatrix& x, const QuantConfig& spec, std::span<const int64_t> offsets,
                    cudaStream_t st) {
  const int64_t rows = x.rows, cols = x.cols;
  q.meta = QTensor{};
  q.meta.format = spec.format;
  q.meta.scaling = spec.scaling;
  q.meta.elem = spec.elem;
  q.meta.rows = rows;
  q.meta.cols = cols;
  q.meta.group_offsets.assign(offsets.begin(), offsets.end());
  q.amax.resize(0), q.scale_inv.resize(0), q.data_colwise.resize(0), q.block_scale_colwise.resize(0);
  q.block_scale.resize(0);
  if (spec.format == Format::kMxfp8) {
    q.meta.has_rowwise = spec.rowwise;
    q.data.resize(spec.rowwise ? size_t(rows * cols) : 0);
    if (spec.rowwise) alloc_scales(q, rows, cols / 32, spec.scale_layout, st);
    if (spec.colwise) {
      q.data_colwise.resize(size_t(rows * cols));
      q.block_scale_colwise.resize(size_t(rows / 32 * cols));
    }
    return;
  }
  q.data.resize(size_t(rows * cols));
  int64_t sr = 1, sc = 1;
  switch (spec.scaling) {
    case Scaling::kPerRow: sr = rows; break;
    case Scaling::kBlock1x128: sr = rows, sc = (cols + 127) / 128; break;
    case Scaling::kBlock128x128: sr = (rows + 127) / 128, sc = (cols + 127) / 128; break;
    case Scaling::kPerGroup: sr = int64_t(offsets.size()) - 1; break;
    default: break;
  }
  q.meta.scale_inv_rows = sr;
  q.meta.scale_inv_cols = sc;
  q.scale_inv.resize(size_t(sr * sc) * sizeof(float));
}

// Runs the Hadamard transform into `tmp` (bf16: the transform's output is bf16 by definition, so
// the scratch copy is exact) and returns the view of it.
DeviceMatrix hadamard_into(const DeviceMatrix& x, DeviceBuffer& tmp, cudaStream_t st) {
  DeviceMatrix h = x;
  if (x.rows * x.cols == 0) return h;
  tmp.resize(size_t(x.rows * x.cols) * 2);
  launch_hadamard(ref_of(x), x.rows, x.cols, tmp.get(), /*out_bf16=*/true, st);
  h.data = tmp.get();
  h.type = InputType::kBF16;
  return h;
}

}  // namespace

void quantize_device(const DeviceMatrix& x_in, const QuantConfig& spec, DeviceQTensor& q, const DeviceGroups* groups,
                     cudaStream_t st) {
  std::span<const int64_t> offsets;
  if (groups) offsets = std::span<const int64_t>(groups->host.data(), groups->host.size());
  validate(x_in, offsets, spec);
  const DeviceMatrix x = spec.hadamard ? hadamard_into(x_in, q.ws_tmp, st) : x_in;
  if (spec.format == Format::kNvfp4) {
    const int64_t ndom = spec.scaling == Scaling::kPerRow ? x.rows : (spec.scaling == Scaling::kPerGroup ? groups->groups() : 1);
    prepare_nvfp4_output(q, x.rows, x.cols, spec, ndom, offsets, st);
    if (spec.scaling != Scaling::kPerRow) nvfp4_domain_amax(x, spec, q, groups, st);
    quantize_nvfp4_body(x, spec, q, groups, st);
    return;
  }
  prepare_output(q, x, spec, offsets, st);
  if (spec.format == Format::kMxfp8) quantize_mxfp8_body(x, spec, q, st);
  else quantize_fp8_body(x, spec, q, groups, st);
}

void quantize_nvfp4_joint_device(std::span<const DeviceMatrix> xs, const QuantConfig& spec, std::span<DeviceQTensor> outs,
                                 cudaStream_t st) {
  if (spec.format != Format::kNvfp4 || spec.scaling != Scaling::kPerTensor)
    throw QuantError("joint quantization is defined for nvfp4 with per_tensor scaling (one shared amax)");
  if (outs.size() != xs.size()) throw std::invalid_argument("quantize_nvfp4_joint_device: one output per input");
  for (const DeviceMatrix& x : xs) validate(x, {}, spec);
  if (xs.empty()) return;
  // The joint amax is over what is quantized (after the optional transform): one key for all inputs.
  std::vector<DeviceMatrix> src;
  for (size_t i = 0; i < xs.size(); ++i) src.push_back(spec.hadamard ? hadamard_into(xs[i], outs[i].ws_tmp, st) : xs[i]);
  DeviceBuffer& keys = outs[0].ws_keys;
  keys.resize(4);
  keys.fill(0, st);
  int64_t count = 0;
  for (const DeviceMatrix& x : src) {
    count += x.rows * x.cols;
    run_domain_amax(x, kDomTensor, nullptr, 0, 0, keys.as<uint32_t>(), st);
  }
  QuantConfig s = spec;
  s.hadamard = false;
  for (size_t i = 0; i < src.size(); ++i) {
    DeviceQTensor& q = outs[i];
    prepare_nvfp4_output(q, src[i].rows, src[i].cols, s, 1, {}, st);
    q.ws_dom.resize(4);
    FinishParams f;
    f.ndom = 1, f.keys = keys.as<uint32_t>(), f.cols = src[i].cols, f.tensor_nonempty = count > 0;
    f.dom_val = q.ws_dom.as<float>(), f.amax_out = q.amax.as<float>();
    launch_finish(f, st);
    quantize_nvfp4_body(src[i], s, q, nullptr, st);
  }
}

void hadamard16_rows_device(const DeviceMatrix& x, float* out, cudaStream_t st) {
  if (x.cols % 16 != 0) throw QuantError(fmt::format("{}: the Hadamard transform needs cols % 16 == 0", where(x)));
  launch_hadamard(ref_of(x), x.rows, x.cols, out, /*out_bf16=*/false, st);
}

void dequantize_device(const DeviceQTensor& dq, float* out, bool colwise, cudaStream_t st) {
  const QTensor& q = dq.meta;
  if (q.format == Format::kMxfp8 && !q.has_rowwise) colwise = true;  // as the CPU reference
  if (colwise && (q.format != Format::kMxfp8 || dq.data_colwise.empty()))
    throw QuantError("dequantize_colwise: the tensor has no mxfp8 columnwise copy");
  DequantParams p;
  p.rows = q.rows, p.cols = q.cols, p.nchunks = (q.cols + 15) / 16;
  p.format = q.format, p.scaling = q.scaling, p.e5m2 = q.elem == ElemCodec::kE5M2, p.colwise = colwise;
  p.data = colwise ? dq.data_colwise.as<uint8_t>() : dq.data.as<uint8_t>();
  p.scale.p = const_cast<uint8_t*>(dq.block_scale.as<uint8_t>());
  p.scale.cols = q.scale_cols, p.scale.padded_cols = round_up(q.scale_cols, 4);
  p.scale.swizzled = q.scale_layout == ScaleLayout::kSwizzled;
  p.scale_col = dq.block_scale_colwise.as<uint8_t>();
  p.amax = dq.amax.as<float>(), p.scale_inv = dq.scale_inv.as<float>(), p.scale_inv_cols = q.scale_inv_cols;
  p.out = out;
  DeviceBuffer off;
  if (!q.group_offsets.empty()) {
    off.upload(std::span<const int64_t>(q.group_offsets.data(), q.group_offsets.size()), st);
    p.offsets = off.as<int64_t>();
    p.groups = int64_t(q.group_offsets.size()) - 1;
  }
  launch_dequantize(p, st);
  if (!off.empty()) LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(st));  // `off` is freed on return
}

// ---- host <-> device copies and the host convenience API -----------------------------------
QTensor to_host(const DeviceQTensor& d, cudaStream_t st) {
  QTensor q = d.meta;
  q.data = d.data.download<uint8_t>(st);
  q.block_scale = d.block_scale.download<uint8_t>(st);
  q.amax = d.amax.download<float>(st);
  q.scale_inv = d.scale_inv.download<float>(st);
  q.data_colwise = d.data_colwise.download<uint8_t>(st);
  q.block_scale_colwise = d.block_scale_colwise.download<uint8_t>(st);
  return q;
}

void to_device(const QTensor& q, DeviceQTensor& d, cudaStream_t st) {
  d.meta = q;
  d.meta.data.clear(), d.meta.block_scale.clear(), d.meta.amax.clear(), d.meta.scale_inv.clear();
  d.meta.data_colwise.clear(), d.meta.block_scale_colwise.clear();
  d.data.upload(std::span<const uint8_t>(q.data), st);
  d.block_scale.upload(std::span<const uint8_t>(q.block_scale), st);
  d.amax.upload(std::span<const float>(q.amax), st);
  d.scale_inv.upload(std::span<const float>(q.scale_inv), st);
  d.data_colwise.upload(std::span<const uint8_t>(q.data_colwise), st);
  d.block_scale_colwise.upload(std::span<const uint8_t>(q.block_scale_colwise), st);
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(st));
}

DeviceBuffer upload_matrix(const MatrixF32& x, InputType type, cudaStream_t st) {
  DeviceBuffer b;
  if (type == InputType::kF32) {
    b.upload(x.values, st);
  } else {
    std::vector<uint16_t> h(x.values.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = num::f32_to_bf16(x.values[i]);
    b.upload(std::span<const uint16_t>(h), st);
  }
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(st));
  return b;
}

namespace {
DeviceMatrix device_view(const MatrixF32& x, const DeviceBuffer& b) {
  DeviceMatrix m;
  m.data = b.get();
  m.type = InputType::kF32;
  m.rows = x.rows, m.cols = x.cols, m.type_max = x.type_max, m.name = x.name;
  return m;
}
void check_values(const MatrixF32& x) {
  if (x.rows < 0 || x.cols < 0 || int64_t(x.values.size()) != x.rows * x.cols)
    throw QuantError(fmt::format("tensor '{}' [{}, {}]: {} values do not match the shape", x.name, x.rows, x.cols, x.values.size()));
}
}  // namespace

QTensor quantize_cuda(const MatrixF32& x, const QuantConfig& spec) {
  if (spec.scaling == Scaling::kPerGroup)
    throw QuantError(fmt::format("tensor '{}' [{}, {}]: per_group scaling needs a grouped buffer (quantize_grouped)", x.name, x.rows, x.cols));
  check_values(x);
  DeviceBuffer in = upload_matrix(x, InputType::kF32);
  DeviceQTensor q;
  quantize_device(device_view(x, in), spec, q);
  return to_host(q);
}

QTensor quantize_grouped_cuda(const MatrixF32& x, std::span<const int64_t> offsets, const QuantConfig& spec) {
  if (offsets.empty()) throw QuantError(fmt::format("tensor '{}' [{}, {}]: quantize_grouped needs group offsets", x.name, x.rows, x.cols));
  check_values(x);
  DeviceBuffer in = upload_matrix(x, InputType::kF32);
  DeviceGroups g(offsets);
  DeviceQTensor q;
  quantize_device(device_view(x, in), spec, q, &g);
  return to_host(q);
}

std::vector<QTensor> quantize_nvfp4_joint_cuda(std::span<const MatrixF32> xs, const QuantConfig& spec) {
  std::vector<DeviceBuffer> ins;
  std::vector<DeviceMatrix> views;
  for (const MatrixF32& x : xs) {
    check_values(x);
    ins.push_back(upload_matrix(x, InputType::kF32));
  }
  for (size_t i = 0; i < xs.size(); ++i) views.push_back(device_view(xs[i], ins[i]));
  std::vector<DeviceQTensor> outs(xs.size());
  quantize_nvfp4_joint_device(views, spec, outs);
  std::vector<QTensor> r;
  for (const DeviceQTensor& q : outs) r.push_back(to_host(q));
  return r;
}

namespace {
std::vector<float> dequantize_impl(const QTensor& q, bool colwise) {
  DeviceQTensor d;
  to_device(q, d);
  DeviceBuffer out(size_t(q.rows * q.cols) * sizeof(float));
  dequantize_device(d, out.as<float>(), colwise);
  return out.download<float>();
}
}  // namespace

std::vector<float> dequantize_cuda(const QTensor& q) { return dequantize_impl(q, false); }
std::vector<float> dequantize_colwise_cuda(const QTensor& q) { return dequantize_impl(q, true); }

std::vector<float> hadamard16_rows_cuda(const MatrixF32& x) {
  check_values(x);
  if (x.cols % 16 != 0) throw QuantError(fmt::format("tensor '{}' [{}, {}]: the Hadamard transform needs cols % 16 == 0", x.name, x.rows, x.cols));
  DeviceBuffer in = upload_matrix(x, InputType::kF32);
  DeviceBuffer out(x.values.size() * sizeof(float));
  hadamard16_rows_device(device_view(x, in), out.as<float>());
  return out.download<float>();
}

uint64_t codec_mismatches_cuda(uint64_t counts[3]) {
  DeviceBuffer m(3 * sizeof(unsigned long long));
  m.fill(0);
  detail::launch_codec_check(m.as<unsigned long long>(), nullptr);
  std::vector<unsigned long long> h = m.download<unsigned long long>();
  for (int k = 0; k < 3; ++k) counts[k] = h[size_t(k)];
  return h[0] + h[1] + h[2];
}

// ---- MoE producer fusions -------------------------------------------------------------------
namespace {
void check_fused(const QuantConfig& spec, const char* what) {
  if (spec.format != Format::kNvfp4 || spec.scaling != Scaling::kPerRow || spec.block2d || spec.hadamard)
    throw QuantError(fmt::format("{}: the fused MoE path produces nvfp4 per_row 1-D blocks", what));
}
}  // namespace

void permute_quantize_nvfp4_device(const DeviceMatrix& x, const int32_t* d_src_rows, int64_t out_rows,
                                   const DeviceGroups& groups, const QuantConfig& spec, DeviceQTensor& q, cudaStream_t st) {
  check_fused(spec, "permute_quantize");
  if (x.cols % 16 != 0) throw QuantError(fmt::format("{}: nvfp4 needs cols % 16 == 0 (blocks of 16 along the row); pad the tensor", where(x)));
  check_group_offsets(std::span<const int64_t>(groups.host.data(), groups.host.size()), out_rows);
  prepare_nvfp4_output(q, out_rows, x.cols, spec, out_rows, std::span<const int64_t>(groups.host.data(), groups.host.size()), st);
  if (x.cols == 0) launch_fill_f32(q.amax.as<float>(), out_rows, 0.0f, st);
  launch_rows_gather(ref_of(x), d_src_rows, nvfp4_row_params(out_rows, x.cols, spec, q), st);
}

void swiglu_quantize_nvfp4_device(const DeviceMatrix& fc1, const float* d_prob, const QuantConfig& spec, DeviceQTensor& q,
                                  cudaStream_t st) {
  check_fused(spec, "swiglu_quantize");
  const int64_t h = fc1.cols / 2;
  if (fc1.cols % 2 != 0 || h % 16 != 0)
    throw QuantError(fmt::format("{}: SwiGLU + nvfp4 needs cols = 2H with H % 16 == 0", where(fc1)));
  prepare_nvfp4_output(q, fc1.rows, h, spec, fc1.rows, {}, st);
  if (h == 0) launch_fill_f32(q.amax.as<float>(), fc1.rows, 0.0f, st);
  // The loader reads the [rows, 2H] matrix; vector loads need 2H % 16 == 0 and H % 16 == 0 (true).
  launch_rows_swiglu(ref_of(fc1), d_prob, h, nvfp4_row_params(fc1.rows, h, spec, q), st);
}

QTensor permute_quantize_nvfp4_cuda(const MatrixF32& x, std::span<const int32_t> src_rows,
                                    std::span<const int64_t> offsets, const QuantConfig& spec) {
  check_values(x);
  for (size_t i = 0; i < src_rows.size(); ++i)
    if (src_rows[i] >= x.rows)
      throw QuantError(fmt::format("routing index {} at output row {} is outside tensor '{}' with {} rows", src_rows[i], i, x.name, x.rows));
  DeviceBuffer in = upload_matrix(x, InputType::kF32);
  DeviceBuffer src;
  src.upload(src_rows);
  DeviceGroups g(offsets);
  DeviceQTensor q;
  permute_quantize_nvfp4_device(device_view(x, in), src.as<int32_t>(), int64_t(src_rows.size()), g, spec, q);
  return to_host(q);
}

QTensor swiglu_quantize_nvfp4_cuda(const MatrixF32& fc1, std::span<const float> prob, const QuantConfig& spec) {
  check_values(fc1);
  if (int64_t(prob.size()) != fc1.rows)
    throw QuantError(fmt::format("tensor '{}' [{}, {}]: one router probability per row needed, {} given", fc1.name, fc1.rows, fc1.cols, prob.size()));
  DeviceBuffer in = upload_matrix(fc1, InputType::kF32);
  DeviceBuffer p;
  p.upload(prob);
  DeviceQTensor q;
  swiglu_quantize_nvfp4_device(device_view(fc1, in), p.as<float>(), spec, q);
  return to_host(q);
}

}  // namespace lockstep::cuda
#endif  // LOCKSTEP_HAVE_CUDA
