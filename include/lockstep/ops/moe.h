// Tensor-level MoE routing ops: the expert-grouped row layout of a batch (built where the router's
// choices live, with no host round trip), and the row moves between tokens and grouped rows that
// the MoE block's forward and backward need. One implementation of each, dispatched by device.
//
// Grouped layout of T tokens with top-k experts among E, padding multiple P (>= 1):
//   expert e owns rows [offsets[e], offsets[e+1]): its slots (t, s) in ascending (t, s) order,
//   then zero padding rows up to a multiple of P; the last expert also owns the tail rows up to
//   `rows`, a bound known on the host without reading the device:
//     rows = T * k when P == 1, else round_up(T * k + E * (P - 1), P).
//   src_rows[r] = the token of row r (-1 for a padding row); slot_row[t * k + s] = the row of slot
//   (t, s). Every offset is a multiple of P.
// Sums: combine adds a token's slot rows in slot order from +0, one rounding per add, so no value
// depends on the batch or the device.
#pragma once

#include <cstdint>

#include "lockstep/ops/tensor_ops.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::ops {

struct MoeRoute {
  Tensor offsets;   // I64 [E + 1], on the device of expert_ids
  Tensor src_rows;  // I32 [rows]
  Tensor slot_row;  // I32 [T * k]
  int64_t tokens = 0, experts = 0, top_k = 0, row_multiple = 1;
  int64_t rows = 0;  // rows of the grouped buffer (host)
};

// The rows bound above.
int64_t moe_grouped_rows(int64_t tokens, int64_t top_k, int64_t experts, int64_t row_multiple);

// expert_ids: I32 [T, k] with values in [0, E) (a host tensor is checked; on the device, where
// ids are never read on the host, an id outside [0, E) is clamped: a negative one to expert 0, E
// and above to E - 1). row_multiple >= 1.
MoeRoute moe_route(const Tensor& expert_ids, int64_t experts, int64_t row_multiple);

// x [T, d] -> [rows, d]: row r = x[src_rows[r]], zero for a padding row. x is F32, F64 or BF16
// (rows moved unchanged).
Tensor moe_gather(const Tensor& x, const MoeRoute& route);
// rows [R, d] -> [T, d]: out[t] = sum over s = 0..k-1 of rows[slot_row[t * k + s]] (from +0).
// The transpose of moe_gather (its backward) and the MoE block's output combine.
Tensor moe_combine(const Tensor& rows, const MoeRoute& route);
// x [T, d] -> [rows, d]: row slot_row[t * k + s] = x[t], padding rows zero (combine's backward).
Tensor moe_scatter(const Tensor& x, const MoeRoute& route);
// w [T, k] -> [rows]: w[t, s] at row slot_row[t * k + s], padding rows zero (a router weight per
// grouped row, for the weighted SwiGLU).
Tensor moe_scatter_slots(const Tensor& w, const MoeRoute& route);
// v [rows] -> [T, k]: v[slot_row[t * k + s]] (the weighted SwiGLU's weight gradient per slot).
Tensor moe_gather_slots(const Tensor& v, const MoeRoute& route);

// The shared expert's gate forward (sigmoid_inplace, scale_rows) and the dot product of its
// backward (row_dot, 32 lanes): ops/tensor_ops.h.

// The shared expert's sigmoid gate backward: dy [n], y = sigmoid output [n] (same dtype and
// device) -> dy * (y * (1 - y)) elementwise, one rounding per step.
Tensor sigmoid_backward(const Tensor& dy, const Tensor& y);

}  // namespace lockstep::ops
