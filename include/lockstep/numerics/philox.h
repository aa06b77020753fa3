// Philox4x32-10 counter-based RNG (Salmon et al., SC'11), the single source of randomness in
// lockstep (CONTRACT.md section 5, DESIGN.md rule 5): the same (key, counter) gives the same
// words on CPU and GPU whatever the launch shape.
#pragma once

#include <cstdint>

#include "lockstep/numerics/hd.h"

namespace lockstep::num {

struct Philox4x32 {
  uint32_t v[4];
};

LOCKSTEP_HD inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

LOCKSTEP_HD inline Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, ctr.v[0], hi0, lo0);
    philox_mulhilo(kM1, ctr.v[2], hi1, lo1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

// The four random words CONTRACT.md section 5 (contract 1.1) assigns to elements 4q .. 4q + 3:
// key = (seed low, seed high), counter = (q low, q high, stream id, 0). Element i uses word i % 4
// of the call with q = i / 4, so one call serves four consecutive elements.
LOCKSTEP_HD inline Philox4x32 philox_quad_words(uint64_t seed, uint32_t stream, uint64_t quad) {
  Philox4x32 c{{uint32_t(quad), uint32_t(quad >> 32), stream, 0u}};
  return philox4x32_10(c, uint32_t(seed), uint32_t(seed >> 32));
}

// The round keys of philox4x32_10 for one seed, computed once: a kernel that makes many calls with
// one seed keeps them in registers instead of adding the Weyl constants again in every call.
struct PhiloxKeys {
  uint32_t k0[10], k1[10];
};
LOCKSTEP_HD inline PhiloxKeys philox_keys(uint64_t seed) {
  PhiloxKeys k{};
  for (int round = 0; round < 10; ++round) {
    k.k0[round] = uint32_t(seed) + uint32_t(round) * 0x9E3779B9u;
    k.k1[round] = uint32_t(seed >> 32) + uint32_t(round) * 0xBB67AE85u;
  }
  return k;
}

// philox_quad_words with the round keys of philox_keys(seed): the same four words.
LOCKSTEP_HD inline Philox4x32 philox_quad_words_keyed(const PhiloxKeys& k, uint32_t stream,
                                                      uint64_t quad) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  Philox4x32 c{{uint32_t(quad), uint32_t(quad >> 32), stream, 0u}};
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c.v[0], hi0, lo0);
    philox_mulhilo(kM1, c.v[2], hi1, lo1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ k.k0[round], lo1, hi0 ^ c.v[3] ^ k.k1[round], lo0}};
  }
  return c;
}

// The random word of one element (row-major index `index` in the tensor). Callers that handle four
// consecutive elements call philox_quad_words once instead.
LOCKSTEP_HD inline uint32_t philox_element_word(uint64_t seed, uint32_t stream, uint64_t index) {
  return philox_quad_words(seed, stream, index >> 2).v[index & 3u];
}

}  // namespace lockstep::num
