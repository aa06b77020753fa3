// The GEMM entry points of qgemm.h: operand descriptions, kernel names, and one dispatch on the
// device the operands live on (CPU path here, CUDA kernels behind qgemm_cuda_entry.h).
#include "lockstep/gemm/qgemm.h"

#include <fmt/format.h>

#include <array>

#include "qgemm_cpu.h"
#include "qgemm_variant.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "qgemm_cuda_entry.h"
#endif

namespace lockstep {
namespace {

constexpr std::array<std::string_view, size_t(GemmKernel::kCount)> kKernelNames{
    "auto", "cpu", "cuda_decode", "cuda_wgmma", "cuda_cublas", "cuda_tiled"};

Device common_device(const GemmArg& a, const GemmArg& w, const std::string& what) {
  if (a.device() != w.device())
    throw GemmError(fmt::format("{}: operands on different devices ({} and {}); move one with to()",
                                what, a.device().str(), w.device().str()));
  return a.device();
}

// CPU operands run the CPU path: a CUDA kernel or variant asked for is an error.
void check_cpu_kernel(const GemmConfig& cfg, const std::string& what) {
  const GemmVariant v = requested_variant(cfg, what);
  if (v != GemmVariant::kAuto && v != GemmVariant::kCpu)
    throw GemmError(
        fmt::format("{}: kernel {} runs on CUDA operands only", what, gemm_variant_name(v)));
}

}  // namespace

Format GemmArg::format() const {
  if (q_) return q_->format;
  return t_->dtype() == DType::kBF16 ? Format::kBf16 : Format::kF32;
}

int64_t GemmArg::rows(Copy c) const {
  const int64_t r = q_ ? q_->rows : (t_->dim() == 2 ? t_->shape()[0] : -1);
  const int64_t k = q_ ? q_->cols : (t_->dim() == 2 ? t_->shape()[1] : -1);
  return c == Copy::kRowwise ? r : k;
}

int64_t GemmArg::cols(Copy c) const {
  return rows(c == Copy::kRowwise ? Copy::kColwise : Copy::kRowwise);
}

std::string GemmArg::describe(Copy c, std::string_view name) const {
  const char* which = c == Copy::kRowwise ? "" : " (columnwise: the transpose)";
  if (q_) return fmt::format("'{}' {}{}", name, q_->describe(), which);
  return fmt::format("'{}' {}{}", name, t_->describe(), which);
}

std::string_view gemm_kernel_name(GemmKernel k) { return kKernelNames[size_t(k)]; }

std::optional<GemmKernel> gemm_kernel_from_name(std::string_view name) {
  for (size_t i = 0; i < kKernelNames.size(); ++i)
    if (kKernelNames[i] == name) return GemmKernel(i);
  return std::nullopt;
}

GemmResult qgemm(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg) {
  const std::string what =
      fmt::format("qgemm A {} x W {}", a.describe(cfg.a_copy, "a"), w.describe(cfg.w_copy, "w"));
  if (!a.quantized() && a.t().dim() != 2) throw GemmError(fmt::format("{}: A must be 2-D", what));
  if (!w.quantized() && w.t().dim() != 2) throw GemmError(fmt::format("{}: W must be 2-D", what));
  if (cfg.out_dtype != DType::kF32 && cfg.out_dtype != DType::kBF16)
    throw GemmError(
        fmt::format("{}: output dtype {} (choose F32 or BF16)", what, dtype_name(cfg.out_dtype)));
  if (common_device(a, w, what).is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    return cuda::qgemm(a, w, cfg);
#else
    throw GemmError(fmt::format(
        "{}: operands are on a CUDA device but this lockstep was built without CUDA", what));
#endif
  }
  check_cpu_kernel(cfg, what);
  GemmResult r = gemm::qgemm_cpu(a, w, cfg);
  r.variant = gemm_variant_name(GemmVariant::kCpu);
  return r;
}

GemmResult grouped_qgemm(const GemmArg& a, const Tensor& offsets, const GemmArg& w,
                         const GemmConfig& cfg) {
  const std::string what = fmt::format("grouped_qgemm A {} x W {}", a.describe(cfg.a_copy, "a"),
                                       w.describe(cfg.w_copy, "w"));
  if (!a.quantized() && a.t().dim() != 2) throw GemmError(fmt::format("{}: A must be 2-D", what));
  if (!w.quantized() && w.t().dim() != 2) throw GemmError(fmt::format("{}: W must be 2-D", what));
  if (cfg.out_dtype != DType::kF32 && cfg.out_dtype != DType::kBF16)
    throw GemmError(
        fmt::format("{}: output dtype {} (choose F32 or BF16)", what, dtype_name(cfg.out_dtype)));
  if (offsets.dtype() != DType::kI64 || offsets.dim() != 1)
    throw GemmError(
        fmt::format("{}: offsets must be a 1-D I64 tensor, got {}", what, offsets.describe()));
  if (common_device(a, w, what).is_cuda()) {
#if defined(LOCKSTEP_HAVE_CUDA)
    return cuda::grouped_qgemm(a, offsets, w, cfg);
#else
    throw GemmError(fmt::format(
        "{}: operands are on a CUDA device but this lockstep was built without CUDA", what));
#endif
  }
  check_cpu_kernel(cfg, what);
  const Tensor off = offsets.to(Device::cpu()).contiguous();
  GemmResult r = gemm::grouped_qgemm_cpu(a, off.data<int64_t>(), w, cfg);
  r.variant = gemm_variant_name(GemmVariant::kCpu);
  return r;
}

}  // namespace lockstep
