// The sampler's KV cache (model/decoder.h): one ops::KvCacheLayer per layer, slots reused across
// sequences.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "lockstep/model/decoder.h"

namespace lockstep::model {

KvCache::KvCache(const ModelConfig& c, KvDtype dtype, int64_t slots, int64_t max_pos, Device device)
    : used_(size_t(std::max<int64_t>(slots, 0)), false),
      max_pos_(max_pos),
      dtype_(dtype),
      device_(device) {
  if (slots < 1 || max_pos < 1 || max_pos > c.max_position_embeddings)
    throw std::invalid_argument(
        fmt::format("kv cache: {} slots of {} positions (need >= 1 slot and 1 .. {} positions)",
                    slots, max_pos, c.max_position_embeddings));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    layers_.push_back(
        ops::kv_cache_layer(slots, max_pos, c.num_key_value_heads, c.head_dim, dtype, device));
}

int64_t KvCache::acquire() {
  for (size_t i = 0; i < used_.size(); ++i)
    if (!used_[i]) {
      used_[i] = true;
      return int64_t(i);
    }
  throw std::runtime_error(fmt::format("kv cache: all {} slots are in use", used_.size()));
}

void KvCache::release(int64_t slot) { used_.at(size_t(slot)) = false; }

int64_t KvCache::in_use() const { return int64_t(std::count(used_.begin(), used_.end(), true)); }

size_t KvCache::bytes_per_slot() const {
  size_t n = 0;
  for (const ops::KvCacheLayer& L : layers_)
    for (const Tensor* t : {&L.k, &L.v, &L.k_scale, &L.v_scale})
      if (t->defined()) n += t->nbytes() / size_t(L.slots());
  return n;
}

}  // namespace lockstep::model
