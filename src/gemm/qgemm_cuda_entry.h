// The CUDA backend of the GEMM entry points (qgemm.h), private to the gemm layer: operands on a
// CUDA device, outputs there too, ordered on cfg.stream with no host synchronisation inside a call
// (outer-scale expansion, unswizzling and group tables are built on the device).
#pragma once

#include "lockstep/gemm/qgemm.h"

namespace lockstep::cuda {

GemmResult qgemm(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg);
GemmResult grouped_qgemm(const GemmArg& a, const Tensor& offsets, const GemmArg& w,
                         const GemmConfig& cfg);

}  // namespace lockstep::cuda
