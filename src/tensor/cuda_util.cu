// upload_words (cuda_util.h): small host arrays carried to the device in kernel parameters, so
// that a call can hand its metadata (group offsets, tile tables) to its kernels without a host
// staging copy that might wait for the stream.
#include "cuda_util.h"

namespace lockstep::cuda {
namespace {

constexpr int kWordsPerLaunch = 1000;  // 4000 bytes of parameters (the portable limit is 4 KB)

struct WordChunk {
  uint32_t w[kWordsPerLaunch];
};

__global__ void upload_words_kernel(WordChunk c, uint32_t* dst, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = c.w[i];
}

}  // namespace

void upload_words(const uint32_t* words, size_t count, void* dst, cudaStream_t stream) {
  uint32_t* out = static_cast<uint32_t*>(dst);
  for (size_t i = 0; i < count; i += kWordsPerLaunch) {
    const int n = int(count - i < size_t(kWordsPerLaunch) ? count - i : size_t(kWordsPerLaunch));
    WordChunk c;
    for (int k = 0; k < n; ++k) c.w[k] = words[i + size_t(k)];
    upload_words_kernel<<<1, 256, 0, stream>>>(c, out + i, n);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace lockstep::cuda
