// The converter: a policy version is the sampler's copy of the weights, every linear module's
// weight prepared ONCE by the recipe's fprop weight spec (the bytes the learner's forward uses:
// both call nn::prepare_fprop_weight), bf16 modules as BF16 tensors, norms and the embedding as
// F32; stamped with the version, the recipe and an FNV-1a 64 checksum over every byte in a fixed
// order, so the sampler can refuse a version that does not match.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "lockstep/model/decoder.h"
#include "lockstep/model/weights.h"
#include "lockstep/recipe/recipe.h"

namespace lockstep::model {

// A policy version refused by the sampler (version, recipe or checksum mismatch).
class PolicyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PolicyVersion {
  int64_t version = 0;
  Recipe recipe;
  ModelConfig config;
  uint64_t checksum = 0;
  std::map<std::string, Tensor> dense;          // F32: embed, norms
  std::map<std::string, nn::Operand> operands;  // per linear site ("lm_head" when tied too)
  std::map<std::string, std::pair<int64_t, int64_t>> dims;  // [out, in] of each operand
  size_t nbytes() const;
};

struct ExportOptions {
  // Prepare every module as bf16 whatever the recipe (the baseline the RL loop times beside the
  // quantized export); the version then carries the built-in bf16 recipe.
  bool force_bf16 = false;
};

// weights: F32 masters (learner.weights()).
PolicyVersion export_policy(const ModelWeights& weights, const Recipe& recipe, int64_t version,
                            const ExportOptions& opt = {});
// FNV-1a 64 over version, recipe name, then every dense tensor and every operand part in name
// order (name bytes, then the raw bytes).
uint64_t policy_checksum(const PolicyVersion& p);
// The decoder inputs of a policy (used by the Sampler).
DecoderWeights decoder_weights(const PolicyVersion& p);

}  // namespace lockstep::model
