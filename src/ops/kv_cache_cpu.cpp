// The KV cache on the CPU (ops/kv_cache.h): the shared rounding rule applied in place (the
// learner) or into cache codes (the sampler), and attention_row over a cache layer.
#include <algorithm>

#include "attention_heads.h"
#include "check.h"
#include "lockstep/ops/kv_cache.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops {

namespace {

// The fp8 scale of one (token, kv head) row of D values.
float row_scale(const float* x, int64_t D) {
  float a = num::amax_empty();
  for (int64_t d = 0; d < D; ++d) a = num::amax_fold(a, x[d]);
  return kv_fp8_scale(a);
}

}  // namespace

void kv_round_cpu(float* x, int64_t rows, int64_t kv_heads, int64_t head_dim, KvDtype dtype) {
  const int64_t n = rows * kv_heads;
#pragma omp parallel for schedule(static) if (n * head_dim >= detail::kParallelMinWork)
  for (int64_t r = 0; r < n; ++r) {
    float* p = x + r * head_dim;
    if (dtype == KvDtype::kBf16) {
      for (int64_t d = 0; d < head_dim; ++d) p[d] = kv_bf16_value(kv_bf16_code(p[d]));
    } else {
      const float s = row_scale(p, head_dim);
      for (int64_t d = 0; d < head_dim; ++d) p[d] = kv_fp8_value(kv_fp8_code(p[d], s), s);
    }
  }
}

void kv_cache_write_cpu(const KvCacheView& c, const float* k_rows, const float* v_rows,
                        const int64_t* slots, const int64_t* positions, int64_t rows) {
  const int64_t hkv = c.kv_heads, D = c.head_dim, W = hkv * D;
#pragma omp parallel for schedule(static) if (rows * W * 4 >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = slots[r] * c.max_pos + positions[r];  // position index in the cache
    for (int which = 0; which < 2; ++which) {
      const float* src = (which == 0 ? k_rows : v_rows) + r * W;
      void* dst = which == 0 ? c.k : c.v;
      for (int64_t g = 0; g < hkv; ++g) {
        const float* x = src + g * D;
        if (c.dtype == KvDtype::kBf16) {
          uint16_t* o = static_cast<uint16_t*>(dst) + at * W + g * D;
          for (int64_t d = 0; d < D; ++d) o[d] = kv_bf16_code(x[d]);
        } else {
          const float s = row_scale(x, D);
          (which == 0 ? c.k_scale : c.v_scale)[at * hkv + g] = s;
          uint8_t* o = static_cast<uint8_t*>(dst) + at * W + g * D;
          for (int64_t d = 0; d < D; ++d) o[d] = kv_fp8_code(x[d], s);
        }
      }
    }
  }
}

void attention_cached_cpu(const float* q, const KvCacheView& c, const int64_t* slots,
                          const int64_t* positions, int64_t rows, int64_t q_heads, float scale,
                          float* out, float* lse) {
  const int64_t hkv = c.kv_heads, D = c.head_dim, hq = q_heads, rep = hq / hkv;
  int64_t work = 0;
  for (int64_t r = 0; r < rows; ++r) work += (positions[r] + 1) * hq * D;
  with_row_heads(attention_row_heads(rep), [&](auto nh_c) {
    constexpr int NH = decltype(nh_c)::value;
    const int64_t calls_per_row = hq / NH, calls = rows * calls_per_row;
#pragma omp parallel if (work * 4 >= detail::kParallelMinWork && calls > 1)
    {
      float lse_scratch[kAttentionMaxRowHeads];
#pragma omp for schedule(dynamic, 4)
      for (int64_t i = 0; i < calls; ++i) {
        const int64_t r = i / calls_per_row, h0 = (i % calls_per_row) * NH, g = h0 / rep;
        const float* qr = q + (r * hq + h0) * D;
        float* o = out + (r * hq + h0) * D;
        float* l = lse ? lse + r * hq + h0 : lse_scratch;
        if (c.dtype == KvDtype::kBf16) {
          attention_row<NH, kAttentionMaxHeadDim>(HostWarp{},
                                                  cached_source<uint16_t>(c, slots[r], g, qr, D),
                                                  positions[r] + 1, D, scale, o, D, l, 1);
        } else {
          attention_row<NH, kAttentionMaxHeadDim>(HostWarp{},
                                                  cached_source<uint8_t>(c, slots[r], g, qr, D),
                                                  positions[r] + 1, D, scale, o, D, l, 1);
        }
      }
    }
  });
}

}  // namespace lockstep::ops
