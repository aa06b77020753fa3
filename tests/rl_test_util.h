// Helpers shared by the RL objective tests: the randomized-test seed (LOCKSTEP_TEST_SEED replays
// one) and builders for packed response batches.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace lockstep::rl::testing {

using lockstep::test::test_seed;

// offsets [R + 1] of responses with the given lengths.
inline std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> o = {0};
  for (int64_t n : lengths) o.push_back(o.back() + n);
  return o;
}

}  // namespace lockstep::rl::testing
