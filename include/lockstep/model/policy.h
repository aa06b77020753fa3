// The converter: a policy version is the sampler's copy of the weights, every linear module's
// weight prepared ONCE by the recipe's fprop weight spec (the bytes the learner's forward uses),
// bf16 modules as BF16 tensors, norms and the embedding as F32; stamped with the version and a
// 64-bit checksum over the version, the recipe's content, the config, the options and every
// tensor's dtype, shape and bytes, so the sampler can refuse a version that does not match.
// Conversion runs where the weights live (it calls the quantize ops on the tensors as they are);
// an optimizer step may supply each weight's outer amax so NVFP4 reads the weight once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/model/decoder.h"
#include "lockstep/model/weights.h"
#include "lockstep/recipe/recipe.h"

namespace lockstep::model {

// A policy version refused by the sampler (version, recipe or checksum mismatch) or by the
// converter (a version that does not move forward).
class PolicyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ExportOptions {
  // Prepare every module as bf16 whatever the recipe (the baseline the RL loop times beside the
  // quantized export); the version then carries the built-in bf16 recipe.
  bool force_bf16 = false;
  // NVFP4 weights with per_tensor / per_group scaling: q, k and v of a layer share one outer
  // scale (one amax over the fused qkv weight, as the learner quantizes it and as fused QKV layers
  // of serving engines read one weight_scale_2). false: each projection gets its own. Gate and up
  // always share one (per layer for a dense MLP, per expert for per_group experts).
  bool fuse_scales = true;
};

struct PolicyVersion {
  int64_t version = 0;
  Recipe recipe;
  ModelConfig config;
  ExportOptions options;
  uint64_t checksum = 0;
  std::map<std::string, Tensor> dense;          // F32: embed, norms
  std::map<std::string, nn::Operand> operands;  // per linear site ("lm_head" when tied too)
  std::map<std::string, std::pair<int64_t, int64_t>> dims;  // [out, in] of each operand
  size_t nbytes() const;
};

// Each weight's outer amax by lockstep weight name (weights.h), e.g. folded into the optimizer
// step that wrote the weight: F32 [domains] on the weight's device, domain d covering the rows
// weight_amax_domains() gives. A weight not in the map is read for its amax; an entry for a weight
// whose spec takes none (weight_amax_domains gives nullopt) is not used.
using WeightAmax = std::map<std::string, Tensor>;

// The outer amax domains the converter quantizes a linear weight with, as row offsets into the
// lockstep weight [rows, cols] (domain d = rows [o[d], o[d + 1])): the whole weight, each expert
// (per_group experts), or q / k / v (fuse_scales false). nullopt when the weight takes no supplied
// amax (bf16, per_row, mxfp8, fp8 modules).
std::optional<std::vector<int64_t>> weight_amax_domains(const ModelConfig& c, const ModelPlan& plan,
                                                        const LinearSite& site,
                                                        const ExportOptions& opt = {});

// The outer amax domain count of every linear weight that takes a supplied amax under `recipe`
// and whose domains are equal row ranges (weight_amax_domains: the whole weight, or each expert),
// by lockstep weight name: what an optimizer step computes per weight
// (Learner::set_weight_amax_domains) so that export_policy reads each master once.
std::map<std::string, int64_t> weight_amax_domain_counts(const ModelConfig& c, const Recipe& recipe,
                                                         const ExportOptions& opt = {});
// The entries of `amax` that export_policy can use under weight_amax_domain_counts(c, recipe,
// opt): the named weights whose amax holds that many values. Tensors are shared, not copied.
WeightAmax usable_weight_amax(const WeightAmax& amax, const ModelConfig& c, const Recipe& recipe,
                              const ExportOptions& opt = {});

// One linear weight (F32 master w, lockstep layout) prepared as the sampler's fprop operand: the
// learner's bytes (nn::prepare_fprop_weight / prepare_grouped_fprop_weight), or with q / k / v as
// separate domains when opt.fuse_scales is false. amax (optional): the weight's domain amax.
nn::Operand convert_weight(const Tensor& w, const ModelConfig& c, const ModelPlan& plan,
                           const LinearSite& site, const ExportOptions& opt,
                           const Tensor* amax = nullptr);

// weights: F32 masters (learner.weights()), on any device. amax: optional, see WeightAmax.
PolicyVersion export_policy(const ModelWeights& weights, const Recipe& recipe, int64_t version,
                            const ExportOptions& opt = {}, const WeightAmax* amax = nullptr);

// A converter that turns successive weight versions into policy versions and refuses a version
// that does not move forward (PolicyError), so a sampler never goes back to older weights.
class PolicyConverter {
 public:
  explicit PolicyConverter(Recipe recipe, ExportOptions opt = {});
  PolicyVersion convert(const ModelWeights& weights, int64_t version,
                        const WeightAmax* amax = nullptr);
  std::optional<int64_t> last_version() const { return last_; }

 private:
  Recipe recipe_;
  ExportOptions opt_;
  std::optional<int64_t> last_;
};

// The policy checksum (docs/model.md, "The policy checksum"): the version, the recipe's full
// content (recipe JSON), the config (config.json fields), fuse_scales, then every dense tensor and
// every operand part in name order (name, dtype and shape, the digest of the bytes), folded in
// order with num::digest_absorb. Byte digests (tensor/digest.h) are computed where the tensors
// live: for device tensors a kernel, and only 8 bytes per tensor reach the host.
uint64_t policy_checksum(const PolicyVersion& p);
// The number of that definition, written beside a stored checksum (export metadata
// `lockstep.checksum_version`) so a reader knows which function produced it.
inline constexpr int kPolicyChecksumVersion = 2;
// The decoder weights of a policy version on `device` (dense tensors and operands copied there;
// the CPU GEMM's packed copies are kept on the CPU only).
DecoderWeights decoder_weights(const PolicyVersion& p, Device device = Device::cpu());

}  // namespace lockstep::model
