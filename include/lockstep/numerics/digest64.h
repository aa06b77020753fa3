// The 64-bit content digest behind the policy checksum (docs/model.md, "The policy checksum"):
// every 8-byte word of a byte string is mixed with its index on its own and the mixed words are
// summed modulo 2^64, so any split of the work (CPU threads, CUDA blocks, atomics) gives the same
// value; the mixing functions are written once here for the host and the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/numerics/hd.h"

namespace lockstep::num {

constexpr uint64_t kDigestWordKey = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd
constexpr uint64_t kDigestSeed = 0x6C6F636B73746570ull;     // "lockstep" as ASCII, big-endian

// The SplitMix64 finalizer: a bijection of 64-bit words with full avalanche; mix64(0) == 0.
LOCKSTEP_HD constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Word i (0-based) of a byte string: bytes 8i .. 8i+7 read little-endian (byte 8i is the least
// significant), the bytes past the end of the string taken as zero. Its term is
// mix64(w + (i + 1) * kDigestWordKey): a bijection of w for each i, so changing one word always
// changes the sum, and the same word at another index gives another term.
LOCKSTEP_HD constexpr uint64_t digest_word_term(uint64_t w, uint64_t i) {
  return mix64(w + (i + 1) * kDigestWordKey);
}

// The little-endian word of `n` (0 < n <= 8) bytes at p, zero-filled above byte n - 1.
LOCKSTEP_HD inline uint64_t digest_load_word(const unsigned char* p, size_t n) {
  uint64_t w = 0;
  for (size_t k = 0; k < n; ++k) w |= uint64_t(p[k]) << (8 * k);
  return w;
}

// digest(B) for a byte string of n bytes whose word terms sum to `sum` (mod 2^64): the length
// enters so that trailing zero bytes change the digest.
LOCKSTEP_HD constexpr uint64_t digest_finish(uint64_t sum, uint64_t n) {
  return mix64(sum ^ mix64(n + kDigestWordKey));
}

// One field folded into a running checksum, in order: absorb(h, x) = mix64((h ^ x) + key).
// Start from kDigestSeed. Unlike the word sum, the fold depends on the order of its fields.
LOCKSTEP_HD constexpr uint64_t digest_absorb(uint64_t h, uint64_t x) {
  return mix64((h ^ x) + kDigestWordKey);
}

}  // namespace lockstep::num
