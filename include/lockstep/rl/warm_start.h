// The supervised warm start (`lockstep pretrain`, and `lockstep train` without --model): teacher
// forcing on task examples until a validation accuracy target, so that RL starts from a policy
// with non-zero reward and room to rise, and the cache that lets every run of the same (model,
// task, difficulty, seed, options, contract) reuse it.
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
  Device device = Device::cpu();  // where the warm start runs (warm_start_device is in the key)
  std::string task = "add";
  int difficulty = 2;
  // Examples cycle through difficulties min_difficulty .. difficulty (example index modulo the
  // count), so short problems teach the pieces longer ones are made of; 0: difficulty only.
  int min_difficulty = 0;
  uint64_t seed = 0;     // the task stream's seed
  int64_t steps = 2000;  // AdamW steps at most (0: no training, the weights as given)
  int64_t batch = 64;    // examples per step
  // The learning-rate schedule (pretrain_lr): linear warmup to the peak `lr` over warmup_steps
  // (Adam's first steps are sign-like and full-size: the warmup keeps them small), then cosine
  // decay to lr * min_lr_ratio at step `steps`. No decay by default: RL (lr 2e-3, a fresh AdamW)
  // collapsed every warm start that ended at a decayed or lower lr (5e-3 and below; docs/rl.md,
  // "Warm start"), and rose from those that ended at 1e-2.
  double lr = 1e-2;
  int64_t warmup_steps = 100;
  double min_lr_ratio = 1.0;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  // The accuracy-targeted stop: every target_every steps, greedy accuracy on target_prompts
  // prompts of the validation part (never the held-out part that RL reports on); training ends at
  // the first evaluation at or above target_accuracy, whatever step the seed, device or model
  // needs to leave the loss plateau, so RL starts with room to rise; `steps` caps it (a warm
  // start that reaches the cap below its target is kept, and reported as such).
  // target_accuracy 0: all `steps`, no evaluation.
  double target_accuracy = 0.4;
  int64_t target_every = 20;
  int64_t target_prompts = 128;
  // Greedy decoding of every evaluation: at most eval_max_new tokens per answer.
  int64_t eval_max_new = 8;
  // Held-out accuracy before and after (reported, not part of the cache key).
  int64_t eval_prompts = 128;
  int64_t eval_every = 0;  // > 0: also evaluate every N steps (PretrainProgress::eval_accuracy)
};

// The learning rate of step `step` (0-based) of `o`: linear warmup lr * (step + 1) / warmup_steps
// over the first warmup_steps steps, then cosine from lr down to lr * min_lr_ratio at step
// o.steps. Throws std::invalid_argument for lr < 0, warmup_steps < 0 or min_lr_ratio outside
// [0, 1].
double pretrain_lr(const PretrainOptions& o, int64_t step);

struct PretrainProgress {
  int64_t step = 0, total = 0;  // completed steps; total: the cap
  double loss = 0.0;            // mean -log p of the answer tokens and <eos> in this step's batch
  double grad_norm = 0.0;       // global gradient norm before clipping
  double lr = 0.0;              // the learning rate of this step
  double elapsed_s = 0.0;
  std::optional<double> eval_accuracy;        // held-out, on the steps options.eval_every selects
  std::optional<double> validation_accuracy;  // the targeted stop's evaluation, when it ran
};

struct PretrainResult {
  model::ModelWeights weights;  // F32 masters after training
  EvalResult before, after;     // held-out
  int64_t steps_done = 0;       // <= options.steps: the targeted stop may end it early
  // The targeted stop: its last validation evaluation and whether it reached the target
  // (unset when target_accuracy is 0 or no evaluation ran).
  std::optional<EvalResult> validation;
  bool target_reached = false;
  double final_loss = 0.0;
  double seconds = 0.0;
};

// warm_start.json's description of a result: eval before / after, steps done, the targeted stop,
// final loss, seconds.
Json pretrain_result_json(const PretrainResult& r, const PretrainOptions& o);

// The recipe of the warm start: bf16 (fast mode), whatever recipe the RL run uses, so every
// recipe of a comparison starts from the same weights.
inline constexpr const char* kPretrainRecipe = "bf16";

// Teacher forcing: each step packs `batch` examples as prompt + answer + <eos>, loss = mean over
// the answer tokens and <eos> of -log p (the prompt is not a target), AdamW with gradient-norm
// clipping at pretrain_lr's schedule, ended early by the accuracy-targeted stop. Throws
// std::invalid_argument for an unknown task, a difficulty outside the task's range, steps < 0,
// batch < 1, a bad schedule, target_accuracy outside [0, 1], target_every or target_prompts < 1
// with a target, or a model whose vocabulary is not the task vocabulary.
PretrainResult pretrain(const model::ModelWeights& init, const PretrainOptions& options,
                        const std::function<void(const PretrainProgress&)>& on_step = {});

// Throws std::invalid_argument when the RL tasks cannot run on this model: vocabulary size other
// than kVocabSize, or a context shorter than `min_context` tokens. `where` names the model.
void check_task_model(const model::ModelConfig& config, int64_t min_context,
                      const std::string& where);

// What the warm-start cache key says about the device: "cpu", or the GPU's name, compute
// capability and SM count ("cuda NVIDIA H200 sm_90 (132 SMs)"): kernels, and so bits, follow them.
std::string warm_start_device(Device d);

// The cache key: everything the warm start's weights depend on (the model config, where the
// initial weights came from and their seed, task, difficulty, seed, steps, batch, the schedule,
// weight decay, clipping, the targeted stop and its evaluation, the warm-start recipe's content,
// the contract version, this procedure's version and warm_start_device). The held-out evaluation is
// not part of it.
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
