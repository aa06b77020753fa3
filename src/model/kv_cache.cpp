// The sampler's KV cache (model/decoder.h): fp32 storage of values rounded to the cache dtype,
// slots reused across sequences so that continuous batching allocates nothing per token.
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "lockstep/model/decoder.h"
#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/hd.h"

namespace lockstep::model {

KvCache::KvCache(const ModelConfig& c, KvDtype dtype)
    : layers_(c.num_hidden_layers),
      hkv_(c.num_key_value_heads),
      d_(c.head_dim),
      max_pos_(c.max_position_embeddings),
      dtype_(dtype) {}

int64_t KvCache::acquire() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].used) {
      slots_[i].used = true;
      std::fill(slots_[i].ks.begin(), slots_[i].ks.end(), 0.0f);
      std::fill(slots_[i].vs.begin(), slots_[i].vs.end(), 0.0f);
      return int64_t(i);
    }
  Slot s;
  const size_t n = size_t(layers_ * max_pos_ * hkv_ * d_);
  s.k.assign(n, 0.0f);
  s.v.assign(n, 0.0f);
  s.ks.assign(size_t(layers_ * hkv_), 0.0f);
  s.vs.assign(size_t(layers_ * hkv_), 0.0f);
  s.used = true;
  slots_.push_back(std::move(s));
  return int64_t(slots_.size()) - 1;
}

void KvCache::release(int64_t slot) { slots_.at(size_t(slot)).used = false; }

float* KvCache::k(int64_t slot, int64_t layer) {
  return slots_[size_t(slot)].k.data() + layer * max_pos_ * hkv_ * d_;
}
float* KvCache::v(int64_t slot, int64_t layer) {
  return slots_[size_t(slot)].v.data() + layer * max_pos_ * hkv_ * d_;
}

size_t KvCache::bytes_per_slot() const {
  return size_t(2 * layers_ * max_pos_ * hkv_ * d_) * (dtype_ == KvDtype::kBf16 ? 2 : 1);
}

void KvCache::round_rows(int64_t slot, int64_t layer, float* k_rows, float* v_rows, int64_t rows) {
  Slot& s = slots_.at(size_t(slot));
  if (dtype_ == KvDtype::kBf16) {
    for (float* p : {k_rows, v_rows})
      for (int64_t i = 0; i < rows * hkv_ * d_; ++i)
        p[i] = num::bf16_to_f32(num::f32_to_bf16(p[i]));
    return;
  }
  // FP8 E4M3 per head: the scale is fixed by the first rows written (the prompt's prefill):
  // s = RN(448 / amax), or 1 when amax is 0; later values beyond it saturate at +-448 / s.
  for (int which = 0; which < 2; ++which) {
    float* p = which == 0 ? k_rows : v_rows;
    float* sc = (which == 0 ? s.ks.data() : s.vs.data()) + layer * hkv_;
    for (int64_t g = 0; g < hkv_; ++g) {
      if (sc[g] == 0.0f) {
        float amax = 0.0f;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < d_; ++d)
            amax = std::max(amax, std::fabs(p[(r * hkv_ + g) * d_ + d]));
        sc[g] = amax > 0.0f && std::isfinite(amax) ? num::div_rn(448.0f, amax) : 1.0f;
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < d_; ++d) {
          float& x = p[(r * hkv_ + g) * d_ + d];
          x = num::div_rn(num::decode_e4m3(num::encode_e4m3(num::mul_rn(x, sc[g]))), sc[g]);
        }
    }
  }
}

}  // namespace lockstep::model
