// Tensor-level entries of the softmax family (ops/tensor_ops.h): softmax, log-softmax, token
// log-probs, the MoE router and sampling. Checks, outputs on the inputs' device, dispatch to the
// CPU kernels of ops/softmax.h, ops/router.h, ops/sampling.h or the CUDA kernels of
// softmax_cuda.h.
#include <fmt/format.h>

#include <limits>
#include <vector>

#include "entry_util.h"
#include "lockstep/ops/router.h"
#include "lockstep/ops/sampling.h"
#include "lockstep/ops/softmax.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "softmax_cuda.h"
#endif

namespace lockstep::ops {

using namespace detail;

namespace {

// Rows of the last dimension (at least 1 element each).
int64_t last_dim(const Tensor& x, const char* op) {
  check(x.dim() >= 1 && x.size(-1) >= 1, [&] {
    return fmt::format("{}: x {} needs a last dimension of at least 1 element", op, x.describe());
  });
  return x.size(-1);
}

Tensor softmax_fwd(const Tensor& x_in, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const Tensor x = operand(x_in, op, "x");
  const int64_t n = last_dim(x, op), rows = rows_of(x, n);
  Tensor y = Tensor::empty(x.dtype(), x.shape(), x.device());
  if (x.is_cuda()) {
    LOCKSTEP_OPS_CUDA(
        op, cuda::softmax_rows(x.ptr<float>(), rows, n, log, y.ptr<float>(), x.device(), Stream{}));
    return y;
  }
  by_dtype(x, [&](auto t) {
    using T = decltype(t);
    if (log)
      log_softmax_fwd_cpu<T>(x.ptr<T>(), rows, n, y.ptr<T>());
    else
      softmax_fwd_cpu<T>(x.ptr<T>(), rows, n, y.ptr<T>());
  });
  return y;
}

Tensor softmax_bwd(const Tensor& y_in, const Tensor& dy_in, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  const Tensor y = operand(y_in, op, "y"), dy = operand(dy_in, op, "dy");
  same_dtype(y, dy, op);
  same_device(op, {{&y, "y"}, {&dy, "dy"}});
  check(y.shape() == dy.shape(), [&] {
    return fmt::format("{}: y {} and dy {} differ in shape", op, y.describe(), dy.describe());
  });
  const int64_t n = last_dim(y, op), rows = rows_of(y, n);
  Tensor dx = Tensor::empty(y.dtype(), y.shape(), y.device());
  if (y.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, cuda::softmax_rows_bwd(y.ptr<float>(), dy.ptr<float>(), rows, n, log,
                                                 dx.ptr<float>(), y.device(), Stream{}));
    return dx;
  }
  by_dtype(y, [&](auto t) {
    using T = decltype(t);
    if (log)
      log_softmax_bwd_cpu<T>(y.ptr<T>(), dy.ptr<T>(), rows, n, dx.ptr<T>());
    else
      softmax_bwd_cpu<T>(y.ptr<T>(), dy.ptr<T>(), rows, n, dx.ptr<T>());
  });
  return dx;
}

// An optional per-token operand ([tokens], the dtype of `like`), or an undefined tensor.
Tensor optional_rows(const Tensor& t, const Tensor& like, int64_t tokens, const char* op,
                     const char* name) {
  if (!t.defined()) return t;
  const Tensor r = operand(t, op, name);
  same_dtype(r, like, op);
  check(r.numel() == tokens, [&] {
    return fmt::format("{}: {} {} must have {} values", op, name, r.describe(), tokens);
  });
  return r;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_fwd(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_fwd(x, true); }
Tensor softmax_backward(const Tensor& y, const Tensor& dy) { return softmax_bwd(y, dy, false); }
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) { return softmax_bwd(y, dy, true); }

TokenLogprobs token_logprobs(const Tensor& logits_in, const Tensor& targets_in) {
  const char* op = "token_logprobs";
  const Tensor logits = operand(logits_in, op, "logits"),
               targets = index_operand(targets_in, op, "targets");
  same_device(op, {{&logits, "logits"}, {&targets, "targets"}});
  check(logits.dim() == 2 && logits.rows() == targets.numel(), [&] {
    return fmt::format("{}: logits {} and targets {} disagree on tokens", op, logits.describe(),
                       targets.describe());
  });
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  const Device dev = logits.device();
  TokenLogprobs r{Tensor::empty(logits.dtype(), {tokens}, dev),
                  Tensor::empty(logits.dtype(), {tokens}, dev),
                  Tensor::empty(logits.dtype(), {tokens}, dev)};
  if (logits.is_cuda()) {
    check(vocab >= 1,
          [&] { return fmt::format("{}: logits {} have no columns", op, logits.describe()); });
    LOCKSTEP_OPS_CUDA(
        op, cuda::token_logprobs_rows(logits.ptr<float>(), targets.ptr<int32_t>(), tokens, vocab,
                                      r.logp.ptr<float>(), r.entropy.ptr<float>(),
                                      r.lse.ptr<float>(), dev, Stream{}));
    return r;
  }
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
  const Tensor logits = operand(logits_in, op, "logits"),
               targets = index_operand(targets_in, op, "targets");
  check(logits.dim() == 2 && logits.rows() == targets.numel() && logits.cols() >= 1, [&] {
    return fmt::format("{}: logits {} and targets {} disagree on tokens", op, logits.describe(),
                       targets.describe());
  });
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  const Tensor lse = optional_rows(fwd.lse, logits, tokens, op, "lse"),
               ent = optional_rows(fwd.entropy, logits, tokens, op, "entropy"),
               dlogp = optional_rows(dlogp_in, logits, tokens, op, "dlogp"),
               dent = optional_rows(dentropy_in, logits, tokens, op, "dentropy");
  check(lse.defined() && ent.defined(),
        [&] { return fmt::format("{}: the forward's lse and entropy are needed", op); });
  const Device dev = same_device(op, {{&logits, "logits"},
                                      {&targets, "targets"},
                                      {&lse, "lse"},
                                      {&ent, "entropy"},
                                      {&dlogp, "dlogp"},
                                      {&dent, "dentropy"}});
  Tensor dl = Tensor::empty(logits.dtype(), {tokens, vocab}, dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, cuda::token_logprobs_rows_bwd(
                              logits.ptr<float>(), targets.ptr<int32_t>(), lse.ptr<float>(),
                              ent.ptr<float>(), dlogp.defined() ? dlogp.ptr<float>() : nullptr,
                              dent.defined() ? dent.ptr<float>() : nullptr, tokens, vocab,
                              dl.ptr<float>(), dev, Stream{}));
    return dl;
  }
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    token_logprobs_bwd_cpu<T>(logits.ptr<T>(), targets.ptr<int32_t>(), lse.ptr<T>(), ent.ptr<T>(),
                              dlogp.defined() ? dlogp.ptr<T>() : nullptr,
                              dent.defined() ? dent.ptr<T>() : nullptr, tokens, vocab, dl.ptr<T>());
  });
  return dl;
}

RouterOut router_topk(const Tensor& logits_in, int64_t k, bool renormalize) {
  const char* op = "router_topk";
  const Tensor logits = operand(logits_in, op, "logits");
  check(logits.dim() == 2,
        [&] { return fmt::format("{}: logits {} must be 2-D", op, logits.describe()); });
  const int64_t tokens = logits.rows(), experts = logits.cols();
  check(experts >= 1 && experts <= (1 << 24) && k >= 1 && k <= experts, [&] {
    return fmt::format(
        "{}: logits {} with top-k {}; need 1 <= experts <= 2^24 and 1 <= k <= experts", op,
        logits.describe(), k);
  });
  const Device dev = logits.device();
  RouterOut r{Tensor::empty(logits.dtype(), {tokens, experts}, dev),
              Tensor::empty(DType::kI32, {tokens, k}, dev),
              Tensor::empty(logits.dtype(), {tokens, k}, dev)};
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op,
                      cuda::router_topk_rows(logits.ptr<float>(), tokens, experts, k, renormalize,
                                             r.probs.ptr<float>(), r.expert_ids.ptr<int32_t>(),
                                             r.weights.ptr<float>(), dev, Stream{}));
    return r;
  }
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    moe_router_topk_fwd_cpu<T>(logits.ptr<T>(), tokens, experts, k, renormalize, r.probs.ptr<T>(),
                               r.expert_ids.ptr<int32_t>(), r.weights.ptr<T>());
  });
  return r;
}

RouterOut router_replay(const Tensor& logits_in, const Tensor& expert_ids, bool renormalize) {
  const char* op = "router_replay";
  const Tensor logits = operand(logits_in, op, "logits"),
               ids = index_operand(expert_ids, op, "expert_ids");
  check(logits.dim() == 2 && ids.dim() == 2 && ids.rows() == logits.rows() && ids.cols() >= 1 &&
            ids.cols() <= logits.cols() && logits.cols() <= (1 << 24),
        [&] {
          return fmt::format(
              "{}: logits {} and expert_ids {} do not match (need [tokens, E] and "
              "[tokens, k] with 1 <= k <= E <= 2^24)",
              op, logits.describe(), ids.describe());
        });
  const int64_t tokens = logits.rows(), experts = logits.cols(), k = ids.cols();
  const Device dev = same_device(op, {{&logits, "logits"}, {&ids, "expert_ids"}});
  RouterOut r{Tensor::empty(logits.dtype(), {tokens, experts}, dev), ids,
              Tensor::empty(logits.dtype(), {tokens, k}, dev)};
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, cuda::router_replay_rows(logits.ptr<float>(), ids.ptr<int32_t>(), tokens,
                                                   experts, k, renormalize, r.probs.ptr<float>(),
                                                   r.weights.ptr<float>(), dev, Stream{}));
    return r;
  }
  by_dtype(logits, [&](auto t) {
    using T = decltype(t);
    moe_router_replay_fwd_cpu<T>(logits.ptr<T>(), ids.ptr<int32_t>(), tokens, experts, k,
                                 renormalize, r.probs.ptr<T>(), r.weights.ptr<T>());
  });
  return r;
}

Tensor router_topk_backward(const RouterOut& fwd, const Tensor& dweights_in, bool renormalize) {
  const char* op = "router_topk_backward";
  const Tensor probs = operand(fwd.probs, op, "probs"), dw = operand(dweights_in, op, "dweights"),
               ids = index_operand(fwd.expert_ids, op, "expert_ids");
  same_dtype(probs, dw, op);
  check(probs.dim() == 2 && ids.dim() == 2 && ids.rows() == probs.rows() && ids.cols() >= 1 &&
            ids.cols() <= probs.cols() && probs.cols() <= (1 << 24),
        [&] {
          return fmt::format("{}: probs {} and expert_ids {} do not match", op, probs.describe(),
                             ids.describe());
        });
  const int64_t tokens = probs.rows(), experts = probs.cols(), k = ids.cols();
  check(dw.numel() == tokens * k, [&] {
    return fmt::format("{}: dweights {} is not [{}, {}]", op, dw.describe(), tokens, k);
  });
  const Device dev = same_device(op, {{&probs, "probs"}, {&ids, "expert_ids"}, {&dw, "dweights"}});
  Tensor dl = Tensor::empty(probs.dtype(), {tokens, experts}, dev);
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, cuda::router_topk_rows_bwd(probs.ptr<float>(), ids.ptr<int32_t>(),
                                                     dw.ptr<float>(), tokens, experts, k,
                                                     renormalize, dl.ptr<float>(), dev, Stream{}));
    return dl;
  }
  by_dtype(dw, [&](auto t) {
    using T = decltype(t);
    moe_router_topk_bwd_cpu<T>(probs.ptr<T>(), ids.ptr<int32_t>(), dw.ptr<T>(), tokens, experts, k,
                               renormalize, dl.ptr<T>());
  });
  return dl;
}

SampledTokens sample_tokens(const Tensor& logits_in, const Tensor& streams_in,
                            const Tensor& positions_in, const SampleConfig& cfg) {
  const char* op = "sample_tokens";
  const Tensor logits = operand(logits_in, op, "logits"),
               streams = index_operand(streams_in, op, "streams");
  check(logits.dtype() == DType::kF32,
        [&] { return fmt::format("{}: logits {} must be F32", op, logits.describe()); });
  check(positions_in.defined() &&
            (positions_in.dtype() == DType::kI32 || positions_in.dtype() == DType::kI64),
        [&] {
          return fmt::format("{}: positions {} must be I32 or I64", op,
                             positions_in.defined() ? positions_in.describe() : "(undefined)");
        });
  const Tensor positions = positions_in.contiguous();
  check(logits.dim() == 2, [&] {
    return fmt::format("{}: logits {} must be [rows, vocabulary]", op, logits.describe());
  });
  const int64_t rows = logits.rows(), vocab = logits.cols();
  check(streams.numel() == rows && positions.numel() == rows, [&] {
    return fmt::format("{}: streams {} and positions {} need one value per row of logits {}", op,
                       streams.describe(), positions.describe(), logits.describe());
  });
  check_sample_config(cfg, vocab);
  const Device dev =
      same_device(op, {{&logits, "logits"}, {&streams, "streams"}, {&positions, "positions"}});
  SampledTokens r{Tensor::empty(DType::kI32, {rows}, dev), Tensor::empty(DType::kF32, {rows}, dev)};
  const bool pos64 = positions.dtype() == DType::kI64;
  if (dev.is_cuda()) {
    LOCKSTEP_OPS_CUDA(op, cuda::sample_tokens_rows(
                              logits.ptr<float>(), rows, vocab, streams.ptr<int32_t>(),
                              pos64 ? nullptr : positions.ptr<int32_t>(),
                              pos64 ? positions.ptr<int64_t>() : nullptr, cfg,
                              r.tokens.ptr<int32_t>(), r.logprobs.ptr<float>(), dev, Stream{}));
    return r;
  }
  std::vector<int64_t> pos(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i)
    pos[size_t(i)] = pos64 ? positions.ptr<int64_t>()[i] : int64_t(positions.ptr<int32_t>()[i]);
  sample_tokens_cpu(logits.ptr<float>(), rows, vocab,
                    reinterpret_cast<const uint32_t*>(streams.ptr<int32_t>()), pos.data(), cfg,
                    r.tokens.ptr<int32_t>(), r.logprobs.ptr<float>());
  return r;
}

}  // namespace lockstep::ops
