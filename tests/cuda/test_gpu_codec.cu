// lockstep_test_gpu --op codec: every fp32 bit pattern through the fast element encoders of
// numerics/fast_codecs.h on the device, compared with the reference encoders of codecs.h (and every
// E4M3 code through the fast decoder; E2M1 stochastic rounding with three random words per input),
// so the kernels' shortcuts are checked exhaustively.
#include <cuda_runtime.h>

#include <string>

#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/fast_codecs.h"
#include "lockstep/tensor/tensor.h"
#include "tensor/cuda_util.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {
namespace {

// E2M1 stochastic rounding through e2m1_sr_code_magic against the reference rule for input a and
// random words: a hash of the input, and the two words on either side of u == frac (k with
// k 2^-24 at and just below the rounding fraction), where a one-ulp slip would show.
__device__ unsigned long long e2m1_sr_mismatches(float a, uint32_t i) {
  constexpr num::MiniFloat f = num::kE2M1;
  uint32_t h = i * 2654435761u;
  h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
  uint32_t r[3] = {h, h, h};
  const float t = fabsf(a);
  if (t < 6.0f) {  // (NaN compares false)
    const num::Bracket br = num::minifloat_bracket(f, t);
    if (br.hi > br.lo) {
      const float frac = num::div_rn(num::sub_rn(t, br.lo), num::sub_rn(br.hi, br.lo));
      const uint32_t k = uint32_t(ceilf(frac * 16777216.0f));  // frac * 2^24 is exact
      r[1] = (k << 8) | (h & 0xFFu);
      r[2] = ((k - 1u) << 8) | (h & 0xFFu);
    }
  }
  unsigned long long bad = 0;
#pragma unroll
  for (int j = 0; j < 3; ++j)
    bad += num::encode_e2m1_sr_fma(a, r[j]) != num::encode_minifloat_stochastic(f, a, r[j]);
  return bad;
}

__global__ void codec_check_kernel(unsigned long long* mismatches) {
  unsigned long long bad[4] = {0, 0, 0, 0};
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32);
       i += stride * 2) {
    const float a = __uint_as_float(uint32_t(i));
    const float b = __uint_as_float(uint32_t(i + stride < (uint64_t(1) << 32) ? i + stride : i));
    bad[0] += num::encode_e2m1_fast(a) != num::encode_e2m1(a);
    bad[0] += num::encode_e2m1_fast(b) != num::encode_e2m1(b);
    bad[0] += num::encode_e2m1_arith(a) != num::encode_e2m1(a);
    bad[0] += num::encode_e2m1_arith(b) != num::encode_e2m1(b);
    bad[0] += num::encode_e2m1_fma(a) != num::encode_e2m1(a);
    bad[0] += num::encode_e2m1_fma(b) != num::encode_e2m1(b);
    if (i < 256) {  // every E4M3 code: the cvt decode equals the reference (NaN codes: any NaN)
      const float d = num::decode_e4m3_fast(uint8_t(i)), r = num::decode_e4m3(uint8_t(i));
      bad[1] += num::is_nan(r) ? !num::is_nan(d) : __float_as_uint(d) != __float_as_uint(r);
    }
    const uint16_t e43 = num::encode_e4m3x2_fast(a, b);
    bad[1] += uint8_t(e43) != num::encode_e4m3(a);
    bad[1] += uint8_t(e43 >> 8) != num::encode_e4m3(b);
    const uint16_t e52 = num::encode_e5m2x2_fast(a, b);
    bad[2] += uint8_t(e52) != num::encode_e5m2(a);
    bad[2] += uint8_t(e52 >> 8) != num::encode_e5m2(b);
    bad[3] += e2m1_sr_mismatches(a, uint32_t(i)) + e2m1_sr_mismatches(b, uint32_t(i) ^ 0x5bd1e995u);
  }
  for (int k = 0; k < 4; ++k)
    if (bad[k]) atomicAdd(mismatches + k, bad[k]);
}

}  // namespace

void test_codec() {
  if (!want("codec") || g_opt.reduced) return;  // 2^32 inputs: too slow under compute-sanitizer
  const std::string name = "codec exhaustive (all 2^32 fp32 inputs, fast vs reference encoders)";
  if (!selected(name)) return;
  Tensor counts(DType::kU64, {4}, gpu());
  codec_check_kernel<<<132 * 16, 256>>>(static_cast<unsigned long long*>(counts.raw()));
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  const Tensor h = counts.to(Device::cpu());
  std::string err;
  const char* names[4] = {"e2m1", "e4m3", "e5m2", "e2m1 stochastic"};
  for (int k = 0; k < 4; ++k)
    if (h.data<uint64_t>()[size_t(k)])
      err += std::string(" ") + names[k] + ":" + std::to_string(h.data<uint64_t>()[size_t(k)]);
  report(name, err);
}

}  // namespace lockstep::gpu_test
