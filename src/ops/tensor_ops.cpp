// The device guard shared by the Tensor-level op entries (ops/tensor_ops.h). The entries live in
// tensor_ops_<family>.cpp, one file per op family, each dispatching on the device of its tensors.
#include "lockstep/ops/tensor_ops.h"

#include <fmt/format.h>

namespace lockstep::ops {

void require_cpu(const Tensor& t, std::string_view op, std::string_view name) {
  if (t.defined() && !t.is_cpu())
    throw DeviceNotSupported(fmt::format(
        "{}: tensor '{}' {} lives on {}; the CUDA engine does not implement {} (move it to the "
        "CPU with to())",
        op, name, t.describe(), t.device().str(), op));
}

}  // namespace lockstep::ops
