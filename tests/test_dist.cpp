// The dist layer on the CPU: the fake transport's collectives (fixed rank order, the same bits on
// every run), the fixed-tree gradient reduction for 1, 2 and 4 ranks against its single-rank
// specification, the weight-broadcast protocol over several ranks (exact reassembly, corrupted
// buckets, headers and versions refused), and the NCCL entry points of a build without NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>

#include "lockstep/dist/communicator.h"
#include "lockstep/dist/grad_reduce.h"
#include "lockstep/dist/nccl.h"
#include "lockstep/dist/policy_broadcast.h"
#include "lockstep/model/policy.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/ops/tensor_ops.h"
#include "test_util.h"
#include "tiny_model_util.h"

namespace lockstep {
namespace {

using dist::Communicator;
using model::PolicyError;
using model::PolicyVersion;
using test::test_seed;

// F32 [n] with values of very different magnitudes (so the order of additions shows in the bits),
// from Philox stream `stream`.
Tensor spread_values(int64_t n, uint32_t stream) {
  std::vector<float> v(size_t(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t r = num::philox_element_word(test_seed(), stream, uint64_t(i));
    const float u = float(r >> 8) * (1.0f / 8388608.0f) - 1.0f;  // [-1, 1)
    v[size_t(i)] = u * std::ldexp(1.0f, int(i % 23) - 11);
  }
  return from_f32(v, {n});
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto b = t.bytes();
  std::vector<uint8_t> out(b.size());
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

TEST(DistFake, AllReduceIsTheRankOrderLeftFold) {
  constexpr int kRanks = 4;
  constexpr int64_t kN = 1000;
  Tensor want = spread_values(kN, 0).clone();
  for (int r = 1; r < kRanks; ++r) {
    const Tensor x = spread_values(kN, uint32_t(r));
    for (int64_t i = 0; i < kN; ++i) want.data<float>()[size_t(i)] += x.data<float>()[size_t(i)];
  }
  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<uint8_t>> got(kRanks);
    dist::run_fake_ranks(kRanks, [&](Communicator& c) {
      Tensor t = spread_values(kN, uint32_t(c.rank()));
      c.all_reduce_sum(t);
      got[size_t(c.rank())] = bytes_of(t);
    });
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(got[size_t(r)], bytes_of(want)) << "rank " << r;
  }
}

TEST(DistFake, AllGatherBroadcastAndBarrier) {
  constexpr int kRanks = 3;
  std::vector<std::vector<uint8_t>> gathered(kRanks), received(kRanks);
  dist::run_fake_ranks(kRanks, [&](Communicator& c) {
    Tensor in = from_f32(std::vector<float>{float(c.rank()), float(10 * c.rank())}, {2});
    Tensor out(DType::kF32, {kRanks, 2});
    c.all_gather(in, out);
    gathered[size_t(c.rank())] = bytes_of(out);
    Tensor b(DType::kU8, {5});
    if (c.rank() == 2) b.fill_bytes(7);
    c.broadcast(b, /*root=*/2);
    received[size_t(c.rank())] = bytes_of(b);
    c.barrier();
  });
  const Tensor want = from_f32(std::vector<float>{0, 0, 1, 10, 2, 20}, {kRanks, 2});
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(gathered[size_t(r)], bytes_of(want));
    EXPECT_EQ(received[size_t(r)], std::vector<uint8_t>(5, 7));
  }
}

TEST(DistFake, MismatchedShapesAndDepartedRanksAreErrorsNotHangs) {
  // Rank 1 gives another shape: every rank sees the same mismatch.
  EXPECT_THROW(dist::run_fake_ranks(2,
                                    [](Communicator& c) {
                                      Tensor t(DType::kF32, {c.rank() == 1 ? 3 : 2});
                                      c.all_reduce_sum(t);
                                    }),
               std::invalid_argument);
  // Rank 0 fails before the collective; rank 1's collective fails instead of waiting forever, and
  // the error reported is rank 0's own.
  try {
    dist::run_fake_ranks(2, [](Communicator& c) {
      if (c.rank() == 0) throw std::runtime_error("rank 0 failed");
      c.barrier();
    });
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 0 failed");
  }
  EXPECT_THROW(dist::make_fake_group(0), std::invalid_argument);
}

// ---- gradient reduction ---------------------------------------------------------------------

TEST(DistGradReduce, OneTwoAndFourRanksGiveTheTreeSumBits) {
  constexpr int64_t kSlots = 8, kN = 777;
  std::vector<Tensor> slots;
  for (int64_t s = 0; s < kSlots; ++s) slots.push_back(spread_values(kN, uint32_t(100 + s)));
  const double scale = 1.0 / double(kSlots);
  const Tensor spec = ops::scale(dist::tree_sum(slots), scale);
  // The tree's order is visible: a left fold over the slots gives other bits for these values.
  Tensor fold = slots[0].clone();
  for (int64_t s = 1; s < kSlots; ++s) ops::add_inplace(fold, slots[size_t(s)]);
  EXPECT_NE(bytes_of(ops::scale(fold, scale)), bytes_of(spec));

  for (int ranks : {1, 2, 4}) {
    for (int run = 0; run < 2; ++run) {
      std::vector<std::vector<uint8_t>> got(static_cast<size_t>(ranks));
      dist::run_fake_ranks(ranks, [&](Communicator& c) {
        const int64_t k = kSlots / ranks;
        const std::span<const Tensor> mine(slots.data() + c.rank() * k, size_t(k));
        got[size_t(c.rank())] = bytes_of(dist::reduce_gradients(c, mine, scale));
      });
      for (int r = 0; r < ranks; ++r)
        EXPECT_EQ(got[size_t(r)], bytes_of(spec))
            << ranks << " ranks, rank " << r << ", run " << run;
    }
  }
}

TEST(DistGradReduce, RefusesCountsOffTheTree) {
  std::vector<Tensor> three(3, Tensor(DType::kF32, {4}));
  EXPECT_THROW(dist::tree_sum(three), std::invalid_argument);
  EXPECT_THROW(
      dist::run_fake_ranks(
          3, [&](Communicator& c) { dist::reduce_gradients(c, std::span(three).first(1)); }),
      std::invalid_argument);
  std::vector<Tensor> mixed = {Tensor(DType::kF32, {4}), Tensor(DType::kF32, {5})};
  EXPECT_THROW(dist::tree_sum(mixed), std::invalid_argument);
}

// ---- weight broadcast -------------------------------------------------------------------------

PolicyVersion tiny_policy(int64_t version) {
  test::TinyOptions o;
  o.moe = true;
  o.shared_expert = true;
  const model::ModelWeights w = test::tiny_weights(test::tiny_config(o), test_seed() + 31);
  return model::export_policy(w, builtin_recipe_or_throw("nvfp4_per_token", "test").recipe,
                              version);
}

void expect_same_policy(const PolicyVersion& a, const PolicyVersion& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.checksum, b.checksum);
  EXPECT_EQ(model::policy_checksum(b), a.checksum);
  EXPECT_EQ(a.recipe.name, b.recipe.name);
  EXPECT_EQ(a.config, b.config);
  EXPECT_EQ(a.dims, b.dims);
  ASSERT_EQ(a.dense.size(), b.dense.size());
  ASSERT_EQ(a.operands.size(), b.operands.size());
  for (const auto& [key, o] : a.operands) {
    const nn::Operand& p = b.operands.at(key);
    EXPECT_EQ(o.quantized(), p.quantized()) << key;
    EXPECT_EQ(o.q.describe(), p.q.describe()) << key;
    EXPECT_EQ(o.q.group_offsets, p.q.group_offsets) << key;
  }
}

TEST(DistPolicyBroadcast, EveryRankReassemblesTheVersionExactly) {
  const PolicyVersion sent = tiny_policy(3);
  for (size_t bucket : {size_t(1000), size_t(1) << 20}) {
    constexpr int kRanks = 4;
    std::vector<PolicyVersion> got(kRanks);
    std::vector<dist::PolicyBroadcastStats> stats(kRanks);
    dist::run_fake_ranks(kRanks, [&](Communicator& c) {
      dist::PolicyBroadcastOptions opt;
      opt.root = 1;
      opt.bucket_bytes = bucket;
      got[size_t(c.rank())] = dist::broadcast_policy(
          c, c.rank() == 1 ? &sent : nullptr, 3, "nvfp4_per_token", opt, &stats[size_t(c.rank())]);
    });
    EXPECT_EQ(stats[0].payload_bytes, sent.nbytes());
    EXPECT_EQ(stats[0].buckets, int64_t((sent.nbytes() + bucket - 1) / bucket));
    if (bucket == 1000) {
      EXPECT_GT(stats[0].buckets, 10);
    }
    for (int r = 0; r < kRanks; ++r) {
      expect_same_policy(sent, got[size_t(r)]);
      EXPECT_EQ(stats[size_t(r)].buckets, stats[0].buckets);
    }
  }
}

// Runs a 3-rank broadcast of `sent` (root 0, 4 KiB buckets) where `corrupt` may change what rank
// 2 receives. Returns rank 2's error (empty when it accepted the version); `others` gets what
// ranks 0 and 1 raised (empty when they finished cleanly).
std::string rank2_error(const PolicyVersion& sent, int64_t expected,
                        std::function<void(int64_t call, Tensor& t)> corrupt,
                        std::string* others = nullptr) {
  dist::FakeTransportOptions fake;
  fake.on_broadcast_received = [&](int rank, int64_t call, Tensor& t) {
    if (rank == 2 && corrupt) corrupt(call, t);
  };
  std::string err, other;
  std::mutex m;
  dist::run_fake_ranks(
      3,
      [&](Communicator& c) {
        dist::PolicyBroadcastOptions opt;
        opt.bucket_bytes = 4096;
        try {
          dist::broadcast_policy(c, c.rank() == 0 ? &sent : nullptr, expected, "", opt);
        } catch (const std::runtime_error& e) {
          std::lock_guard lock(m);
          (c.rank() == 2 ? err : other) += e.what();
        }
      },
      fake);
  if (others)
    *others = other;
  else
    EXPECT_EQ(other, "") << "ranks 0 and 1 must finish cleanly";
  return err;
}

TEST(DistPolicyBroadcast, CorruptedBucketsHeadersAndWrongVersionsAreRefused) {
  const PolicyVersion sent = tiny_policy(7);
  EXPECT_EQ(rank2_error(sent, 7, nullptr), "");
  // Calls: 0 preamble, 1 header, 2.. buckets. One flipped bit in bucket 3 (call 5).
  const std::string bad_bucket = rank2_error(sent, 7, [](int64_t call, Tensor& t) {
    if (call == 5) t.bytes()[t.nbytes() / 2] ^= std::byte{0x10};
  });
  EXPECT_NE(bad_bucket.find("bucket 3 of"), std::string::npos) << bad_bucket;
  EXPECT_NE(bad_bucket.find("refused"), std::string::npos) << bad_bucket;
  const std::string bad_header = rank2_error(sent, 7, [](int64_t call, Tensor& t) {
    if (call == 1) t.bytes()[10] ^= std::byte{0x01};
  });
  EXPECT_NE(bad_header.find("header does not hash"), std::string::npos) << bad_header;
  std::string rank1;  // every receiver expects version 8 here
  const std::string old = rank2_error(sent, 8, nullptr, &rank1);
  EXPECT_NE(old.find("rank 2: version 7 refused (expected 8)"), std::string::npos) << old;
  EXPECT_NE(rank1.find("rank 1: version 7 refused (expected 8)"), std::string::npos) << rank1;
  // A preamble that does not verify stops rank 2 at once (the sizes of what follows are
  // unknown); the sender's next broadcast then fails naming it instead of waiting forever.
  std::string others;
  const std::string bad_pre = rank2_error(
      sent, 7,
      [](int64_t call, Tensor& t) {
        if (call == 0) t.bytes()[0] ^= std::byte{0x01};
      },
      &others);
  EXPECT_NE(bad_pre.find("preamble that does not verify"), std::string::npos) << bad_pre;
  EXPECT_NE(others.find("left the group"), std::string::npos) << others;
}

TEST(DistPolicyBroadcast, ASenderChecksumThatDoesNotVerifyIsRefused) {
  PolicyVersion sent = tiny_policy(2);
  sent.checksum ^= 1;  // the bytes arrive intact, but they are not the version the stamp names
  std::vector<std::string> errors(2);
  dist::run_fake_ranks(2, [&](Communicator& c) {
    try {
      dist::broadcast_policy(c, c.rank() == 0 ? &sent : nullptr, 2, "nvfp4_per_token");
    } catch (const PolicyError& e) {
      errors[size_t(c.rank())] = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("does not verify"), std::string::npos) << errors[1];
}

TEST(DistNccl, EntryPointsOfThisBuild) {
  dist::force_nvls_off();
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  EXPECT_STREQ(std::getenv("NVSHMEM_DISABLE_NVLS"), "1");
  EXPECT_STREQ(std::getenv("TORCH_SYMM_MEM_DISABLE_MULTICAST"), "1");
  if (dist::nccl_compiled()) GTEST_SKIP() << "NCCL compiled in: exercised on the GPU machine";
  EXPECT_THROW(dist::nccl_unique_id(), std::runtime_error);
  EXPECT_THROW(dist::make_nccl_communicator({}, 0, 1, Device::cuda(0)), std::runtime_error);
}

}  // namespace
}  // namespace lockstep
