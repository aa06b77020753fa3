// The row kernels of the fast CPU quantizers (quantize_rows_cpu.h): NVFP4 1-D and 2-D blocks,
// MXFP8 and FP8 over bf16 or fp32 rows, sixteen lanes at a time (simd16_cpu.h), each built for
// AVX-512, AVX2 and the x86-64 baseline and picked at run time (set_isa forces one for tests).
// Blocks are handled sixteen at a time so that their scale arithmetic runs in vector lanes too; a
// row's last partial chunk goes through a zero-padded copy so that every chunk takes the same code
// path.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>

#include "lockstep/numerics/codecs.h"
#include "quantize_rows_cpu.h"
#include "simd16_cpu.h"

namespace lockstep::cpu::rows {
namespace {

using namespace v16;

// Bits of element i as fp32.
LOCKSTEP_V16 uint32_t elem_bits(const uint16_t* x, int64_t i) { return uint32_t(x[i]) << 16; }
LOCKSTEP_V16 uint32_t elem_bits(const float* x, int64_t i) { return num::f32_bits(x[i]); }

LOCKSTEP_V16 uint32_t key_of(uint32_t b) {
  const uint32_t m = b & 0x7FFFFFFFu;
  return m > 0x7F800000u ? 0u : m + 1u;
}

// ---- NVFP4 -------------------------------------------------------------------------------------
// One chunk of 16 blocks (256 columns) of `nrows` rows (row stride xs, output row stride ds): the
// blocks' amax runs over all nrows rows (1 for 1-D blocks, 16 for 2-D tiles).
template <class S>
LOCKSTEP_V16 void nvfp4_chunk(const S* x, int64_t xs, int nrows, float kx, float sdec,
                              uint8_t* scales, uint8_t* data, int64_t ds, U& nf) {
  U keys[16];
  for (int k = 0; k < 16; ++k) {
    U acc{};
    for (int r = 0; r < nrows; ++r) {
      const U v = load(x + r * xs + 16 * k);
      acc = max_u(acc, amax_key(v));
      nf += nonfinite(v);
    }
    keys[k] = acc;
  }
  const Nvfp4Blocks b = nvfp4_blocks(max_of_each(keys), kx, sdec);
  store_bytes(scales, b.scale);
  for (int r = 0; r < nrows; ++r)
    for (int k = 0; k < 16; k += 2) {
      const U c0 = e2m1(flt(load(x + r * xs + 16 * k)) * b.enc[k]);
      const U c1 = e2m1(flt(load(x + r * xs + 16 * k + 16)) * b.enc[k + 1]);
      store_e2m1x32(data + r * ds + 8 * k, c0, c1);
    }
}

template <class S>
LOCKSTEP_V16 uint64_t nvfp4_rows_impl(const S* x, int64_t cols, int nrows, float kx, float sdec,
                                      uint8_t* scales, uint8_t* data) {
  const int64_t nb = cols / 16, ds = cols / 2;
  U nf{};
  int64_t j = 0;
  for (; j + 16 <= nb; j += 16)
    nvfp4_chunk(x + 16 * j, cols, nrows, kx, sdec, scales + j, data + 8 * j, ds, nf);
  if (j < nb) {
    const int64_t n = (nb - j) * 16;
    S pad[16 * 256] = {};  // the row tails, zero-padded to whole chunks (zeros are finite)
    for (int r = 0; r < nrows; ++r)
      std::copy(x + r * cols + 16 * j, x + r * cols + 16 * j + n, pad + 256 * r);
    uint8_t sc[16], d[16 * 128];
    nvfp4_chunk(pad, 256, nrows, kx, sdec, sc, d, 128, nf);
    std::memcpy(scales + j, sc, size_t(nb - j));
    for (int r = 0; r < nrows; ++r) std::memcpy(data + r * ds + 8 * j, d + 128 * r, size_t(n / 2));
  }
  return hsum(nf);
}

// ---- MXFP8 -------------------------------------------------------------------------------------
// One chunk of 16 blocks of 32 (512 columns).
template <class S, bool kE5M2>
LOCKSTEP_V16 void mxfp8_chunk(const S* x, float inv_max, uint8_t* scales, uint8_t* data, U& nf) {
  U keys[16];
  for (int k = 0; k < 16; ++k) {
    const U v0 = load(x + 32 * k), v1 = load(x + 32 * k + 16);
    keys[k] = max_u(amax_key(v0), amax_key(v1));
    nf += nonfinite(v0) + nonfinite(v1);
  }
  const MxBlocks m = mx_blocks(max_of_each(keys), inv_max);
  store_bytes(scales, m.exponent);
  for (int k = 0; k < 32; ++k) {
    const F v = flt(load(x + 16 * k)) * m.factor[k / 2];
    store_bytes(data + 16 * k, kE5M2 ? e5m2(v) : e4m3(v));
  }
}

template <class S, bool kE5M2>
LOCKSTEP_V16 uint64_t mxfp8_row_impl(const S* x, int64_t cols, float inv_max, uint8_t* scales,
                                     uint8_t* data) {
  const int64_t nb = cols / 32;
  U nf{};
  int64_t j = 0;
  for (; j + 16 <= nb; j += 16)
    mxfp8_chunk<S, kE5M2>(x + 32 * j, inv_max, scales + j, data + 32 * j, nf);
  if (j < nb) {
    const int64_t n = (nb - j) * 32;
    S pad[512] = {};
    std::copy(x + 32 * j, x + 32 * j + n, pad);
    uint8_t sc[16], d[512];
    mxfp8_chunk<S, kE5M2>(pad, inv_max, sc, d, nf);
    std::memcpy(scales + j, sc, size_t(nb - j));
    std::memcpy(data + 32 * j, d, size_t(n));
  }
  return hsum(nf);
}

// ---- FP8 and amax ------------------------------------------------------------------------------
template <class S, bool kE5M2>
LOCKSTEP_V16 uint64_t fp8_impl(const S* x, int64_t n, float scale, uint8_t* data) {
  U nf{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const U v = load(x + i);
    nf += nonfinite(v);
    store_bytes(data + i, kE5M2 ? e5m2(flt(v) * scale) : e4m3(flt(v) * scale));
  }
  uint64_t count = hsum(nf);
  for (; i < n; ++i) {
    const float v = num::f32_from_bits(elem_bits(x, i));
    count += num::is_finite(v) ? 0 : 1;
    const float s = num::mul_rn(v, scale);
    data[i] = kE5M2 ? num::encode_e5m2(s) : num::encode_e4m3(s);
  }
  return count;
}

template <class S>
LOCKSTEP_V16 uint32_t amax_key_impl(const S* x, int64_t n) {
  U a0{}, a1{};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = max_u(a0, amax_key(load(x + i)));
    a1 = max_u(a1, amax_key(load(x + i + 16)));
  }
  for (; i + 16 <= n; i += 16) a0 = max_u(a0, amax_key(load(x + i)));
  uint32_t k = hmax(max_u(a0, a1));
  for (; i < n; ++i) k = std::max(k, key_of(elem_bits(x, i)));
  return k;
}

// The five kernels built for one instruction set: TARGET is a GCC target attribute (or nothing
// for the x86-64 baseline); the always-inline helpers compile into each copy in its own ISA.
#define LOCKSTEP_ISA_KERNELS(NS, TARGET)                                                           \
  namespace NS {                                                                                   \
  template <class S>                                                                               \
  TARGET uint32_t row_amax_key(const S* x, int64_t n) {                                            \
    return amax_key_impl(x, n);                                                                    \
  }                                                                                                \
  template <class S>                                                                               \
  TARGET uint64_t nvfp4_row(const S* x, int64_t cols, float kx, float sdec, uint8_t* scales,       \
                            uint8_t* data) {                                                       \
    return nvfp4_rows_impl(x, cols, 1, kx, sdec, scales, data);                                    \
  }                                                                                                \
  template <class S>                                                                               \
  TARGET uint64_t nvfp4_tile_rows(const S* x, int64_t cols, float kx, float sdec, uint8_t* scales, \
                                  uint8_t* data) {                                                 \
    return nvfp4_rows_impl(x, cols, 16, kx, sdec, scales, data);                                   \
  }                                                                                                \
  template <class S>                                                                               \
  TARGET uint64_t mxfp8_row(const S* x, int64_t cols, bool e5m2, float inv_max, uint8_t* scales,   \
                            uint8_t* data) {                                                       \
    return e5m2 ? mxfp8_row_impl<S, true>(x, cols, inv_max, scales, data)                          \
                : mxfp8_row_impl<S, false>(x, cols, inv_max, scales, data);                        \
  }                                                                                                \
  template <class S>                                                                               \
  TARGET uint64_t fp8_scaled(const S* x, int64_t n, float scale, bool e5m2, uint8_t* data) {       \
    return e5m2 ? fp8_impl<S, true>(x, n, scale, data) : fp8_impl<S, false>(x, n, scale, data);    \
  }                                                                                                \
  }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOCKSTEP_HAVE_ISA_VARIANTS 1
LOCKSTEP_ISA_KERNELS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))))
LOCKSTEP_ISA_KERNELS(avx2, __attribute__((target("avx2"))))
#endif
LOCKSTEP_ISA_KERNELS(baseline, )
#undef LOCKSTEP_ISA_KERNELS

Isa detect_isa() {
#if defined(LOCKSTEP_HAVE_ISA_VARIANTS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa{detect_isa()};
  return isa;
}

}  // namespace

Isa best_isa() { return detect_isa(); }
Isa active_isa() { return active().load(std::memory_order_relaxed); }
void set_isa(Isa isa) {
  if (int(isa) > int(best_isa()))
    throw std::invalid_argument(
        fmt::format("CPU quantizer: instruction set {} is not supported by "
                    "this CPU (best: {})",
                    isa_name(isa), isa_name(best_isa())));
  active().store(isa, std::memory_order_relaxed);
}
const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "baseline";
  }
}

// Calls kernel FN of the active instruction set.
#if defined(LOCKSTEP_HAVE_ISA_VARIANTS)
#define LOCKSTEP_DISPATCH(FN, ...)         \
  switch (active_isa()) {                  \
    case Isa::kAvx512:                     \
      return avx512::FN<S>(__VA_ARGS__);   \
    case Isa::kAvx2:                       \
      return avx2::FN<S>(__VA_ARGS__);     \
    default:                               \
      return baseline::FN<S>(__VA_ARGS__); \
  }
#else
#define LOCKSTEP_DISPATCH(FN, ...) return baseline::FN<S>(__VA_ARGS__);
#endif

template <class S>
uint32_t row_amax_key(const S* x, int64_t n) {
  LOCKSTEP_DISPATCH(row_amax_key, x, n)
}
template <class S>
uint64_t nvfp4_row(const S* x, int64_t cols, float s_enc_x_inv_max, float s_dec, uint8_t* scales,
                   uint8_t* data) {
  LOCKSTEP_DISPATCH(nvfp4_row, x, cols, s_enc_x_inv_max, s_dec, scales, data)
}
template <class S>
uint64_t nvfp4_tile_rows(const S* x, int64_t cols, float s_enc_x_inv_max, float s_dec,
                         uint8_t* scales, uint8_t* data) {
  LOCKSTEP_DISPATCH(nvfp4_tile_rows, x, cols, s_enc_x_inv_max, s_dec, scales, data)
}
template <class S>
uint64_t mxfp8_row(const S* x, int64_t cols, bool e5m2, float inv_max, uint8_t* scales,
                   uint8_t* data) {
  LOCKSTEP_DISPATCH(mxfp8_row, x, cols, e5m2, inv_max, scales, data)
}
template <class S>
uint64_t fp8_scaled(const S* x, int64_t n, float scale, bool e5m2,
                    uint8_t* data){LOCKSTEP_DISPATCH(fp8_scaled, x, n, scale, e5m2, data)}
#undef LOCKSTEP_DISPATCH

#define LOCKSTEP_ROW_KERNELS(S)                                                              \
  template uint32_t row_amax_key<S>(const S*, int64_t);                                      \
  template uint64_t nvfp4_row<S>(const S*, int64_t, float, float, uint8_t*, uint8_t*);       \
  template uint64_t nvfp4_tile_rows<S>(const S*, int64_t, float, float, uint8_t*, uint8_t*); \
  template uint64_t mxfp8_row<S>(const S*, int64_t, bool, float, uint8_t*, uint8_t*);        \
  template uint64_t fp8_scaled<S>(const S*, int64_t, float, bool, uint8_t*);
LOCKSTEP_ROW_KERNELS(uint16_t) LOCKSTEP_ROW_KERNELS(float)
#undef LOCKSTEP_ROW_KERNELS

}  // namespace lockstep::cpu::rows
