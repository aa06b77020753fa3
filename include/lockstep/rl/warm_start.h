// The supervised warm start (`lockstep pretrain`, and `lockstep train` without --model): teacher
// forcing on task examples so that RL starts from a policy with non-zero reward, and the cache
// that lets every run of the same (model, task, difficulty, seed, steps, contract) reuse it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "lockstep/model/weights.h"
#include "lockstep/recipe/json.h"
#include "lockstep/rl/rollout.h"

namespace lockstep::rl {

// Supervised examples come from the train split at indices kPretrainIndexBase + step * batch + i,
// far from the RL prompts (indices from 0), so the warm start never sees an RL batch's prompts.
constexpr uint64_t kPretrainIndexBase = uint64_t(1) << 40;

struct PretrainOptions {
  Device device = Device::cpu();  // where the warm start runs (not part of the cache key)
  std::string task = "add";
  int difficulty = 2;
  // Examples cycle through difficulties min_difficulty .. difficulty (example index modulo the
  // count), so short problems teach the pieces longer ones are made of; 0: difficulty only.
  int min_difficulty = 0;
  uint64_t seed = 0;     // the task stream's seed
  int64_t steps = 1000;  // AdamW steps (0: no training, the weights as given)
  int64_t batch = 64;    // examples per step
  double lr = 1e-2;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  // Held-out accuracy before and after (greedy decoding; reported, not part of the cache key).
  int64_t eval_prompts = 128;
  int64_t eval_max_new = 8;
  int64_t eval_every = 0;  // > 0: also evaluate every N steps (PretrainProgress::eval_accuracy)
};

struct PretrainProgress {
  int64_t step = 0, total = 0;  // completed steps
  double loss = 0.0;            // mean -log p of the answer tokens and <eos> in this step's batch
  double elapsed_s = 0.0;
  std::optional<double> eval_accuracy;  // on the steps options.eval_every selects
};

struct PretrainResult {
  model::ModelWeights weights;  // F32 masters after training
  EvalResult before, after;
  double final_loss = 0.0;
  double seconds = 0.0;
};

// The recipe of the warm start: bf16 (fast mode), whatever recipe the RL run uses, so every
// recipe of a comparison starts from the same weights.
inline constexpr const char* kPretrainRecipe = "bf16";

// Teacher forcing: each step packs `batch` examples as prompt + answer + <eos>, loss = mean over
// the answer tokens and <eos> of -log p (the prompt is not a target), AdamW with gradient-norm
// clipping. Throws std::invalid_argument for an unknown task, a difficulty outside the task's
// range, steps < 0, batch < 1 or a model whose vocabulary is not the task vocabulary.
PretrainResult pretrain(const model::ModelWeights& init, const PretrainOptions& options,
                        const std::function<void(const PretrainProgress&)>& on_step = {});

// Throws std::invalid_argument when the RL tasks cannot run on this model: vocabulary size other
// than kVocabSize, or a context shorter than `min_context` tokens. `where` names the model.
void check_task_model(const model::ModelConfig& config, int64_t min_context,
                      const std::string& where);

// The cache key: everything the warm start's weights depend on (the model config, where the
// initial weights came from and their seed, task, difficulty, seed, steps, batch, lr, weight
// decay, clipping, the warm-start recipe's content, the contract version and this procedure's
// version). Eval settings are not part of it.
Json warm_start_key(const model::ModelConfig& config, const std::string& init_source,
                    uint64_t init_seed, const PretrainOptions& options);
// 16 lowercase hex digits: FNV-1a 64 of key.dump().
std::string warm_start_hash(const Json& key);

struct WarmStart {
  model::ModelWeights weights;
  std::filesystem::path dir;  // cache_root / hash: config.json, model.safetensors, warm_start.json
  bool cached = false;        // loaded from the cache (false: trained now and stored)
  Json info;                  // warm_start.json: key, hash, eval before / after, loss, seconds
};

// The cache entry of a warm start (cache_root / warm_start_hash(key)) and whether it holds this
// key, without loading or training anything.
struct CachedWarmStart {
  std::filesystem::path dir;
  bool present = false;
};
CachedWarmStart find_cached_warm_start(const std::filesystem::path& cache_root,
                                       const model::ModelConfig& config,
                                       const std::string& init_source, uint64_t init_seed,
                                       const PretrainOptions& options);

// Looks the warm start up in cache_root / warm_start_hash(key) (a folder whose warm_start.json
// holds exactly this key); when missing, trains it from `init` and stores it atomically (a
// temporary folder renamed into place; a folder left by a killed process or with another key is
// replaced). Two processes making the same entry both succeed; one rename wins.
WarmStart cached_warm_start(const std::filesystem::path& cache_root,
                            const model::ModelWeights& init, const std::string& init_source,
                            uint64_t init_seed, const PretrainOptions& options,
                            const std::function<void(const PretrainProgress&)>& on_step = {});

// A deep copy of the weights (copies of a Tensor share its storage): the run's reference policy
// and the warm start's result must not alias the learner's masters.
model::ModelWeights clone_weights(const model::ModelWeights& w);

// Writes a model directory (config.json, model.safetensors) plus warm_start.json = info into
// `dir` through a temporary folder renamed into place. `dir` must not exist.
void save_warm_start(const std::filesystem::path& dir, const model::ModelWeights& weights,
                     const Json& info);

}  // namespace lockstep::rl
