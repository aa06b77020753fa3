// The MoE routing ops (ops/moe.h) on the CPU: the grouped layout against an independent statement
// of its rules, the row moves against their definitions, and gather / combine as transposes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "lockstep/numerics/philox.h"
#include "lockstep/ops/moe.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep::test;

namespace {

Tensor ids_tensor2(const std::vector<int32_t>& v, int64_t T, int64_t k) {
  return Tensor::from_vector<int32_t>(v, {T, k}, DType::kI32);
}

// Random expert ids [T, k], distinct per token, drawn from seed; expert `skip` is never chosen.
std::vector<int32_t> random_ids(int64_t T, int64_t k, int64_t E, uint64_t seed, int32_t skip) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> row;
    uint64_t i = 0;
    while (int64_t(row.size()) < k) {
      const int32_t e = int32_t(num::philox_element_word(seed, 3, uint64_t(t) * 977 + i++) % E);
      if (e != skip && std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return ids;
}

Tensor randd(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<double> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = double(num::philox_element_word(seed, 5, i) % 2001) / 1000.0 - 1.0;
  return Tensor::from_vector<double>(v, {rows, cols}, DType::kF64);
}

}  // namespace

TEST(OpsMoeRoute, LayoutFollowsItsRules) {
  for (int64_t P : {1, 16, 128}) {
    const int64_t T = 37, k = 3, E = 8;
    const std::vector<int32_t> ids = random_ids(T, k, E, 11 + uint64_t(P), /*skip=*/5);
    const ops::MoeRoute r = ops::moe_route(ids_tensor2(ids, T, k), E, P);
    const std::vector<int64_t> off = vec<int64_t>(r.offsets);
    const std::vector<int32_t> src = vec<int32_t>(r.src_rows), sr = vec<int32_t>(r.slot_row);
    const int64_t want_rows = P == 1 ? T * k : (T * k + E * (P - 1) + P - 1) / P * P;
    ASSERT_EQ(r.rows, want_rows) << P;
    ASSERT_EQ(off.size(), size_t(E + 1));
    EXPECT_EQ(off.front(), 0);
    EXPECT_EQ(off.back(), r.rows);
    // Per expert: its slots in ascending (t, s) order, then -1 padding, each a multiple of P.
    std::map<int32_t, std::vector<int64_t>> slots_of;
    for (int64_t i = 0; i < T * k; ++i) slots_of[ids[size_t(i)]].push_back(i);
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(off[size_t(e)] % P, 0) << "P " << P << " expert " << e;
      const std::vector<int64_t>& sl = slots_of[int32_t(e)];
      ASSERT_GE(off[size_t(e + 1)] - off[size_t(e)], int64_t(sl.size()));
      if (e + 1 < E) {
        EXPECT_EQ(off[size_t(e + 1)] - off[size_t(e)], (int64_t(sl.size()) + P - 1) / P * P);
      }
      for (size_t j = 0; j < sl.size(); ++j) {
        const int64_t row = off[size_t(e)] + int64_t(j);
        EXPECT_EQ(src[size_t(row)], sl[j] / k);
        EXPECT_EQ(sr[size_t(sl[j])], row);
      }
      for (int64_t row = off[size_t(e)] + int64_t(sl.size()); row < off[size_t(e + 1)]; ++row)
        EXPECT_EQ(src[size_t(row)], -1) << "padding row " << row;
    }
  }
}

TEST(OpsMoeRoute, RefusesBadIds) {
  const std::vector<int32_t> ids{0, 1, 2, 8};
  EXPECT_THROW(ops::moe_route(ids_tensor2(ids, 2, 2), 8, 1), std::out_of_range);
  EXPECT_THROW(ops::moe_route(ids_tensor2(ids, 2, 2), 8, 0), std::invalid_argument);
  const ops::MoeRoute empty = ops::moe_route(ids_tensor2({}, 0, 2), 4, 16);
  EXPECT_EQ(empty.rows, 64);  // every row is padding, all of it the last expert's tail
  EXPECT_EQ(vec<int64_t>(empty.offsets), (std::vector<int64_t>{0, 0, 0, 0, 64}));
}

// BF16 rows (a bf16 GEMM operand) are gathered unchanged: the gather of the cast is the cast of
// the gather, padding rows +0.
TEST(OpsMoeRoute, GatherMovesBf16RowsUnchanged) {
  const int64_t T = 9, k = 3, E = 4, d = 5, P = 8;
  const ops::MoeRoute r = ops::moe_route(ids_tensor2(random_ids(T, k, E, 4, -1), T, k), E, P);
  const Tensor x = cast(randd(T, d, 5), DType::kF32);
  const Tensor g = ops::moe_gather(cast(x, DType::kBF16), r);
  const Tensor want = cast(ops::moe_gather(x, r), DType::kBF16);
  ASSERT_EQ(g.dtype(), DType::kBF16);
  ASSERT_EQ(g.shape(), want.shape());
  EXPECT_EQ(std::memcmp(g.raw(), want.raw(), size_t(g.numel()) * 2), 0);
  EXPECT_THROW(ops::moe_gather(cast(x, DType::kF16), r), std::invalid_argument);
}

TEST(OpsMoeRoute, RowMovesAndTransposes) {
  const int64_t T = 21, k = 2, E = 5, d = 7, P = 16;
  const ops::MoeRoute r = ops::moe_route(ids_tensor2(random_ids(T, k, E, 3, -1), T, k), E, P);
  const Tensor x = randd(T, d, 1), y = randd(r.rows, d, 2);
  const Tensor g = ops::moe_gather(x, r);
  const std::vector<double> gv = vec<double>(g), xv = vec<double>(x), yv = vec<double>(y);
  const std::vector<int32_t> src = vec<int32_t>(r.src_rows), sr = vec<int32_t>(r.slot_row);
  for (int64_t row = 0; row < r.rows; ++row)
    for (int64_t c = 0; c < d; ++c)
      EXPECT_EQ(gv[size_t(row * d + c)],
                src[size_t(row)] < 0 ? 0.0 : xv[size_t(src[size_t(row)] * d + c)]);
  // combine: the slot rows summed in slot order from +0.
  const std::vector<double> cv = vec<double>(ops::moe_combine(y, r));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < d; ++c) {
      double acc = 0.0;
      for (int64_t s = 0; s < k; ++s) acc += yv[size_t(sr[size_t(t * k + s)] * d + c)];
      EXPECT_EQ(cv[size_t(t * d + c)], acc);
    }
  // <gather(x), y> == <x, combine(y)> and <scatter(x), y> == <x, combine(y)> (float64).
  double a = 0, b = 0;
  for (size_t i = 0; i < gv.size(); ++i) a += gv[i] * yv[i];
  for (size_t i = 0; i < xv.size(); ++i) b += xv[i] * cv[i];
  EXPECT_NEAR(a, b, 1e-12 * (1 + std::abs(a)));
  const std::vector<double> sv = vec<double>(ops::moe_scatter(x, r));
  for (int64_t row = 0; row < r.rows; ++row)
    for (int64_t c = 0; c < d; ++c)
      EXPECT_EQ(sv[size_t(row * d + c)], gv[size_t(row * d + c)])
          << "scatter == gather for top-k rows";
  // Slot values: scatter then gather is the identity on [T, k].
  const Tensor w = randd(T, k, 4);
  EXPECT_EQ(vec<double>(ops::moe_gather_slots(ops::moe_scatter_slots(w, r), r)), vec<double>(w));
  const std::vector<double> pw = vec<double>(ops::moe_scatter_slots(w, r));
  for (int64_t row = 0; row < r.rows; ++row)
    if (src[size_t(row)] < 0) {
      EXPECT_EQ(pw[size_t(row)], 0.0);
    }
}

TEST(OpsMoeRoute, SharedExpertGateOps) {
  const Tensor x = randd(4, 3, 9), a = randd(4, 1, 10);
  const std::vector<double> xv = vec<double>(x), av = vec<double>(a);
  const std::vector<double> s = vec<double>(ops::scale_rows(x, a.view({4})));
  const std::vector<double> dot = vec<double>(ops::row_dot(x, x));
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_EQ(s[size_t(t * 3 + c)], av[size_t(t)] * xv[size_t(t * 3 + c)]);
    // 32 lanes (row_exec.h): lanes 0, 1, 2 hold one square each; the tree adds lane 2 to lane 0
    // (off = 2), then lane 1 (off = 1).
    const double* r = xv.data() + t * 3;
    EXPECT_EQ(dot[size_t(t)], (r[0] * r[0] + r[2] * r[2]) + r[1] * r[1]);
  }
  Tensor g = a.clone();
  ops::sigmoid_inplace(g);
  const std::vector<double> gv = vec<double>(g);
  for (int64_t t = 0; t < 4; ++t)
    EXPECT_NEAR(gv[size_t(t)], 1.0 / (1.0 + std::exp(-av[size_t(t)])), 1e-15);
  const std::vector<double> db = vec<double>(ops::sigmoid_backward(a.view({4}), g.view({4})));
  for (int64_t t = 0; t < 4; ++t)
    EXPECT_EQ(db[size_t(t)], av[size_t(t)] * (gv[size_t(t)] * (1.0 - gv[size_t(t)])));
}
