// Programmatic dependent launch (sm_90) for the CUDA kernels (private, .cu files only). A kernel
// launched with launch_pdl may start while the kernel before it in the stream is still running, so
// it must call pdl_wait() before it touches global memory that earlier work writes or reads;
// pdl_launch_dependents() then lets the next such kernel start (its blocks wait in their own
// pdl_wait). Both calls are no-ops for a kernel launched without the attribute.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda_util.h"

namespace lockstep::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed.
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace lockstep::cuda
