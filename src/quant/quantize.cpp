// The quantizer entry points of quantize.h: input rules shared by every backend, then one dispatch
// on the device the input lives on (CPU reference here, CUDA kernels in quantize_cuda_host.cpp).
#include "lockstep/quant/quantize.h"

#include <fmt/format.h>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"
#include "quantize_cpu.h"
#include "quantize_rows_cpu.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "quantize_cuda_entry.h"
#endif

namespace lockstep {
namespace {

std::string where(std::string_view name, int64_t rows, int64_t cols) {
  return fmt::format("tensor '{}' [{}, {}]", name, rows, cols);
}

#if !defined(LOCKSTEP_HAVE_CUDA)
[[noreturn]] void no_cuda(const Tensor& x, std::string_view name) {
  throw std::runtime_error(
      fmt::format("tensor '{}' {} is on a CUDA device, but this lockstep was built "
                  "without CUDA (configure with -DLOCKSTEP_CUDA=ON)",
                  name, x.describe()));
}
#endif

void check_2d(const Tensor& x, std::string_view name) {
  if (x.dim() != 2)
    throw QuantError(
        fmt::format("tensor '{}' {}: quantization takes 2-D tensors", name, x.describe()));
}

}  // namespace

float source_type_max(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return num::kBf16Max;
    case DType::kF16:
      return num::kF16Max;
    default:
      return num::kFltMax;
  }
}

void validate_quant_input(std::string_view name, int64_t rows, int64_t cols,
                          std::span<const int64_t> offsets, const QuantConfig& cfg) {
  const std::string at = where(name, rows, cols);
  if (rows < 0 || cols < 0) throw QuantError(fmt::format("{}: negative shape", at));
  const FormatInfo& info = format_info(cfg.format);
  auto bad_combo = [&](std::string_view why) {
    throw QuantError(fmt::format("{}: format {} with scaling {}: {}", at, info.name,
                                 scaling_name(cfg.scaling), why));
  };
  if (!info.quantized)
    throw QuantError(
        fmt::format("{}: format {} is not quantized (choose nvfp4, mxfp8 or fp8)", at, info.name));
  if (const std::string why = quant_spec_violation(cfg); !why.empty()) bad_combo(why);
  if (!cfg.rowwise && !cfg.colwise)
    bad_combo("neither a rowwise nor a columnwise copy was asked for");
  // Blocks are never partial: the rowwise copy's blocks run along a row, the columnwise copy's
  // down a column (the rows of X^T), so each copy needs its dimension a multiple of the block.
  // NVFP4 needs cols % 16 for either copy (CONTRACT.md section 2).
  const int64_t block = info.block;
  const bool row_blocks = cfg.rowwise || cfg.format == Format::kNvfp4;
  if (block > 0 && row_blocks && cols % block != 0)
    throw QuantError(
        fmt::format("{}: {} needs cols % {} == 0 (blocks of {} along the row); pad the tensor", at,
                    info.name, block, block));
  if (block > 0 && cfg.colwise && rows % block != 0)
    throw QuantError(fmt::format(
        "{}: the {} columnwise copy needs rows % {} == 0 (blocks of {} down the columns); pad "
        "the tensor",
        at, info.name, block, block));
  // A 2-D tile spans `block` rows too.
  if (cfg.block2d && rows % block != 0)
    throw QuantError(fmt::format("{}: {} 2-D ({}x{}) blocks need rows % {} == 0; pad the tensor",
                                 at, info.name, block, block, block));
  if (cfg.block2d && cfg.hadamard && cfg.colwise)
    bad_combo(
        "the columnwise copy of 2-D blocks is the transpose of the rowwise copy, which a Hadamard "
        "transform along rows does not commute with");
  if (cfg.scaling == Scaling::kPerGroup && offsets.empty())
    bad_combo("per_group needs group offsets (a grouped buffer)");
  if (cfg.hadamard && cols % 16 != 0)
    throw QuantError(fmt::format("{}: the Hadamard transform needs cols % 16 == 0", at));
  if (!offsets.empty()) {
    check_group_offsets(offsets, rows);
    if (cfg.colwise && cfg.format != Format::kMxfp8 && cfg.scale_layout == ScaleLayout::kSwizzled)
      bad_combo(
          "the columnwise copy of a grouped buffer is stored per group with compact scales; ask "
          "for scale_layout compact");
    // Blocks that span rows (2-D tiles, columnwise blocks, 128x128 tiles) stay inside a group.
    int64_t need = 1;
    if (block > 0 && (cfg.block2d || cfg.colwise)) need = block;
    if (cfg.scaling == Scaling::kBlock128x128) need = 128;
    for (size_t g = 0; g + 1 < offsets.size(); ++g)
      if ((offsets[g + 1] - offsets[g]) % need != 0)
        throw QuantError(fmt::format(
            "{}: group {} has {} rows; blocks spanning rows need groups padded to a multiple of {}",
            at, g, offsets[g + 1] - offsets[g], need));
  }
}

QTensor quantize(const Tensor& x, const QuantConfig& cfg, std::string_view name,
                 QuantStats* stats) {
  check_2d(x, name);
  if (cfg.scaling == Scaling::kPerGroup)
    throw QuantError(fmt::format("{}: per_group scaling needs a grouped buffer (quantize_grouped)",
                                 where(name, x.rows(), x.cols())));
  return quantize_grouped(x, {}, cfg, name, stats);
}

QTensor quantize_grouped(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                         std::string_view name, QuantStats* stats) {
  check_2d(x, name);
  validate_quant_input(name, x.rows(), x.cols(), offsets, cfg);
  QTensor q;
  if (x.is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    q = cuda::quantize(x, offsets, cfg, name);
    if (stats) stats->nonfinite = count_nonfinite(to_f32(x.to(Device::cpu())));
#else
    no_cuda(x, name);
#endif
  } else if (cpu::rows_path_applies(x, cfg)) {
    // The bf16 / fp32 rows read in place, the statistics gathered in the same pass.
    int64_t nonfinite = 0;
    q = cpu::quantize_rows(x, offsets, cfg, nonfinite);
    if (stats) stats->nonfinite = nonfinite;
  } else {
    std::vector<float> storage;
    const cpu::MatrixF32 m = cpu::as_matrix(x, storage, name);
    q = cpu::quantize(m, offsets, cfg);
    if (stats) stats->nonfinite = count_nonfinite(m.values);
  }
  q.source_dtype = x.dtype();
  return q;
}

std::vector<QTensor> quantize_joint(std::span<const Tensor> xs, const QuantConfig& cfg,
                                    std::span<const std::string> names) {
  if (cfg.format != Format::kNvfp4 || cfg.scaling != Scaling::kPerTensor)
    throw QuantError(
        "joint quantization is defined for nvfp4 with per_tensor scaling (one shared amax)");
  if (!names.empty() && names.size() != xs.size())
    throw QuantError(
        fmt::format("quantize_joint: {} names for {} tensors", names.size(), xs.size()));
  auto name_of = [&](size_t i) { return names.empty() ? std::string("tensor") : names[i]; };
  for (size_t i = 0; i < xs.size(); ++i) {
    check_2d(xs[i], name_of(i));
    validate_quant_input(name_of(i), xs[i].rows(), xs[i].cols(), {}, cfg);
    if (xs[i].device() != xs[0].device())
      throw QuantError(fmt::format("quantize_joint: tensor '{}' is on {} but '{}' on {}",
                                   name_of(i), xs[i].device().str(), name_of(0),
                                   xs[0].device().str()));
  }
  std::vector<QTensor> out;
  if (!xs.empty() && xs[0].is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    out = cuda::quantize_joint(xs, cfg, names);
#else
    no_cuda(xs[0], name_of(0));
#endif
  } else {
    // The joint amax is taken over what is quantized: after the optional Hadamard transform, and
    // for the columnwise copies over the transposed (transformed) values.
    std::vector<std::vector<float>> storage(xs.size());
    std::vector<cpu::MatrixF32> ms;
    for (size_t i = 0; i < xs.size(); ++i)
      ms.push_back(cpu::as_matrix(xs[i], storage[i], name_of(i)));
    float joint[2] = {0.0f, 0.0f};
    for (int c = 0; c < 2; ++c) {
      float acc = num::amax_empty();
      int64_t count = 0;
      for (const cpu::MatrixF32& m : ms) {
        if (m.rows * m.cols == 0) continue;
        acc = num::fmax_f32(acc, cpu::nvfp4_tensor_amax(m, {}, cfg.hadamard,
                                                        c == 0 ? Copy::kRowwise : Copy::kColwise));
        count += m.rows * m.cols;
      }
      joint[c] = count == 0 ? 0.0f : acc;
      if (!cfg.colwise) break;
    }
    for (const cpu::MatrixF32& m : ms)
      out.push_back(cpu::quantize(m, {}, cfg, &joint[0], &joint[1]));
  }
  for (size_t i = 0; i < xs.size(); ++i) out[i].source_dtype = xs[i].dtype();
  return out;
}

Tensor dequantize(const QTensor& q, const DequantConfig& cfg) {
  if (cfg.dtype != DType::kF32 && cfg.dtype != DType::kBF16)
    throw QuantError(fmt::format("dequantize {}: output dtype {} (choose F32 or BF16)",
                                 q.describe(), dtype_name(cfg.dtype)));
  if (q.device().is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    return cuda::dequantize(q, cfg);
#else
    throw std::runtime_error(fmt::format("dequantize {}: built without CUDA", q.describe()));
#endif
  }
  const std::vector<float> v = cpu::dequantize(q, cfg.copy);
  return from_f32(v, {q.rows, q.cols}, cfg.dtype);
}

Tensor hadamard16_rows(const Tensor& x, Stream stream) {
  check_2d(x, "tensor");
  if (x.is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    return cuda::hadamard16_rows(x, stream);
#else
    no_cuda(x, "tensor");
#endif
  }
  (void)stream;
  std::vector<float> storage;
  const std::vector<float> h = cpu::hadamard16_rows(cpu::as_matrix(x, storage, "tensor"));
  return from_f32(h, {x.rows(), x.cols()});
}

int64_t count_nonfinite(std::span<const float> values) {
  int64_t n = 0;
  for (float v : values) n += num::is_finite(v) ? 0 : 1;
  return n;
}

}  // namespace lockstep
