// The KV cache's numbers: the cache dtypes, the one rounding rule that the learner applies to its
// packed K / V and the sampler's cache stores (so both attend to the same values), and the
// attention_row source that reads a cache layer. Host and device (LOCKSTEP_HD); the Tensor-level
// entries (kv_round_inplace, kv_cache_write, attention_cached) are in ops/tensor_ops.h.
//
// Rounding of a K or V row [tokens, Hkv * D] (CONTRACT.md section 0 arithmetic):
//   bf16: every value RNE to bf16 (NaN stays NaN, inf stays inf).
//   fp8 (E4M3), per (token, kv head) row of D values x:
//     a = amax(x) (NaN ignored; a row of only NaN gives NaN);
//     s = RN(448 / a) when a > 0 and finite (FLT_MAX when that overflows), else 1;
//     code = E4M3(RN(x * s)) (RNE, satfinite: |x| * s beyond 448 gives +-448, NaN gives 0x7F);
//     value = RN(decode(code) / s).
//   The scale follows each token's own data, so a later token never saturates against an earlier
//   scale, and a token's value depends only on its own row: the learner's rounded K / V equal what
//   the sampler reads back from its cache bit for bit.
#pragma once

#include <cstdint>

#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/hd.h"
#include "lockstep/ops/attention.h"

namespace lockstep::ops {

enum class KvDtype : uint8_t { kBf16, kFp8E4M3 };

inline constexpr float kKvFp8Max = 448.0f;

// s from the row amax a (see above).
LOCKSTEP_HD inline float kv_fp8_scale(float amax) {
  if (!(amax > 0.0f) || !num::is_finite(amax)) return 1.0f;
  const float s = num::div_rn(kKvFp8Max, amax);
  return num::is_inf(s) ? num::kFltMax : s;
}
LOCKSTEP_HD inline uint8_t kv_fp8_code(float x, float s) {
  return num::encode_e4m3(num::mul_rn(x, s));
}
LOCKSTEP_HD inline float kv_fp8_value(uint8_t code, float s) {
  return num::div_rn(num::decode_e4m3(code), s);
}
LOCKSTEP_HD inline uint16_t kv_bf16_code(float x) { return num::f32_to_bf16(x); }
LOCKSTEP_HD inline float kv_bf16_value(uint16_t code) { return num::bf16_to_f32(code); }

// One cache layer as raw pointers: k, v [slots, max_pos, Hkv, D] of bf16 codes (uint16) or E4M3
// codes (uint8); k_scale, v_scale [slots, max_pos, Hkv] (fp8 only).
struct KvCacheView {
  void* k = nullptr;
  void* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  int64_t slots = 0, max_pos = 0, kv_heads = 0, head_dim = 0;
  KvDtype dtype = KvDtype::kBf16;
};

// attention_row source over one cache slot and kv head: key j at position j. Codes = uint16_t
// (bf16) or uint8_t (fp8). On a GPU, `vec` (D a multiple of 8, q 16-byte aligned) loads a full
// block of 8 codes as one vector.
template <class Codes>
struct CachedKvSource : RowQuery<float> {
  const Codes* k = nullptr;  // slot's position 0, kv head g
  const Codes* v_ = nullptr;
  const float* ks = nullptr;  // scale of position 0, kv head g (fp8)
  const float* vs = nullptr;
  int64_t stride = 0;        // codes per position (Hkv * D)
  int64_t scale_stride = 0;  // scales per position (Hkv)
  bool vec = false;

  LOCKSTEP_HD void load_k(int64_t j, int64_t d0, int n, float (&out)[kAttentionDimBlock]) const {
    const Codes* p = k + j * stride + d0;
    Codes c[kAttentionDimBlock] = {};  // entries past n are never read; zeroed for the compiler
#if defined(__CUDA_ARCH__)
    if (vec && n == kAttentionDimBlock) {
      if constexpr (sizeof(Codes) == 2) {
        const uint4 w = *reinterpret_cast<const uint4*>(p);
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
        LOCKSTEP_UNROLL
        for (int i = 0; i < 4; ++i)
          c[2 * i] = Codes(ws[i] & 0xFFFFu), c[2 * i + 1] = Codes(ws[i] >> 16);
      } else {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        const uint32_t ws[2] = {w.x, w.y};
        LOCKSTEP_UNROLL
        for (int i = 0; i < 8; ++i) c[i] = Codes((ws[i / 4] >> (8 * (i % 4))) & 0xFFu);
      }
    } else
#endif
    {
      LOCKSTEP_UNROLL
      for (int i = 0; i < kAttentionDimBlock; ++i)
        if (i < n) c[i] = p[i];
    }
    if constexpr (sizeof(Codes) == 2) {
      LOCKSTEP_UNROLL
      for (int i = 0; i < kAttentionDimBlock; ++i)
        if (i < n) out[i] = kv_bf16_value(c[i]);
    } else {
      const float s = ks[j * scale_stride];
      LOCKSTEP_UNROLL
      for (int i = 0; i < kAttentionDimBlock; ++i)
        if (i < n) out[i] = kv_fp8_value(c[i], s);
    }
  }
  LOCKSTEP_HD float v(int64_t j, int64_t d) const {
    if constexpr (sizeof(Codes) == 2) {
      return kv_bf16_value(v_[j * stride + d]);
    } else {
      return kv_fp8_value(v_[j * stride + d], vs[j * scale_stride]);
    }
  }
};

// The source for query row `q` (NH heads at q + h * q_head_stride) against slot `slot`, kv head g.
template <class Codes>
LOCKSTEP_HD inline CachedKvSource<Codes> cached_source(const KvCacheView& c, int64_t slot,
                                                       int64_t g, const float* q,
                                                       int64_t q_head_stride) {
  CachedKvSource<Codes> s;
  s.q = q;
  s.head_stride = q_head_stride;
  const int64_t pos0 = slot * c.max_pos;
  s.stride = c.kv_heads * c.head_dim;
  s.scale_stride = c.kv_heads;
  s.k = static_cast<const Codes*>(c.k) + pos0 * s.stride + g * c.head_dim;
  s.v_ = static_cast<const Codes*>(c.v) + pos0 * s.stride + g * c.head_dim;
  if (c.k_scale) {
    s.ks = c.k_scale + pos0 * c.kv_heads + g;
    s.vs = c.v_scale + pos0 * c.kv_heads + g;
  }
  return s;
}

// ---- CPU kernels (kv_cache_cpu.cpp) -------------------------------------------------------------

// x: [rows, Hkv * D] F32, rounded in place by the rule above.
void kv_round_cpu(float* x, int64_t rows, int64_t kv_heads, int64_t head_dim, KvDtype dtype);

// Row r of k_rows / v_rows [rows, Hkv * D] rounded by the rule and stored at (slots[r],
// positions[r]) of the cache (codes and, for fp8, scales). Indices checked by the caller.
void kv_cache_write_cpu(const KvCacheView& cache, const float* k_rows, const float* v_rows,
                        const int64_t* slots, const int64_t* positions, int64_t rows);

// out [rows, Hq * D]: row r attends to positions 0 .. positions[r] of slot slots[r] (attention_row
// per (row, GQA group) on the host); lse [rows, Hq] or null. Indices checked by the caller.
void attention_cached_cpu(const float* q, const KvCacheView& cache, const int64_t* slots,
                          const int64_t* positions, int64_t rows, int64_t q_heads, float scale,
                          float* out, float* lse);

}  // namespace lockstep::ops
