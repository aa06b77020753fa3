// Content digests (tensor/digest.h): the host word-sum loop, and the dispatch that sends device
// tensors to the CUDA kernel so their bytes never cross to the host.
#include "lockstep/tensor/digest.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <map>
#include <stdexcept>

#include "cpu_parallel.h"
#include "lockstep/numerics/digest64.h"

#if defined(LOCKSTEP_HAVE_CUDA)
#include "digest_cuda.h"
#endif

namespace lockstep {
namespace {

// The word terms of n bytes at p, summed mod 2^64 (wrapping addition is associative and
// commutative, so the OpenMP reduction gives the value of the serial loop).
uint64_t word_sum(const unsigned char* p, size_t n) {
  const int64_t full = int64_t(n / 8);
  uint64_t s = 0;
#pragma omp parallel for reduction(+ : s) if (full > detail::kParallelMinWork) schedule(static)
  for (int64_t i = 0; i < full; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    if constexpr (std::endian::native == std::endian::big) w = num::digest_load_word(p + 8 * i, 8);
    s += num::digest_word_term(w, uint64_t(i));
  }
  if (const size_t tail = n % 8)
    s += num::digest_word_term(num::digest_load_word(p + 8 * full, tail), uint64_t(full));
  return s;
}

}  // namespace

uint64_t bytes_digest64(const void* p, size_t n) {
  return num::digest_finish(word_sum(static_cast<const unsigned char*>(p), n), n);
}

std::vector<uint64_t> tensor_digests64(std::span<const Tensor> tensors) {
  std::vector<uint64_t> out(tensors.size());
  std::vector<Tensor> packed(tensors.size());
  std::map<int, std::vector<size_t>> on_device;  // CUDA ordinal -> tensor indices
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined()) throw std::invalid_argument("tensor_digests64: undefined tensor");
    packed[i] = t.contiguous();
    if (t.is_cpu())
      out[i] = bytes_digest64(packed[i].raw(), packed[i].nbytes());
    else
      on_device[t.device().index].push_back(i);
  }
  for (const auto& [index, idx] : on_device) {
#if defined(LOCKSTEP_HAVE_CUDA)
    std::vector<const void*> ptrs;
    std::vector<size_t> sizes;
    for (const size_t i : idx) {
      ptrs.push_back(packed[i].raw());
      sizes.push_back(packed[i].nbytes());
    }
    std::vector<uint64_t> sums(idx.size());
    cuda::digest_word_sums(ptrs, sizes, Device::cuda(index), sums);
    for (size_t k = 0; k < idx.size(); ++k) out[idx[k]] = num::digest_finish(sums[k], sizes[k]);
#else
    throw std::runtime_error(
        fmt::format("tensor_digests64: {} lives on cuda:{}, and this build has no CUDA backend",
                    tensors[idx.front()].describe(), index));
#endif
  }
  return out;
}

}  // namespace lockstep
