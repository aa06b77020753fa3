// Tensor-level entries of the token embedding (ops/tensor_ops.h): checks, outputs on the inputs'
// device, dispatch to the CPU kernels of ops/embedding.h or the CUDA kernels of embedding_cuda.h.
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/embedding.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "embedding_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

Tensor embedding(const Tensor& table_in, const Tensor& ids_in) {
  const char* op = "embedding";
  const Device dev = same_device(op, {{&table_in, "table"}, {&ids_in, "ids"}});
  const Tensor table = operand(table_in, op, "table"), ids = index_operand(ids_in, op, "ids");
  check(table.dim() == 2 && table.rows() >= 1 && table.cols() >= 1, [&] {
    return fmt::format("embedding: table {} must be [V, d] with V, d >= 1", table.describe());
  });
  Tensor out = Tensor::empty(table.dtype(), {ids.numel(), table.cols()}, dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(
        op, embedding_fwd_cuda(table.ptr<float>(), table.rows(), table.cols(), ids.ptr<int32_t>(),
                               ids.numel(), out.ptr<float>(), dev));
    return out;
  }
  by_dtype(table, [&](auto t) {
    using T = decltype(t);
    embedding_fwd_cpu<T>(table.ptr<T>(), table.rows(), table.cols(), ids.ptr<int32_t>(),
                         ids.numel(), out.ptr<T>());
  });
  return out;
}

Tensor embedding_backward(const Tensor& dout_in, const Tensor& ids_in, int64_t vocab) {
  const char* op = "embedding_backward";
  const Device dev = same_device(op, {{&dout_in, "dout"}, {&ids_in, "ids"}});
  const Tensor dout = operand(dout_in, op, "dout"), ids = index_operand(ids_in, op, "ids");
  check(dout.dim() == 2 && dout.rows() == ids.numel() && dout.cols() >= 1 && vocab >= 1, [&] {
    return fmt::format("{}: dout {} must be [{} tokens, d >= 1] and vocab {} >= 1", op,
                       dout.describe(), ids.numel(), vocab);
  });
  const int64_t d = dout.cols();
  Tensor dt = Tensor::empty(dout.dtype(), {vocab, d}, dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, embedding_bwd_cuda(dout.ptr<float>(), ids.ptr<int32_t>(), ids.numel(),
                                             vocab, d, dt.ptr<float>(), dev));
    return dt;
  }
  by_dtype(dout, [&](auto t) {
    using T = decltype(t);
    embedding_bwd_cpu<T>(dout.ptr<T>(), ids.ptr<int32_t>(), ids.numel(), vocab, d, dt.ptr<T>());
  });
  return dt;
}

}  // namespace lockstep::ops
