// Tensor-level entries of the token embedding and the token log-probs (ops/tensor_ops.h): checks,
// outputs on the inputs' device, dispatch to the kernels of ops/embedding.h and ops/softmax.h.
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

TokenLogprobs token_logprobs(const Tensor& logits_in, const Tensor& targets_in) {
  const Tensor logits = cpu_operand(logits_in, "token_logprobs", "logits"),
               targets = index_operand(targets_in, "token_logprobs", "targets");
  check(logits.dim() == 2 && logits.rows() == targets.numel(),
        fmt::format("token_logprobs: logits {} and targets {} disagree on tokens",
                    logits.describe(), targets.describe()));
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  TokenLogprobs r{Tensor::empty(logits.dtype(), {tokens}), Tensor::empty(logits.dtype(), {tokens}),
                  Tensor::empty(logits.dtype(), {tokens})};
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    token_logprobs_fwd_cpu<T>(logits.ptr<T>(), targets.ptr<int32_t>(), tokens, vocab,
                              r.logp.ptr<T>(), r.entropy.ptr<T>(), r.lse.ptr<T>());
  });
  return r;
}

Tensor token_logprobs_backward(const Tensor& logits_in, const Tensor& targets_in,
                               const TokenLogprobs& fwd, const Tensor& dlogp_in,
                               const Tensor& dentropy_in) {
  const char* op = "token_logprobs_backward";
  const Tensor logits = cpu_operand(logits_in, op, "logits"),
               targets = index_operand(targets_in, op, "targets");
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  const Tensor dlogp = dlogp_in.defined() ? cpu_operand(dlogp_in, op, "dlogp") : Tensor();
  const Tensor dent = dentropy_in.defined() ? cpu_operand(dentropy_in, op, "dentropy") : Tensor();
  check(
      (!dlogp.defined() || dlogp.numel() == tokens) && (!dent.defined() || dent.numel() == tokens),
      fmt::format("{}: dlogp / dentropy must have {} values", op, tokens));
  Tensor dl = Tensor::empty(logits.dtype(), {tokens, vocab});
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    token_logprobs_bwd_cpu<T>(logits.ptr<T>(), targets.ptr<int32_t>(), fwd.lse.ptr<T>(),
                              fwd.entropy.ptr<T>(), dlogp.defined() ? dlogp.ptr<T>() : nullptr,
                              dent.defined() ? dent.ptr<T>() : nullptr, tokens, vocab, dl.ptr<T>());
  });
  return dl;
}

}  // namespace lockstep::ops
