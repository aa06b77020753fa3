// Tensor-level entries of the token embedding (ops/tensor_ops.h): checks, outputs on the inputs'
// device, dispatch to the kernels of ops/embedding.h (token log-probs: tensor_ops_softmax.cpp).
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/softmax.h"

namespace lockstep::ops {

using namespace detail;

Tensor embedding(const Tensor& table_in, const Tensor& ids_in) {
  const Tensor table = cpu_operand(table_in, "embedding", "table"),
               ids = index_operand(ids_in, "embedding", "ids");
  check(table.dim() == 2, fmt::format("embedding: table {} must be 2-D", table.describe()));
  Tensor out = Tensor::empty(table.dtype(), {ids.numel(), table.cols()});
  by_dtype(table, [&](auto t) {
    using T = decltype(t);
    embedding_fwd_cpu<T>(table.ptr<T>(), table.rows(), table.cols(), ids.ptr<int32_t>(),
                         ids.numel(), out.ptr<T>());
  });
  return out;
}

Tensor embedding_backward(const Tensor& dout_in, const Tensor& ids_in, int64_t vocab) {
  const Tensor dout = cpu_operand(dout_in, "embedding_backward", "dout"),
               ids = index_operand(ids_in, "embedding_backward", "ids");
  const int64_t d = dout.cols();
  Tensor dt = Tensor::empty(dout.dtype(), {vocab, d});
  by_dtype(dout, [&](auto t) {
    using T = decltype(t);
    embedding_bwd_cpu<T>(dout.ptr<T>(), ids.ptr<int32_t>(), ids.numel(), vocab, d, dt.ptr<T>());
  });
  return dt;
}

}  // namespace lockstep::ops
