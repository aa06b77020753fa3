// Tensor-level entries of the transformer ops: one call per op, taking and returning Tensors and
// dispatching on the device the tensors live on (the CPU kernels of ops/*.h; a CUDA engine adds its
// kernels here without touching nn/ or model/). Floating tensors are F32 or F64 (gradient checks);
// every op keeps the fixed reduction order its kernel header states.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "lockstep/ops/kv_cache.h"
#include "lockstep/ops/optim.h"
#include "lockstep/ops/sampling.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::ops {

// An op called on tensors of a device whose engine does not implement it (CUDA, for now).
class DeviceNotSupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- norms --------------------------------------------------------------------------------------
// x: [rows, d]; w: [d] (same dtype). Returns y [rows, d]; *rstd: [rows], saved for the backward.
// Row sums over 32 lanes (ops/rmsnorm.h); CPU and CUDA give the same bits. out: y's dtype, x's
// own or BF16 for an F32 x (the bits of cast(rmsnorm(x), BF16), one kernel on a GPU: the input of
// a bf16 GEMM operand without a separate cast).
Tensor rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor* rstd,
               std::optional<DType> out = std::nullopt);
// The residual stream's add and the next norm: x += residual in place (add_inplace's bits; x
// contiguous, residual of x's size and dtype in its own storage), then rmsnorm(x, w, eps, rstd,
// out). One kernel on a GPU. An undefined residual is rmsnorm alone.
Tensor add_rmsnorm(Tensor& x, const Tensor& residual, const Tensor& w, double eps, Tensor* rstd,
                   std::optional<DType> out = std::nullopt);
// Returns dx [rows, d]; *dw: [d], the weight gradient of this call (overwritten; rows summed in
// chunks of 256, chunk partials in ascending order: ops/rmsnorm.h).
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        Tensor* dw);

// ---- rotary embedding ---------------------------------------------------------------------------
// cos / sin tables [max_pos, head_dim] of dtype F32 or F64, built on the host in float64 and
// rounded once (ops/rope.h); to() copies both to a device once (a CUDA table is F32).
struct RopeTable {
  Tensor cos, sin;
  int64_t max_pos = 0, head_dim = 0;
  Device device() const { return cos.device(); }
  RopeTable to(Device device, Stream stream = {}) const;
};
RopeTable rope_table(int64_t max_pos, int64_t head_dim, double theta, DType dtype);
// x: [tokens, heads, head_dim] (or [tokens, heads * head_dim]), contiguous; positions: I32
// [tokens]; x, positions and the table on one device. In place. On the CPU a position outside
// [0, max_pos) throws std::out_of_range before anything is written; on CUDA (positions are never
// read on the host) that token's rows become NaN.
void rope_inplace(Tensor& x, const Tensor& positions, int64_t heads, const RopeTable& table);
void rope_backward_inplace(Tensor& dx, const Tensor& positions, int64_t heads,
                           const RopeTable& table);

// ---- attention
// -------------------------------------------------------------------------------------
// Which kernel the packed forward runs. kRowwise: attention_row per (token, head) (the sampler's
// function: deterministic, batch-invariant; the same bits on the CPU and the GPU). kPrefill: the
// fast path, another order: on the CPU one two-pass softmax per query; on the GPU a tensor-core
// flash kernel with bf16 Q / K / V / P operands (within the bound of docs/ops.md of the CPU).
enum class AttentionKernel : uint8_t { kRowwise, kPrefill };

struct AttentionShape {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
};
// q: [tokens, Hq * D]; k, v: [tokens, Hkv * D]; cu_seqlens: I32 or I64 [b + 1], on the host
// (validated) or, for CUDA tensors, on the device (never read on the host: see docs/ops.md for
// what a malformed one does). Returns out [tokens, Hq * D]; *lse: [tokens, Hq].
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                 const AttentionShape& shape, AttentionKernel kernel, Tensor* lse);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  const Tensor& cu_seqlens, const AttentionShape& shape);
// 1 / sqrt(head_dim) rounded to the dtype (the scale every attention entry uses).
double attention_scale(int64_t head_dim);

// ---- KV cache (ops/kv_cache.h: KvDtype and the rounding rule the learner and the sampler share)
// One layer of the sampler's cache. k, v: [slots, max_pos, Hkv, D], BF16 values or U8 E4M3 codes;
// k_scale, v_scale: F32 [slots, max_pos, Hkv] (fp8; undefined for bf16).
struct KvCacheLayer {
  Tensor k, v;
  Tensor k_scale, v_scale;
  KvDtype dtype = KvDtype::kBf16;
  int64_t slots() const { return k.size(0); }
  int64_t max_pos() const { return k.size(1); }
  int64_t kv_heads() const { return k.size(2); }
  int64_t head_dim() const { return k.size(3); }
};
// A zero-filled layer on `device`.
KvCacheLayer kv_cache_layer(int64_t slots, int64_t max_pos, int64_t kv_heads, int64_t head_dim,
                            KvDtype dtype, Device device = Device::cpu());
// x: F32 [tokens, Hkv * D], every (token, kv head) row rounded in place by the cache rule (the
// learner's K and V; F64 is left untouched, as round_bf16_inplace does).
void kv_round_inplace(Tensor& x, int64_t kv_heads, KvDtype dtype);
// Row r of k_rows / v_rows (F32 [rows, Hkv * D]) rounded by the rule and stored at position
// positions[r] of slot slots[r]. slots, positions: I32 or I64 [rows] on the cache's device; host
// ones are checked (an index out of range is an error), device ones never read on the host: a row
// whose slot or position is out of range is not written. Rows must name distinct (slot, position)
// pairs.
void kv_cache_write(KvCacheLayer& layer, const Tensor& k_rows, const Tensor& v_rows,
                    const Tensor& slots, const Tensor& positions);
// The sampler's cached step before attention, in one pass: qkv F32 [tokens, (Hq + 2 Hkv) * D] (the
// qkv projection's output; Hkv and D are the cache's), q_norm / k_norm [D], positions I32 [tokens],
// slots I32 / I64 [tokens], all on the cache's device. Returns q [tokens, Hq * D] =
// rope(rmsnorm(q part, q_norm)) and stores rope(rmsnorm(k part, k_norm)) and the v part at
// (slots[t], positions[t]). The same bits, errors included, as
//   split_cols -> rmsnorm (q, k heads) -> rope_inplace (q, k) -> kv_cache_write (k, v),
// which is what the CPU runs; CUDA runs one kernel (index rules of rope_inplace and
// kv_cache_write for device tensors).
Tensor cached_qkv_prologue(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                           double eps, const Tensor& positions, const RopeTable& rope,
                           KvCacheLayer& layer, const Tensor& slots, int64_t q_heads);
// q: F32 [rows, Hq * D]. Row r attends to positions 0 .. positions[r] of slot slots[r] with
// attention_row: the bits of the learner's kRowwise attention for that token. Returns out
// [rows, Hq * D], F32 or out_dtype BF16 (the bits of its cast: the input of a bf16 GEMM operand);
// *lse [rows, Hq] when lse is given. Device indices out of range give a NaN row (out and lse).
Tensor attention_cached(const Tensor& q, const KvCacheLayer& layer, const Tensor& slots,
                        const Tensor& positions, const AttentionShape& shape, Tensor* lse = nullptr,
                        std::optional<DType> out_dtype = std::nullopt);

// ---- MLP and MoE --------------------------------------------------------------------------------
// x: [rows, 2I] (gate | up); p: [rows] or undefined. Returns y [rows, I]. dp sums a row over 32
// lanes (ops/swiglu.h). out: y's dtype, as rmsnorm's (x's own, or BF16 from F32 x).
Tensor swiglu(const Tensor& x, const Tensor& p, std::optional<DType> out = std::nullopt);
struct SwigluGrads {
  Tensor dx, dp;  // dp defined when p is
};
SwigluGrads swiglu_backward(const Tensor& x, const Tensor& p, const Tensor& dy);

struct RouterOut {
  Tensor probs;       // [tokens, E]
  Tensor expert_ids;  // I32 [tokens, k]
  Tensor weights;     // [tokens, k]
};
// ops/router.h, 32 lanes. logits: [tokens, E], 1 <= k <= E.
RouterOut router_topk(const Tensor& logits, int64_t k, bool renormalize);
// Routing replay: the experts are given (expert_ids I32 [tokens, k] on the logits' device, e.g.
// what the sampler chose) and the router supplies their weights from its own probabilities
// (ops/router.h router_replay_row; expert_ids of the result is the given tensor). Ids equal to
// router_topk's give its probs and weights bit for bit; router_topk_backward differentiates either.
// Host ids are checked (std::out_of_range); a device id outside [0, E) gives NaN weights.
RouterOut router_replay(const Tensor& logits, const Tensor& expert_ids, bool renormalize);
// Expert ids on the host are checked; on the device an id outside [0, E) gives a NaN row.
Tensor router_topk_backward(const RouterOut& fwd, const Tensor& dweights, bool renormalize);

// ---- embedding and log-probs --------------------------------------------------------------------
// table: [V, d]; ids: I32 [tokens] on the table's device. Returns [tokens, d]. On the CPU an id
// outside [0, V) throws std::out_of_range; on CUDA (ids are never read on the host) that token's
// row is NaN.
Tensor embedding(const Tensor& table, const Tensor& ids);
// Returns dtable [V, d] (this call's gradient): each row sums its tokens in ascending token order
// (ops/embedding.h). On CUDA a token whose id is outside [0, V) adds to no row.
Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t vocab);

struct TokenLogprobs {
  Tensor logp, entropy, lse;  // [tokens]
};
// logits: [tokens, V]; targets: I32 [tokens].
TokenLogprobs token_logprobs(const Tensor& logits, const Tensor& targets);
// dlogp / dentropy: [tokens] or undefined (zero). Returns dlogits [tokens, V].
Tensor token_logprobs_backward(const Tensor& logits, const Tensor& targets,
                               const TokenLogprobs& fwd, const Tensor& dlogp,
                               const Tensor& dentropy);
// Targets on the host are checked ([0, V), std::out_of_range); targets on the device are never read
// there: an out-of-range one gives logp = NaN and a NaN gradient row.

// ---- softmax and sampling ----------------------------------------------------------------------
// Rows of the last dimension of x, 1024 lanes (ops/softmax.h). Returns y of x's shape.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// y: the forward output; dy: y's gradient. Returns dx of y's shape.
Tensor softmax_backward(const Tensor& y, const Tensor& dy);
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy);

struct SampledTokens {
  Tensor tokens;    // I32 [B]: -1 for a row without a distribution
  Tensor logprobs;  // F32 [B]: lp of each token (log_softmax of logits * float(1 / temperature))
};
// The definition of ops/sampling.h on every device. logits: F32 [B, V]; streams: I32 [B] (the
// Philox stream of each row, read as uint32); positions: I32 or I64 [B] (the Philox position);
// all three on one device, where the outputs are allocated.
SampledTokens sample_tokens(const Tensor& logits, const Tensor& streams, const Tensor& positions,
                            const SampleConfig& cfg);

// ---- optimizer ----------------------------------------------------------------------------------
// AdamW on one parameter (ops/optim.h): param, m, v updated in place; grad read; all contiguous,
// of one dtype, on one device. grad_scale (a clipping coefficient, or 1) is rounded to the dtype
// once. amax: when not null, receives an F32 [amax_domains] tensor on the param's device, value d
// the amax of the updated param's d-th equal part of its elements (ops/optim.h; amax_domains
// divides the element count: 1 for the whole weight, E for the experts of a grouped weight); an
// F32 tensor of that size already there is written in place (so a caller can keep one buffer per
// weight), anything else is replaced by a new one.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWConfig& cfg,
                int64_t step, double grad_scale, Tensor* amax = nullptr, int64_t amax_domains = 1);
// The global L2 norm of a list of gradients (F32 or F64 on the CPU, F32 on CUDA; one dtype, one
// device), in float64 with the fixed order of ops/optim.h (chunks of kGradNormChunk, tensors in
// list order), returned on the host: a CUDA call ends with one 8-byte device-to-host copy.
double grad_norm(std::span<const Tensor> grads);

// ---- elementwise helpers ------------------------------------------------------------------------
// No reductions except row_dot; every element is one expression of its inputs (ops/elementwise.h),
// the same bits on every backend.
// y = x * T(s) elementwise (one rounding per element), a new tensor.
Tensor scale(const Tensor& x, double s);
// a + b elementwise (same dtype and element count), a new tensor of a's shape.
Tensor add(const Tensor& a, const Tensor& b);
// a += b elementwise (same dtype and element count), one rounding per element.
void add_inplace(Tensor& a, const Tensor& b);
// Every element of an F32 tensor rounded to bf16 (RNE) and widened back, in place; F64 untouched.
void round_bf16_inplace(Tensor& x);
// x = 1 / (1 + exp(-x)) per element, in place (float: exp_f32 of numerics/transcendental.h).
void sigmoid_inplace(Tensor& x);
// x: [T, d]; a: [T]. Returns y [T, d] with y[t, c] = a[t] * x[t, c].
Tensor scale_rows(const Tensor& x, const Tensor& a);
// a, b: [T, d]. Returns [T]: sum_c a[t, c] * b[t, c] over 32 lanes (row_exec.h: lane l sums
// c = l, l + 32, ... ascending from +0, then the fixed pairwise tree).
Tensor row_dot(const Tensor& a, const Tensor& b);

// Throws DeviceNotSupported unless t lives on the CPU; names the op and the tensor.
void require_cpu(const Tensor& t, std::string_view op, std::string_view name);

}  // namespace lockstep::ops
