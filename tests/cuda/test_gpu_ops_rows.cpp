// lockstep_test_gpu --op moe,layout: the row-moving ops on CUDA against the CPU, bit for bit.
// layout (ops/layout.h): pad2d, crop2d, pad_groups, crop_groups, split_cols and concat_cols on F32,
// BF16 and U8 tensors of awkward shapes (one element, odd widths, no rows), including the calls
// that change nothing. moe: the MoE routing ops (ops/moe.h):
// the grouped layout (offsets, src_rows, slot_row) of random top-k choices (k distinct experts per
// token, an expert no token chose, every token's first slot on expert 0, no tokens at all; row
// multiples 1, 16 and 64; 1 to 1000 tokens; up to 1025 experts; either side of the one-block
// layout's limits) and the row moves over it (gather,
// combine, scatter, scatter_slots, gather_slots) on random and edge values. Device ids outside
// [0, E), which the device does not check, are clamped (negative to 0, E and above to E - 1): the
// layout of the clamped ids on the CPU.
#include <algorithm>
#include <random>

#include "lockstep/ops/layout.h"
#include "lockstep/ops/moe.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

namespace {

// [T, k] expert ids, k distinct per token, drawn from seed; expert E / 2 is never chosen when
// k + 1 < E; with first_zero every token's first slot is expert 0.
std::vector<int32_t> route_ids(int64_t T, int64_t k, int64_t E, uint64_t seed, bool first_zero) {
  std::mt19937_64 g(seed);
  const int32_t skip = k + 1 < E ? int32_t(E / 2) : -1;
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> row;
    if (first_zero) row.push_back(0);
    while (int64_t(row.size()) < k) {
      const int32_t e = int32_t(g() % uint64_t(E));
      if (e != skip && std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return ids;
}

Tensor ids_tensor(const std::vector<int32_t>& v, int64_t T, int64_t k) {
  return Tensor::from_vector<int32_t>(v, {T, k}, DType::kI32);
}

// The route of `ids` and every row move over it, on the ids' device: offsets, src_rows, slot_row,
// gather(x), combine(rows), scatter(x), scatter_slots(w), gather_slots(v), gather(x as bf16).
std::vector<Tensor> route_and_moves(const Tensor& ids, int64_t E, int64_t P, const Tensor& x,
                                    const Tensor& rows, const Tensor& w, const Tensor& v) {
  const ops::MoeRoute r = ops::moe_route(ids, E, P);
  return {r.offsets,
          r.src_rows,
          r.slot_row,
          ops::moe_gather(x, r),
          ops::moe_combine(rows, r),
          ops::moe_scatter(x, r),
          ops::moe_scatter_slots(w, r),
          ops::moe_gather_slots(v, r),
          ops::moe_gather(cast(x, DType::kBF16), r)};
}

void route_cases() {
  struct Shape {
    int64_t T, k, E, P;
    bool first_zero;
  };
  const std::vector<Shape> shapes{{1, 1, 1, 1, false},
                                  {1, 8, 128, 1, false},
                                  {7, 2, 8, 1, false},
                                  {33, 4, 32, 16, false},
                                  {256, 8, 128, 64, false},
                                  {1000, 8, 64, 1, false},
                                  {40, 4, 16, 16, true},
                                  {0, 4, 8, 16, false},
                                  // Either side of the one-block layout's limits (4096 slots,
                                  // 1024 experts) and the sorted layout past them.
                                  {512, 8, 128, 1, false},
                                  {513, 8, 128, 16, false},
                                  {5, 8, 1024, 16, false},
                                  {3, 4, 1025, 1, false}};
  for (const Shape& sh : shapes)
    for (int64_t d : {int64_t(1), int64_t(64), int64_t(257)})
      for (Dist dist : {Dist::kNormal, Dist::kEdge}) {
        if (g_opt.reduced && (d != 64 || sh.T > 256 || sh.E > 128)) continue;
        const std::string name = "moe route T" + std::to_string(sh.T) + " k" +
                                 std::to_string(sh.k) + " E" + std::to_string(sh.E) + " P" +
                                 std::to_string(sh.P) + (sh.first_zero ? " first0" : "") + " d" +
                                 std::to_string(d) + " " + dist_name(dist);
        const uint64_t seed = case_seed(name);
        const Tensor ids = ids_tensor(route_ids(sh.T, sh.k, sh.E, seed, sh.first_zero), sh.T, sh.k);
        const int64_t R = ops::moe_grouped_rows(sh.T, sh.k, sh.E, sh.P);
        const Tensor x = host_tensor(make_values(sh.T, d, dist, false, seed + 1), sh.T, d, false);
        const Tensor rows = host_tensor(make_values(R, d, dist, false, seed + 2), R, d, false);
        const Tensor w =
            host_tensor(make_values(sh.T, sh.k, dist, false, seed + 3), sh.T, sh.k, false);
        const Tensor v =
            host_tensor(make_values(1, R, dist, false, seed + 4), 1, R, false).view({R});
        check_outs(
            name, [&] { return route_and_moves(ids, sh.E, sh.P, x, rows, w, v); },
            [&] {
              return route_and_moves(to_gpu(ids), sh.E, sh.P, to_gpu(x), to_gpu(rows), to_gpu(w),
                                     to_gpu(v));
            });
      }
  // Ids outside [0, E) on the device: the layout of the clamped ids (T = 6: the one-block layout;
  // T = 600: the sorted one).
  const std::pair<int64_t, int64_t> bad_cases[] = {{6, 1}, {6, 16}, {600, 16}};
  for (const auto& c : bad_cases) {
    const int64_t T = c.first, P = c.second;
    const std::string name =
        "moe route bad device ids T" + std::to_string(T) + " P" + std::to_string(P);
    const int64_t k = 8, E = 8, d = 32;
    if (g_opt.reduced && T > 6) continue;
    const std::vector<int32_t> pattern{3, -1, 8, 2, 5, 100, -7, 4, 0, 7, 1, 8};
    std::vector<int32_t> bad(size_t(T * k));
    for (size_t i = 0; i < bad.size(); ++i) bad[i] = pattern[i % pattern.size()];
    std::vector<int32_t> clamped(bad);
    for (int32_t& e : clamped) e = e < 0 ? 0 : (e >= E ? int32_t(E - 1) : e);
    const int64_t R = ops::moe_grouped_rows(T, k, E, P);
    const uint64_t seed = case_seed(name);
    const Tensor x = host_tensor(make_values(T, d, Dist::kNormal, false, seed), T, d, false);
    const Tensor rows = host_tensor(make_values(R, d, Dist::kNormal, false, seed + 1), R, d, false);
    const Tensor w = host_tensor(make_values(T, k, Dist::kNormal, false, seed + 2), T, k, false);
    const Tensor v =
        host_tensor(make_values(1, R, Dist::kNormal, false, seed + 3), 1, R, false).view({R});
    check_outs(
        name, [&] { return route_and_moves(ids_tensor(clamped, T, k), E, P, x, rows, w, v); },
        [&] {
          return route_and_moves(to_gpu(ids_tensor(bad, T, k)), E, P, to_gpu(x), to_gpu(rows),
                                 to_gpu(w), to_gpu(v));
        });
  }
}

// A [rows, cols] tensor of dtype dt with values of every bit pattern class the dtype has.
Tensor layout_input(DType dt, int64_t rows, int64_t cols, uint64_t seed) {
  if (dt == DType::kU8) {
    std::mt19937_64 g(seed);
    std::vector<uint8_t> v(size_t(rows * cols));
    for (uint8_t& b : v) b = uint8_t(g());
    return Tensor::from_vector<uint8_t>(v, {rows, cols}, DType::kU8);
  }
  return host_tensor(make_values(rows, cols, Dist::kEdge, dt == DType::kBF16, seed), rows, cols,
                     dt == DType::kBF16);
}

std::vector<Tensor> layout_moves(const Tensor& x, const Tensor& w, int64_t groups) {
  const int64_t R = x.rows(), C = x.cols(), a = C / 3;
  const Tensor padded = ops::pad2d(x, R + 3, C + 5);
  const std::vector<Tensor> parts = ops::split_cols(x, {a, C - a});
  const int64_t n = w.rows() / groups, k = w.cols();
  const Tensor wp = ops::pad_groups(w, groups, n + 2, k + 7);
  return {padded,
          ops::pad2d(x, R, C),
          ops::crop2d(padded, R, C),
          ops::crop2d(x, R / 2, C - a),
          parts[0],
          parts[1],
          ops::concat_cols({parts[1], x, parts[0]}),
          wp,
          ops::crop_groups(wp, groups, n, k),
          ops::crop_groups(wp, groups, n / 2 + 1, k)};
}

void layout_cases() {
  struct Shape {
    int64_t rows, cols;
  };
  for (DType dt : {DType::kF32, DType::kBF16, DType::kU8})
    for (Shape sh : {Shape{1, 1}, Shape{7, 33}, Shape{128, 256}, Shape{0, 5}}) {
      const int64_t groups = 3;
      const std::string name = "layout " + std::string(dtype_name(dt)) + " " +
                               std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
      const uint64_t seed = case_seed(name);
      const Tensor x = layout_input(dt, sh.rows, sh.cols, seed);
      const Tensor w = layout_input(dt, groups * (sh.rows + 1), sh.cols, seed + 1);
      check_outs(
          name, [&] { return layout_moves(x, w, groups); },
          [&] { return layout_moves(to_gpu(x), to_gpu(w), groups); });
    }
}

}  // namespace

void test_row_moves() {
  if (want("moe")) route_cases();
  if (want("layout")) layout_cases();
}

}  // namespace lockstep::gpu_test
