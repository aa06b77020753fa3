// tensor_digests64 on CUDA: a grid-stride loop over the 8-byte words of each byte range adds
// their terms (numerics/digest64.h, the host's function) into one 64-bit device slot per range
// (warp and block sums first, then one atomicAdd per block; wrapping addition makes the order
// irrelevant). Bytes moved: each range read once; 8 bytes per range come back to the host.
#include <algorithm>
#include <vector>

#include "cuda_util.h"
#include "digest_cuda.h"
#include "lockstep/numerics/digest64.h"

namespace lockstep::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    digest_words_kernel(const unsigned char* p, uint64_t n, unsigned long long* slot) {
  const uint64_t words = (n + 7) / 8, full = n / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(p) & 7u) == 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  uint64_t s = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += stride) {
    const uint64_t left = n - 8 * i;
    const uint64_t w = aligned && i < full
                           ? reinterpret_cast<const uint64_t*>(p)[i]
                           : num::digest_load_word(p + 8 * i, size_t(left < 8 ? left : 8));
    s += num::digest_word_term(w, i);
  }
  for (int off = 16; off > 0; off /= 2)
    s += __shfl_down_sync(0xFFFFFFFFu, static_cast<unsigned long long>(s), off);
  __shared__ uint64_t warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t b = 0;
    for (int k = 0; k < kThreads / 32; ++k) b += warp_sums[k];
    atomicAdd(slot, static_cast<unsigned long long>(b));
  }
}

}  // namespace

void digest_word_sums(std::span<const void* const> p, std::span<const size_t> n, Device device,
                      std::span<uint64_t> sums) {
  if (p.empty()) return;
  const DeviceGuard on(device);
  const cudaStream_t stream = cu(Stream{});
  Scratch scratch(device, Stream{});
  auto* slots = scratch.get<unsigned long long>(p.size());
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(slots, 0, p.size() * sizeof(uint64_t), stream));
  int sms = 0;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index));
  for (size_t i = 0; i < p.size(); ++i) {
    const uint64_t words = (n[i] + 7) / 8;
    if (words == 0) continue;
    // Enough blocks to fill the device (8 per SM), each thread looping over several words.
    const uint64_t blocks = std::min<uint64_t>((words + kThreads - 1) / kThreads, 8ull * sms);
    digest_words_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(
        static_cast<const unsigned char*>(p[i]), n[i], slots + i);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  copy_bytes(sums.data(), Device::cpu(), slots, device, p.size() * sizeof(uint64_t), Stream{});
}

}  // namespace lockstep::cuda
