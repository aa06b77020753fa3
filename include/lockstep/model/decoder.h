// The Qwen3 / Qwen3-MoE decoder built from nn/ modules: token embedding; per layer RMSNorm + qkv,
// per-head q/k RMSNorm, RoPE, K and V rounded by the KV-cache rule, causal GQA attention, o_proj,
// residual; RMSNorm + dense SwiGLU MLP or MoE block, residual; final norm; LM head (tied or not).
// Two executors share the layer code: the packed full-sequence forward / backward of the learner,
// and the cached incremental forward of the sampler (K / V of each row appended to a KvCache).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/model/config.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/moe.h"
#include "lockstep/ops/tensor_ops.h"
#include "lockstep/recipe/coverage.h"

namespace lockstep::model {

// Deterministic: the learner's attention is attention_row per (token, head), the function the
// sampler calls, so learner log-probs equal sampler log-probs bit for bit and a sequence alone
// equals the same sequence in a batch. Fast: the learner's attention uses the prefill kernel
// (another summation order). Every other op is row-local in both modes.
enum class ExecMode : uint8_t { kDeterministic, kFast };
std::string_view exec_mode_name(ExecMode m);

// What a Decoder is built from. Dense tensors by lockstep name (weights.h): F32 masters (or F64
// for gradient checks) of the learner, or the F32 norms / embedding of a policy version. grads:
// tensors of the same names where backward accumulates (learner only). operands: prepared weight
// operands of the linear modules (a policy version; modules without one read `tensors`).
struct DecoderWeights {
  ModelConfig config;
  ModelPlan plan;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, Tensor> grads;
  std::map<std::string, nn::Operand> operands;
  // [out, in] of each module given by an operand (per expert for grouped modules).
  std::map<std::string, std::pair<int64_t, int64_t>> operand_dims;
  // A rope table already built for this config, dtype and device (Decoder::rope_table of a
  // decoder of the same config), used instead of building one; empty: the decoder builds it (on
  // the host in float64: max_position_embeddings x head_dim / 2 sines and cosines, then copied).
  ops::RopeTable rope;
};

// The recipe module class of a linear weight by lockstep name ("layers.3.qkv" -> kQkv; a dense
// MLP's gate_up / down count as experts_fc1 / experts_fc2: a dense MLP is one always-on expert).
struct LinearSite {
  std::string name;  // lockstep tensor name of the weight
  ModuleClass cls;
  int layer;       // -1 for lm_head
  int64_t groups;  // experts for experts_fc1 / fc2 of a MoE layer, else 1
};
// Every linear weight of a config, in a fixed order (layers ascending, then lm_head); lm_head is
// listed (with the embedding's name when tied).
std::vector<LinearSite> linear_sites(const ModelConfig& c);
// The spec of a site under a plan (the shared-expert gate, which no recipe class names, follows
// the router of its layer).
LinearSpec site_spec(const ModelPlan& plan, const LinearSite& s);

// KV cache of the sampler: one ops::KvCacheLayer per layer (K and V [slots, max_pos, Hkv, D] as
// bf16 values, or FP8 E4M3 codes with a scale per (slot, position, kv head): ops/kv_cache.h), on
// the device the decoder runs on. Slots are reused across sequences: a sequence's attention reads
// only the positions it wrote, so a released slot needs no clearing and continuous batching
// allocates nothing per token.
using KvDtype = ops::KvDtype;
class KvCache {
 public:
  // slots: sequences held at once; max_pos: positions per slot (<= the configured context).
  KvCache(const ModelConfig& c, KvDtype dtype, int64_t slots, int64_t max_pos,
          Device device = Device::cpu());
  int64_t acquire();  // a free slot; std::runtime_error when every slot is taken
  void release(int64_t slot);
  int64_t in_use() const;
  ops::KvCacheLayer& layer(int64_t l) { return layers_.at(size_t(l)); }
  KvDtype dtype() const { return dtype_; }
  int64_t slots() const { return int64_t(used_.size()); }
  int64_t max_pos() const { return max_pos_; }
  Device device() const { return device_; }
  size_t bytes_per_slot() const;  // bytes one slot holds over every layer (K, V and fp8 scales)

 private:
  std::vector<ops::KvCacheLayer> layers_;
  std::vector<bool> used_;
  int64_t max_pos_;
  KvDtype dtype_;
  Device device_;
};

// The experts the MoE layers sent each token to (routing replay, docs/rl.md "Routing replay"): per
// decoder layer an I32 [tokens, top_k] tensor, rows in the order of the forward's tokens,
// undefined for a dense layer.
struct Routing {
  std::vector<Tensor> layers;
};
// Throws std::invalid_argument unless the config has a MoE layer: a dense model routes nothing, so
// routing replay has nothing to record or reuse. `what` names the caller (a flag, an API).
void require_moe_for_replay(const ModelConfig& c, std::string_view what);

class Decoder {
 public:
  explicit Decoder(DecoderWeights w);
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  ~Decoder();

  const ModelConfig& config() const;
  DType dtype() const;
  // The rope table (on the decoder's device): a next decoder of the same config takes it through
  // DecoderWeights::rope (the sampler does on every policy version).
  const ops::RopeTable& rope_table() const;

  // Packed forward: ids I32 [n] (host), cu_seqlens [b + 1] (0 .. n, every sequence at most
  // max_position_embeddings long). Returns logits [n, V] (F32, or F64). save: keep what the
  // backward needs. replay: each MoE layer uses these experts ([n, top_k] per layer, host or the
  // decoder's device) instead of its own top-k, weighted by its own router probabilities of them
  // (so the router still gets gradients); a model without MoE layers refuses it. record: receives
  // the experts every MoE layer used.
  Tensor forward(const Tensor& ids, std::span<const int64_t> cu_seqlens, ExecMode mode, bool save,
                 const Routing* replay = nullptr, Routing* record = nullptr);
  // dlogits [n, V] -> gradients added into DecoderWeights::grads.
  void backward(const Tensor& dlogits);

  // Cached forward of `rows` tokens: ids I32 [rows] (host or the decoder's device); row r is at
  // position positions[r] of the sequence in cache slot slots[r] (rows of one slot in ascending
  // positions, every earlier position of that slot already in the cache or among earlier rows).
  // Positions and slots are checked on the host and copied to the device once per call. Returns
  // logits [rows, V] on the decoder's device. record: receives the experts every MoE layer chose
  // for each row (on the decoder's device).
  Tensor forward_cached(const Tensor& ids, std::span<const int64_t> positions,
                        std::span<const int64_t> slots, KvCache& cache, Routing* record = nullptr);
  // The same with ids, positions and slots already on the decoder's device (I32 [rows] each), as
  // a captured decode step keeps them: nothing is read or checked on the host, so the caller
  // guarantees what the host overload checks (ids in the vocabulary, positions and slots inside
  // the cache).
  Tensor forward_cached_device(const Tensor& ids, const Tensor& positions, const Tensor& slots,
                               KvCache& cache, Routing* record = nullptr);
  Device device() const;
  // The GEMM order of every layer: kDeterministic the batch-invariant kernels, kFast the fastest
  // (forward() sets it from its argument; the sampler sets it once).
  void set_mode(ExecMode mode);
  // The dtype of the learner's K / V rounding (the sampler's cache dtype; default bf16).
  void set_kv_dtype(KvDtype dtype);

  void weights_changed();             // masters updated in place: rebuild cached operands
  void set_grad_seed(uint64_t seed);  // Philox seed of stochastic rounding in the next backward
  size_t saved_bytes() const;
  void clear_saved();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::model
