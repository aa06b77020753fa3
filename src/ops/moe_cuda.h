// CUDA kernels of the MoE routing ops (ops/moe.h), private to src/ops: launched on the current
// stream, no host synchronisation (the grouped layout is built from device data on the device).
#pragma once

#include "lockstep/ops/moe.h"

namespace lockstep::ops::cuda {

// Fills r.offsets, r.src_rows, r.slot_row (r's sizes already set) from ids [T, k] on the device.
void moe_route(const Tensor& ids, MoeRoute& r);
void moe_gather(const Tensor& x, const MoeRoute& r, Tensor& out);
void moe_combine(const Tensor& rows, const MoeRoute& r, Tensor& out);
void moe_scatter(const Tensor& x, const MoeRoute& r, Tensor& out);
void moe_scatter_slots(const Tensor& w, const MoeRoute& r, Tensor& out);
void moe_gather_slots(const Tensor& v, const MoeRoute& r, Tensor& out);
void sigmoid_inplace(Tensor& x);
void scale_rows(const Tensor& x, const Tensor& a, Tensor& out);
void row_dot(const Tensor& a, const Tensor& b, Tensor& out);
void sigmoid_backward(const Tensor& dy, const Tensor& y, Tensor& out);

}  // namespace lockstep::ops::cuda
