// The Qwen3 / Qwen3-MoE decoder built from nn/ modules: token embedding; per layer RMSNorm + qkv,
// per-head q/k RMSNorm, RoPE, K and V rounded to bf16, causal GQA attention, o_proj, residual;
// RMSNorm + dense SwiGLU MLP or MoE block, residual; final norm; LM head (tied or not). Two
// executors share the layer code: the packed full-sequence forward / backward of the learner, and
// the cached incremental forward of the sampler (K / V of each row appended to a KvCache).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
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

// KV cache of the sampler: per slot (a sequence) and layer, K and V [max_pos, Hkv, D] as fp32
// values already rounded to the cache dtype (bf16, or FP8 E4M3 with a per-(slot, layer, head)
// scale from the first rows written, the prompt's prefill amax: s = 448 / amax, values
// decode(E4M3(x * s)) / s). The dtype enum is the ops layer's (ops/kv_cache.h).
using KvDtype = ops::KvDtype;
class KvCache {
 public:
  KvCache(const ModelConfig& c, KvDtype dtype);
  int64_t acquire();  // a free slot (reused storage), positions empty
  void release(int64_t slot);
  float* k(int64_t slot, int64_t layer);
  float* v(int64_t slot, int64_t layer);
  // Rounds K / V rows [rows, Hkv * D] of one slot to the cache dtype; the first call for a
  // (slot, layer) fixes the FP8 scales.
  void round_rows(int64_t slot, int64_t layer, float* k_rows, float* v_rows, int64_t rows);
  KvDtype dtype() const { return dtype_; }
  int64_t max_pos() const { return max_pos_; }
  size_t bytes_per_slot() const;  // as stored by a real cache (bf16: 2 B, fp8: 1 B per value)

 private:
  struct Slot {
    std::vector<float> k, v;    // [layers, max_pos, Hkv, D]
    std::vector<float> ks, vs;  // fp8 scales [layers, Hkv] (0: not set)
    bool used = false;
  };
  int64_t layers_, hkv_, d_, max_pos_;
  KvDtype dtype_;
  std::vector<Slot> slots_;
};

class Decoder {
 public:
  explicit Decoder(DecoderWeights w);
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  ~Decoder();

  const ModelConfig& config() const;
  DType dtype() const;

  // Packed forward: ids I32 [n] (host), cu_seqlens [b + 1] (0 .. n, every sequence at most
  // max_position_embeddings long). Returns logits [n, V] (F32, or F64). save: keep what the
  // backward needs.
  Tensor forward(const Tensor& ids, std::span<const int64_t> cu_seqlens, ExecMode mode, bool save);
  // dlogits [n, V] -> gradients added into DecoderWeights::grads.
  void backward(const Tensor& dlogits);

  // Cached forward of `rows` tokens: ids I32 [rows]; row r is at position positions[r] of the
  // sequence in cache slot slots[r] (rows of one slot in ascending positions, every earlier
  // position of that slot already in the cache or among earlier rows). Returns logits [rows, V].
  Tensor forward_cached(const Tensor& ids, std::span<const int64_t> positions,
                        std::span<const int64_t> slots, KvCache& cache);

  void weights_changed();             // masters updated in place: rebuild cached operands
  void set_grad_seed(uint64_t seed);  // Philox seed of stochastic rounding in the next backward
  size_t saved_bytes() const;
  void clear_saved();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::model
