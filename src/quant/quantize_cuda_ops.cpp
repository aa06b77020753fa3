// CUDA backends of the remaining quantizer entries (quantize_cuda_entry.h): dequantize of every
// copy, the Hadamard transform, and the two MoE producer fusions (moe_fused.h). Inputs and outputs
// are device tensors, ordered on the caller's stream. Compiles to nothing without
// LOCKSTEP_HAVE_CUDA.
#if defined(LOCKSTEP_HAVE_CUDA)
#include <fmt/format.h>

#include "lockstep/quant/layout.h"
#include "quantize_cuda_entry.h"
#include "quantize_cuda_plan.h"
#include "quantize_meta.h"

namespace lockstep::cuda {
namespace {
using namespace detail;

const uint8_t* u8_of(const Tensor& t, const QTensor& q, const char* part) {
  if (!t.defined()) return nullptr;
  if (!t.is_contiguous() || !t.is_cuda())
    throw QuantError(fmt::format("dequantize {}: part {} {} must be a contiguous device tensor",
                                 q.describe(), part, t.describe()));
  return t.ptr<uint8_t>();
}
const float* f32_of(const Tensor& t, const QTensor& q, const char* part) {
  if (!t.defined()) return nullptr;
  if (!t.is_contiguous() || !t.is_cuda() || t.dtype() != DType::kF32)
    throw QuantError(fmt::format("dequantize {}: part {} {} must be a contiguous F32 device tensor",
                                 q.describe(), part, t.describe()));
  return t.ptr<float>();
}

void check_nvfp4_shape(const QTensor& q) {
  if (q.format == Format::kNvfp4 && q.cols % 16 != 0)
    throw QuantError(fmt::format("dequantize {}: nvfp4 needs cols % 16 == 0", q.describe()));
}

}  // namespace

Tensor dequantize(const QTensor& q, const DequantConfig& cfg) {
  const QData& d = q.copy(cfg.copy);
  if (!d.defined())
    throw QuantError(fmt::format("dequantize {}: the tensor has no {} copy", q.describe(),
                                 cfg.copy == Copy::kRowwise ? "rowwise" : "columnwise"));
  check_nvfp4_shape(q);
  const Device dev = d.data.device();
  DeviceGuard guard(dev);
  plan::Ctx c(dev, cfg.stream, q.group_offsets, q.rows);
  Tensor out = Tensor::empty(cfg.dtype, {q.rows, q.cols}, dev, cfg.stream);
  float* of = cfg.dtype == DType::kF32 ? out.ptr<float>() : nullptr;
  uint16_t* ob = cfg.dtype == DType::kBF16 ? out.ptr<uint16_t>() : nullptr;
  if (q.rows * q.cols == 0) return out;
  const bool transposed = cfg.copy == Copy::kColwise && q.format != Format::kMxfp8;
  if (!transposed) {
    DequantParams p;
    p.rows = q.rows, p.cols = q.cols, p.nchunks = (q.cols + 15) / 16;
    p.format = q.format, p.scaling = q.scaling, p.e5m2 = q.elem == ElemCodec::kE5M2;
    p.colwise = cfg.copy == Copy::kColwise;
    p.data = u8_of(d.data, q, "data");
    uint8_t* scales = const_cast<uint8_t*>(u8_of(d.block_scale, q, "block_scale"));
    if (p.colwise)
      p.scale_col = scales;
    else
      p.scale = scale_view(scales, d.scale_cols, q.scale_layout == ScaleLayout::kSwizzled);
    p.amax = f32_of(d.amax, q, "amax"), p.scale_inv = f32_of(d.scale_inv, q, "scale_inv");
    p.scale_inv_cols = d.scale_cols;
    if (q.scaling == Scaling::kPerGroup) p.offsets = c.d_off(), p.groups = c.groups();
    p.out_f32 = of, p.out_bf16 = ob;
    launch_dequantize(p, c.cs);
    return out;
  }
  DequantColParams p;
  p.rows = q.rows, p.cols = q.cols, p.format = q.format, p.scaling = q.scaling,
  p.block2d = q.block2d;
  p.e5m2 = q.elem == ElemCodec::kE5M2;
  p.offsets = c.d_off(), p.groups = c.groups();
  p.data = u8_of(d.data, q, "data");
  p.scale = u8_of(d.block_scale, q, "block_scale");
  p.scale_swizzled = !c.grouped && q.scale_layout == ScaleLayout::kSwizzled;
  p.amax = f32_of(d.amax, q, "amax"), p.scale_inv = f32_of(d.scale_inv, q, "scale_inv");
  Tensor sbase;
  if (q.format == Format::kFp8 && q.scaling == Scaling::kBlock1x128) {
    std::vector<int64_t> v(size_t(c.groups() + 1), 0);
    for (int64_t g = 0; g < c.groups(); ++g)
      v[size_t(g + 1)] = v[size_t(g)] + (c.off[size_t(g + 1)] - c.off[size_t(g)] + 127) / 128;
    sbase = upload_i64(v, dev, cfg.stream);
    p.col_sbase = sbase.ptr<int64_t>();
  }
  p.out_f32 = of, p.out_bf16 = ob;
  launch_dequantize_colwise(p, c.cs);
  return out;
}

Tensor hadamard16_rows(const Tensor& x, Stream stream) {
  const plan::Input in = plan::input_of(x, "tensor");
  if (in.cols % 16 != 0)
    throw QuantError(fmt::format(
        "tensor 'tensor' [{}, {}]: the Hadamard transform needs cols % 16 == 0", in.rows, in.cols));
  DeviceGuard guard(x.device());
  Tensor out = Tensor::empty(DType::kF32, {in.rows, in.cols}, x.device(), stream);
  launch_hadamard(in.ref, in.rows, in.cols, out.raw(), /*out_bf16=*/false, cu(stream));
  return out;
}

namespace {

// NVFP4 per_row rowwise output parts and the row kernel parameters that write them.
RowParams nvfp4_rows_out(plan::Ctx& c, const QuantConfig& cfg, QData& o, int64_t rows,
                         int64_t cols) {
  o.data = c.u8({rows, cols / 2});
  o.block_scale = plan::alloc_scales(c, rows, cols / 16, cfg.scale_layout);
  o.amax = c.f32({rows});
  o.scale_rows = rows, o.scale_cols = cols / 16;
  if (cols == 0) launch_fill_f32(o.amax.ptr<float>(), rows, 0.0f, c.cs);  // amax of nothing is 0
  RowParams p;
  p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.amax_mode = kAmaxRow;
  p.data = o.data.ptr<uint8_t>(),
  p.scale = plan::scale_out(o.block_scale, cols / 16, cfg.scale_layout);
  p.amax_out = o.amax.ptr<float>(), p.sr = plan::sr_of(cfg);
  return p;
}

void check_device_operand(const Tensor& t, const Tensor& x, DType dtype, const char* what,
                          const char* op) {
  if (!t.defined() || t.dtype() != dtype || t.dim() != 1 || t.device() != x.device() ||
      !t.is_contiguous())
    throw QuantError(fmt::format("{}: {} must be a contiguous 1-D {} tensor on {}, got {}", op,
                                 what, dtype_name(dtype), x.device().str(),
                                 t.defined() ? t.describe() : std::string("none")));
}

}  // namespace

QTensor permute_quantize(const Tensor& x, const Tensor& src_rows, std::span<const int64_t> offsets,
                         const QuantConfig& cfg, std::string_view name) {
  const plan::Input in = plan::input_of(x, name);
  check_device_operand(src_rows, x, DType::kI32, "src_rows", "permute_quantize");
  const int64_t out_rows = src_rows.numel();
  validate_quant_input(std::string(name) + ".permuted", out_rows, in.cols, offsets, cfg);
  DeviceGuard guard(x.device());
  plan::Ctx c(x.device(), cfg.stream, offsets, out_rows);
  QTensor q = quantized_meta(cfg, out_rows, in.cols, offsets);
  q.source_dtype = x.dtype();
  const RowParams p = nvfp4_rows_out(c, cfg, q.rowwise, out_rows, in.cols);
  launch_rows_gather(in.ref, src_rows.ptr<int32_t>(), in.rows, p, c.cs);
  return q;
}

QTensor swiglu_quantize(const Tensor& fc1, const Tensor& prob, const QuantConfig& cfg,
                        std::string_view name) {
  const plan::Input in = plan::input_of(fc1, name);
  check_device_operand(prob, fc1, DType::kF32, "prob", "swiglu_quantize");
  if (in.cols % 2 != 0 || prob.numel() != in.rows)
    throw QuantError(
        fmt::format("tensor 'fc1' {}: SwiGLU needs an even column count (gate | up) and one router "
                    "probability per row ({} given)",
                    fc1.describe(), prob.numel()));
  const int64_t h = in.cols / 2;
  validate_quant_input(std::string(name) + ".swiglu", in.rows, h, {}, cfg);
  DeviceGuard guard(fc1.device());
  plan::Ctx c(fc1.device(), cfg.stream, {}, in.rows);
  QTensor q = quantized_meta(cfg, in.rows, h, {});
  q.source_dtype = fc1.dtype();
  const RowParams p = nvfp4_rows_out(c, cfg, q.rowwise, in.rows, h);
  // The loader reads the [rows, 2H] matrix (vector loads: 2H % 16 == 0 as H % 16 == 0).
  launch_rows_swiglu(in.ref, prob.ptr<float>(), h, p, c.cs);
  return q;
}

}  // namespace lockstep::cuda
#endif  // LOCKSTEP_HAVE_CUDA
