// Helpers shared by the RL objective tests: the randomized-test seed (LOCKSTEP_TEST_SEED replays
// one) and builders for packed response batches.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace lockstep::rl::testing {

// A fresh seed per test binary run, or LOCKSTEP_TEST_SEED when set; tests print it on failure.
inline uint64_t test_seed() {
  static const uint64_t s = [] {
    if (const char* e = std::getenv("LOCKSTEP_TEST_SEED")) return uint64_t(std::stoull(e));
    return uint64_t(std::random_device{}());
  }();
  return s;
}

// offsets [R + 1] of responses with the given lengths.
inline std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> o = {0};
  for (int64_t n : lengths) o.push_back(o.back() + n);
  return o;
}

}  // namespace lockstep::rl::testing
