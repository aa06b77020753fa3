// Empty batches through every ops/ kernel: zero rows or tokens are valid input, write nothing
// and throw nothing; the embedding backward of zero tokens is an all-zero table.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/ops/embedding.h"
#include "lockstep/ops/moe_routing.h"
#include "lockstep/ops/optim.h"
#include "lockstep/ops/rmsnorm.h"
#include "lockstep/ops/rope.h"
#include "lockstep/ops/softmax.h"
#include "lockstep/ops/swiglu.h"

using namespace lockstep::ops;

TEST(OpsEmptyBatch, ZeroRowsAreAcceptedEverywhere) {
  float s = NAN;  // a stand-in pointer target that must stay untouched
  int32_t id = 0;
  rmsnorm_fwd_cpu<float>(&s, &s, 0, 8, 1e-6f, &s, &s);
  std::vector<float> dw(8, NAN);
  rmsnorm_bwd_cpu<float>(&s, &s, &s, &s, 0, 8, &s, dw.data());
  for (float x : dw) EXPECT_EQ(x, 0.0f);  // the sum over no rows
  std::vector<float> table(4 * 8, 1.0f);
  rope_fwd_cpu<float>(&s, &id, 0, 2, 8, table.data(), table.data(), 4, &s);
  softmax_fwd_cpu<float>(&s, 0, 5, &s);
  log_softmax_bwd_cpu<float>(&s, &s, 0, 5, &s);
  token_logprobs_fwd_cpu<float>(&s, &id, 0, 5, &s, &s, &s);
  swiglu_fwd_cpu<float>(&s, &s, 0, 4, &s);
  moe_router_topk_fwd_cpu<float>(&s, 0, 4, 2, true, &s, &id, &s);
  const MoePermutation p = moe_permutation_cpu(&id, 0, 4, 2);
  moe_combine_fwd_cpu<float>(&s, &s, p, 8, &s);
  embedding_fwd_cpu<float>(table.data(), 4, 8, &id, 0, &s);
  embedding_bwd_cpu<float>(&s, &id, 0, 4, 8, table.data());
  for (float x : table) EXPECT_EQ(x, 0.0f);
  adamw_step_cpu<float>(&s, &s, &s, &s, 0, AdamWConfig{}, 1);
  EXPECT_EQ(grad_norm_cpu<float>({}), 0.0);
  EXPECT_TRUE(std::isnan(s));
}
