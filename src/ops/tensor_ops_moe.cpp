// MoE routing ops (ops/moe.h): argument checks, the CPU reference of the grouped layout and row
// moves, and the dispatch of CUDA tensors to moe_cuda.cu.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "../tensor/cpu_parallel.h"
#include "entry_util.h"
#include "lockstep/numerics/transcendental.h"
#include "lockstep/ops/moe.h"
#include "lockstep/ops/op_math.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "moe_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

namespace {

using lockstep::detail::kParallelMinWork;

void check_route(const MoeRoute& r, const char* op) {
  check(r.offsets.defined() && r.src_rows.defined() && r.slot_row.defined(),
        [&] { return fmt::format("{}: the route is empty (moe_route first)", op); });
}

// Floating operand of a row move: F32 / F64 (CPU), F32 (CUDA), 2-D, on the route's device.
Tensor rows_operand(const Tensor& x, const MoeRoute& r, const char* op, const char* name) {
  const Tensor t = operand(x, op, name);
  same_device(op, {{&t, name}, {&r.slot_row, "route"}});
  return t;
}

}  // namespace

int64_t moe_grouped_rows(int64_t tokens, int64_t top_k, int64_t experts, int64_t row_multiple) {
  const int64_t slots = tokens * top_k;
  if (row_multiple <= 1) return slots;
  const int64_t bound = slots + experts * (row_multiple - 1);
  return (bound + row_multiple - 1) / row_multiple * row_multiple;
}

MoeRoute moe_route(const Tensor& ids_in, int64_t experts, int64_t row_multiple) {
  const Tensor ids = index_operand(ids_in, "moe_route", "expert_ids");
  check(ids.dim() == 2 && experts >= 1 && row_multiple >= 1 && ids.cols() <= experts, [&] {
    return fmt::format(
        "moe_route: expert_ids {} must be [T, k] with 1 <= k <= E = {}, row multiple "
        "{} >= 1",
        ids.describe(), experts, row_multiple);
  });
  MoeRoute r;
  r.tokens = ids.rows();
  r.top_k = ids.cols();
  r.experts = experts;
  r.row_multiple = row_multiple;
  r.rows = moe_grouped_rows(r.tokens, r.top_k, experts, row_multiple);
  const int64_t n = r.tokens * r.top_k;
  const Device dev = ids.device();
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA("moe_route", cuda::moe_route(ids, r));
    return r;
  }
  const int32_t* e = ids.ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (e[i] < 0 || e[i] >= experts)
      throw std::out_of_range(
          fmt::format("moe_route: expert_ids[{}] (token {}, slot {}) = {} outside [0, {})", i,
                      i / r.top_k, i % r.top_k, e[i], experts));
  std::vector<int64_t> count(size_t(experts), 0);
  for (int64_t i = 0; i < n; ++i) ++count[size_t(e[i])];
  r.offsets = Tensor(DType::kI64, {experts + 1});
  int64_t* off = r.offsets.ptr<int64_t>();
  off[0] = 0;
  for (int64_t x = 0; x < experts; ++x)
    off[x + 1] = off[x] + (count[size_t(x)] + row_multiple - 1) / row_multiple * row_multiple;
  off[experts] = r.rows;  // the tail belongs to the last expert
  r.src_rows = Tensor::empty(DType::kI32, {r.rows});
  r.slot_row = Tensor::empty(DType::kI32, {n});
  int32_t* src = r.src_rows.ptr<int32_t>();
  int32_t* sr = r.slot_row.ptr<int32_t>();
  std::fill(src, src + r.rows, -1);
  std::vector<int64_t> cursor(off, off + experts);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = cursor[size_t(e[i])]++;
    src[row] = int32_t(i / r.top_k);
    sr[i] = int32_t(row);
  }
  return r;
}

Tensor moe_gather(const Tensor& x_in, const MoeRoute& r) {
  check_route(r, "moe_gather");
  // A gather moves rows unchanged, so BF16 rows (a bf16 GEMM operand) are gathered as they are.
  const bool bf16 = x_in.defined() && x_in.dtype() == DType::kBF16;
  const Tensor x = bf16 ? x_in.contiguous() : rows_operand(x_in, r, "moe_gather", "x");
  if (bf16) same_device("moe_gather", {{&x, "x"}, {&r.slot_row, "route"}});
  check(x.dim() == 2 && x.rows() == r.tokens, [&] {
    return fmt::format("moe_gather: x {} is not [{} tokens, d]", x.describe(), r.tokens);
  });
  const int64_t d = x.cols();
  Tensor out = Tensor::empty(x.dtype(), {r.rows, d}, x.device());
  if (x.is_cuda()) {
    LOCKSTEP_OPS_CUDA("moe_gather", cuda::moe_gather(x, r, out));
    return out;
  }
  const auto gather = [&](auto z) {
    using T = decltype(z);
    const T* xp = static_cast<const T*>(x.raw());
    const int32_t* src = r.src_rows.ptr<int32_t>();
    T* o = static_cast<T*>(out.raw());
#pragma omp parallel for schedule(static) if (r.rows * d >= kParallelMinWork)
    for (int64_t row = 0; row < r.rows; ++row) {
      if (src[row] >= 0)
        std::copy_n(xp + int64_t(src[row]) * d, d, o + row * d);
      else
        std::fill_n(o + row * d, d, T(0));
    }
  };
  if (bf16)
    gather(uint16_t{});  // bf16 +0 is the zero bit pattern
  else
    by_dtype(x, gather);
  return out;
}

Tensor moe_combine(const Tensor& rows_in, const MoeRoute& r) {
  check_route(r, "moe_combine");
  const Tensor rows = rows_operand(rows_in, r, "moe_combine", "rows");
  check(rows.dim() == 2 && rows.rows() == r.rows, [&] {
    return fmt::format("moe_combine: rows {} is not [{}, d]", rows.describe(), r.rows);
  });
  const int64_t d = rows.cols(), k = r.top_k;
  Tensor out = Tensor::empty(rows.dtype(), {r.tokens, d}, rows.device());
  if (rows.is_cuda()) {
    LOCKSTEP_OPS_CUDA("moe_combine", cuda::moe_combine(rows, r, out));
    return out;
  }
  by_dtype(rows, [&](auto z) {
    using T = decltype(z);
    const T* rp = rows.ptr<T>();
    const int32_t* sr = r.slot_row.ptr<int32_t>();
    T* o = out.ptr<T>();
#pragma omp parallel for schedule(static) if (r.tokens * k * d >= kParallelMinWork)
    for (int64_t t = 0; t < r.tokens; ++t) {
      T* ot = o + t * d;
      std::fill_n(ot, d, T(0));
      for (int64_t s = 0; s < k; ++s) {
        const T* src = rp + int64_t(sr[t * k + s]) * d;
        for (int64_t c = 0; c < d; ++c) ot[c] = ot[c] + src[c];
      }
    }
  });
  return out;
}

Tensor moe_scatter(const Tensor& x_in, const MoeRoute& r) {
  check_route(r, "moe_scatter");
  const Tensor x = rows_operand(x_in, r, "moe_scatter", "x");
  check(x.dim() == 2 && x.rows() == r.tokens, [&] {
    return fmt::format("moe_scatter: x {} is not [{} tokens, d]", x.describe(), r.tokens);
  });
  const int64_t d = x.cols(), k = r.top_k;
  // Padding rows stay zero; without padding (rows = slots) every row is written.
  Tensor out = r.rows == r.tokens * r.top_k ? Tensor::empty(x.dtype(), {r.rows, d}, x.device())
                                            : Tensor(x.dtype(), {r.rows, d}, x.device());
  if (x.is_cuda()) {
    LOCKSTEP_OPS_CUDA("moe_scatter", cuda::moe_scatter(x, r, out));
    return out;
  }
  by_dtype(x, [&](auto z) {
    using T = decltype(z);
    const T* xp = x.ptr<T>();
    const int32_t* sr = r.slot_row.ptr<int32_t>();
    T* o = out.ptr<T>();
#pragma omp parallel for schedule(static) if (r.tokens * k * d >= kParallelMinWork)
    for (int64_t t = 0; t < r.tokens; ++t)
      for (int64_t s = 0; s < k; ++s) std::copy_n(xp + t * d, d, o + int64_t(sr[t * k + s]) * d);
  });
  return out;
}

Tensor moe_scatter_slots(const Tensor& w_in, const MoeRoute& r) {
  check_route(r, "moe_scatter_slots");
  const Tensor w = rows_operand(w_in, r, "moe_scatter_slots", "w");
  check(w.numel() == r.tokens * r.top_k, [&] {
    return fmt::format("moe_scatter_slots: w {} is not [{}, {}]", w.describe(), r.tokens, r.top_k);
  });
  Tensor out = r.rows == w.numel() ? Tensor::empty(w.dtype(), {r.rows}, w.device())
                                   : Tensor(w.dtype(), {r.rows}, w.device());
  if (w.is_cuda()) {
    LOCKSTEP_OPS_CUDA("moe_scatter_slots", cuda::moe_scatter_slots(w, r, out));
    return out;
  }
  by_dtype(w, [&](auto z) {
    using T = decltype(z);
    const int32_t* sr = r.slot_row.ptr<int32_t>();
    for (int64_t i = 0; i < w.numel(); ++i) out.ptr<T>()[sr[i]] = w.ptr<T>()[i];
  });
  return out;
}

Tensor moe_gather_slots(const Tensor& v_in, const MoeRoute& r) {
  check_route(r, "moe_gather_slots");
  const Tensor v = rows_operand(v_in, r, "moe_gather_slots", "v");
  check(v.numel() == r.rows,
        [&] { return fmt::format("moe_gather_slots: v {} is not [{}]", v.describe(), r.rows); });
  Tensor out = Tensor::empty(v.dtype(), {r.tokens, r.top_k}, v.device());
  if (v.is_cuda()) {
    LOCKSTEP_OPS_CUDA("moe_gather_slots", cuda::moe_gather_slots(v, r, out));
    return out;
  }
  by_dtype(v, [&](auto z) {
    using T = decltype(z);
    const int32_t* sr = r.slot_row.ptr<int32_t>();
    for (int64_t i = 0; i < out.numel(); ++i) out.ptr<T>()[i] = v.ptr<T>()[sr[i]];
  });
  return out;
}

Tensor sigmoid_backward(const Tensor& dy_in, const Tensor& y_in) {
  const Tensor dy = operand(dy_in, "sigmoid_backward", "dy"),
               y = operand(y_in, "sigmoid_backward", "y");
  same_dtype(dy, y, "sigmoid_backward");
  same_device("sigmoid_backward", {{&dy, "dy"}, {&y, "y"}});
  check(dy.numel() == y.numel(), [&] {
    return fmt::format("sigmoid_backward: dy {} and y {} differ in size", dy.describe(),
                       y.describe());
  });
  Tensor out = Tensor::empty(dy.dtype(), {dy.numel()}, dy.device());
  if (dy.is_cuda()) {
    LOCKSTEP_OPS_CUDA("sigmoid_backward", cuda::sigmoid_backward(dy, y, out));
    return out;
  }
  by_dtype(dy, [&](auto z) {
    using T = decltype(z);
    const T* d = dy.ptr<T>();
    const T* g = y.ptr<T>();
    T* o = out.ptr<T>();
    for (int64_t i = 0; i < dy.numel(); ++i) o[i] = d[i] * (g[i] * (T(1) - g[i]));
  });
  return out;
}

}  // namespace lockstep::ops
