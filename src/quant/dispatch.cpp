// Routes each quantizer op to the CPU reference or the CUDA backend (dispatch.h).
#include "lockstep/quant/dispatch.h"

#include <stdexcept>

#if defined(LOCKSTEP_HAVE_CUDA)
#include "lockstep/quant/quantize_cuda.h"
#endif

namespace lockstep {
namespace {
#if !defined(LOCKSTEP_HAVE_CUDA)
[[noreturn]] void no_cuda() {
  throw std::runtime_error("--device cuda: this lockstep was built without CUDA (configure with -DLOCKSTEP_CUDA=ON)");
}
#endif
}  // namespace

#if defined(LOCKSTEP_HAVE_CUDA)
#define LOCKSTEP_ON_CUDA(call) \
  do {                         \
    require_device(d);         \
    return cuda::call;         \
  } while (0)
#else
#define LOCKSTEP_ON_CUDA(call) no_cuda()
#endif

QTensor quantize_on(Device d, const MatrixF32& x, const QuantSpec& spec) {
  if (d == Device::kCpu) return quantize(x, spec);
  LOCKSTEP_ON_CUDA(quantize_cuda(x, spec));
}

QTensor quantize_grouped_on(Device d, const MatrixF32& x, std::span<const int64_t> offsets, const QuantSpec& spec) {
  if (d == Device::kCpu) return quantize_grouped(x, offsets, spec);
  LOCKSTEP_ON_CUDA(quantize_grouped_cuda(x, offsets, spec));
}

std::vector<QTensor> quantize_nvfp4_joint_on(Device d, std::span<const MatrixF32> xs, const QuantSpec& spec) {
  if (d == Device::kCpu) return quantize_nvfp4_joint(xs, spec);
  LOCKSTEP_ON_CUDA(quantize_nvfp4_joint_cuda(xs, spec));
}

std::vector<float> dequantize_on(Device d, const QTensor& q) {
  if (d == Device::kCpu) return dequantize(q);
  LOCKSTEP_ON_CUDA(dequantize_cuda(q));
}

std::vector<float> dequantize_colwise_on(Device d, const QTensor& q) {
  if (d == Device::kCpu) return dequantize_colwise(q);
  LOCKSTEP_ON_CUDA(dequantize_colwise_cuda(q));
}

std::vector<float> hadamard16_rows_on(Device d, const MatrixF32& x) {
  if (d == Device::kCpu) return hadamard16_rows(x);
  LOCKSTEP_ON_CUDA(hadamard16_rows_cuda(x));
}

}  // namespace lockstep
