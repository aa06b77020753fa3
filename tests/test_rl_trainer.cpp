// Tests of the trainer's building blocks: the packed learner layout of prompt + continuation
// sequences (which row predicts which response token), the per-step rollout seed, the run options'
// JSON round trip and validation messages, and the warm-start cache key. The loop itself is
// exercised end to end by tests/py/test_train_cli.py.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <vector>

#include "lockstep/model/config.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/rl/rollout.h"
#include "lockstep/rl/trainer.h"
#include "lockstep/rl/warm_start.h"

using namespace lockstep;
using namespace lockstep::rl;

TEST(RlPack, RowsPredictTheContinuationTokens) {
  const std::vector<int32_t> p0 = {1, 16, 5}, c0 = {7, 2}, p1 = {1, 17}, c1 = {};
  const std::vector<int32_t> p2 = {1, 18, 4, 3}, c2 = {9};
  const SequenceView seqs[] = {{p0, c0}, {p1, c1}, {p2, c2}};
  const PackedSequences p = pack_sequences(seqs);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{1, 16, 5, 7, 2, 1, 17, 1, 18, 4, 3, 9}));
  EXPECT_EQ(p.cu_seqlens, (std::vector<int64_t>{0, 5, 7, 12}));
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 2, 2, 3}));
  // Row r's target is token r + 1 of the same sequence; a sequence's last row targets <pad>.
  EXPECT_EQ(p.targets, (std::vector<int32_t>{16, 5, 7, 2, kPad, 17, kPad, 18, 4, 3, 9, kPad}));
  // Continuation token t is predicted by the row before it.
  EXPECT_EQ(p.rows, (std::vector<int64_t>{2, 3, 10}));
  for (size_t t = 0; t < p.rows.size(); ++t)
    EXPECT_EQ(p.targets[size_t(p.rows[t])], (std::vector<int32_t>{7, 2, 9})[t]);
  const std::vector<int32_t> empty;
  const SequenceView bad[] = {{empty, c0}};
  EXPECT_THROW(pack_sequences(bad), std::invalid_argument);
}

TEST(RlRollout, SampleSeedDependsOnSeedAndStepOnly) {
  std::set<uint64_t> seen;
  for (uint64_t seed : {0, 1})
    for (int64_t step = 0; step < 100; ++step) seen.insert(rollout_sample_seed(seed, step));
  EXPECT_EQ(seen.size(), 200u);
  EXPECT_EQ(rollout_sample_seed(7, 3), rollout_sample_seed(7, 3));
}

TEST(RlTrainOptions, JsonRoundTripAndValidation) {
  TrainOptions o;
  o.task = "sort";
  o.difficulty = 5;
  o.guard = "triage-gate";
  o.gate.segment = 32;
  o.repair.segment = 96;
  o.reward = "prefix";
  o.eval_split = "validation";
  o.kv_cache = "fp8";
  o.learner_kv = "match";
  o.sampler_recipe = lockstep::builtin_recipe_or_throw("w4a16_nvfp4", "test").recipe;
  o.seed = 1ull << 60;
  o.lr = 1.25e-4;
  o.repair.margin = -0.75;
  const Json j = options_to_json(o);
  EXPECT_EQ(options_to_json(options_from_json(j, "t")), j);
  EXPECT_NO_THROW(o.validate());

  Json missing = j;
  missing.erase("lr");
  EXPECT_THROW(
      {
        try {
          options_from_json(missing, "run_meta.json");
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("'lr' is missing"), std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
  auto message = [](TrainOptions x) {
    try {
      x.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TrainOptions b;
  b.task = "divide";
  EXPECT_NE(message(b).find("unknown task 'divide'"), std::string::npos);
  b = {};
  b.guard = "sometimes";
  EXPECT_NE(message(b).find("sometimes"), std::string::npos);
  b = {};
  b.difficulty = 0;
  EXPECT_NE(message(b).find("--difficulty 0"), std::string::npos);
  b = {};
  b.prompts = 6;
  b.minibatches = 4;
  EXPECT_NE(message(b).find("multiple of --minibatches"), std::string::npos);
  b = {};
  b.learner_kv = "fp8";
  EXPECT_NE(message(b).find("--learner-kv 'fp8'"), std::string::npos);
  b = {};
  b.temperature = 0.0;
  EXPECT_NE(message(b).find("--temperature"), std::string::npos);
  // Answers that cannot fit: cumsum at difficulty 11 writes 65 tokens.
  b = {};
  b.task = "cumsum";
  b.difficulty = 11;
  EXPECT_NE(message(b).find("--max-new 8 cannot hold the answer of task 'cumsum' at difficulty "
                            "11 (65 tokens + <eos>)"),
            std::string::npos)
      << message(b);
  b.max_new = 66;
  EXPECT_EQ(message(b), "");
  b = {};
  b.guard = "tis+triage";
  EXPECT_NE(message(b).find("TIS + gate + repair"), std::string::npos);
  b = {};
  b.routing_replay = true;  // valid options; a dense model is refused by Trainer::create
  EXPECT_EQ(message(b), "");
  b = {};
  b.kv_cache = "int4";
  EXPECT_NE(message(b).find("--kv-cache 'int4'"), std::string::npos);
  b = {};
  b.reward = "prefix";
  b.format_bonus = 0.1f;
  EXPECT_NE(message(b).find("--format-bonus applies to the exact reward only"), std::string::npos);
  b = {};
  b.eval_split = "train";
  EXPECT_NE(message(b).find("unknown evaluation split 'train'"), std::string::npos);
  b = {};
  b.gate.severe_gap = 0.0;
  EXPECT_NE(message(b).find("--gate-severe-gap 0 must be <= --gate-mild-gap -0.5"),
            std::string::npos);
  b = {};
  b.gate.segment = 0;
  EXPECT_NE(message(b).find("--gate-segment 0"), std::string::npos);
  b = {};
  b.async_rollout = 2;
  EXPECT_NE(message(b).find("--async-rollout 2 must be 0"), std::string::npos);
  b.async_rollout = 1;
  EXPECT_EQ(message(b), "");
  EXPECT_EQ(options_from_json(options_to_json(b), "t").async_rollout, 1);

  // A run folder written before the newer options: they keep their defaults.
  Json older = options_to_json(TrainOptions{});
  for (const char* k : {"sampler_recipe", "kv_cache", "routing_replay", "reward", "eval_split",
                        "gate_segment", "repair_segment", "async_rollout"})
    older.erase(k);
  const TrainOptions back = options_from_json(older, "old run");
  EXPECT_FALSE(back.sampler_recipe);
  EXPECT_EQ(back.gate.segment, 64);
  EXPECT_EQ(back.repair.segment, 128);
  EXPECT_EQ(back.eval_split, "heldout");
  EXPECT_EQ(back.async_rollout, 0);
}

TEST(RlWarmStart, CacheKeyCoversTheTrainingInputs) {
  const model::ModelConfig c = model::preset("tiny-dense");
  const PretrainOptions o;
  const std::string h = warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, o));
  EXPECT_EQ(h.size(), 16u);
  EXPECT_EQ(h, warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, o)));
  PretrainOptions eval_only = o;
  eval_only.eval_prompts = 3;  // evaluation settings do not change the weights
  EXPECT_EQ(h, warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, eval_only)));
  std::set<std::string> all = {h};
  PretrainOptions x = o;
  x.steps += 1;
  all.insert(warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, x)));
  x = o;
  x.difficulty = o.difficulty + 1;
  all.insert(warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, x)));
  x = o;
  x.lr *= 2;
  all.insert(warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, x)));
  all.insert(warm_start_hash(warm_start_key(c, "preset:tiny-dense", 1, o)));
  all.insert(warm_start_hash(warm_start_key(model::preset("tiny-moe"), "preset:tiny-moe", 0, o)));
  EXPECT_EQ(all.size(), 6u);
  // The schedule and the targeted stop decide the weights: each of their settings is in the key,
  // and so is the length of the stop's answers.
  const std::vector<std::function<void(PretrainOptions&)>> changes = {
      [](PretrainOptions& p) { p.warmup_steps += 1; },
      [](PretrainOptions& p) { p.min_lr_ratio /= 2; },
      [](PretrainOptions& p) { p.target_accuracy /= 2; },
      [](PretrainOptions& p) { p.target_accuracy = 0.0; },
      [](PretrainOptions& p) { p.target_every += 1; },
      [](PretrainOptions& p) { p.target_prompts += 1; },
      [](PretrainOptions& p) { p.eval_max_new += 1; },
  };
  for (const auto& change : changes) {
    x = o;
    change(x);
    all.insert(warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, x)));
  }
  EXPECT_EQ(all.size(), 6u + changes.size());
  // Without a targeted stop its evaluation settings do not matter.
  PretrainOptions no_target = o, no_target_other = o;
  no_target.target_accuracy = no_target_other.target_accuracy = 0.0;
  no_target_other.target_every += 1;
  no_target_other.eval_max_new += 1;
  EXPECT_EQ(warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, no_target)),
            warm_start_hash(warm_start_key(c, "preset:tiny-dense", 0, no_target_other)));
}

TEST(RlWarmStart, LearningRateScheduleWarmsUpThenDecays) {
  PretrainOptions o;
  o.lr = 1e-2;
  o.steps = 1000;
  o.warmup_steps = 100;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(pretrain_lr(o, 0), 1e-4);   // (0 + 1) / 100 of the peak
  EXPECT_DOUBLE_EQ(pretrain_lr(o, 49), 5e-3);  // half way up
  EXPECT_DOUBLE_EQ(pretrain_lr(o, 99), 1e-2);  // the peak at the warmup's last step
  EXPECT_DOUBLE_EQ(pretrain_lr(o, 100), 1e-2);
  EXPECT_NEAR(pretrain_lr(o, 550), 1e-2 * (0.1 + 0.9 * 0.5), 1e-15);  // cosine's midpoint
  EXPECT_NEAR(pretrain_lr(o, 1000), 1e-3, 1e-15);                     // the floor at the cap
  for (int64_t s = 101; s < 1000; ++s) EXPECT_LT(pretrain_lr(o, s), pretrain_lr(o, s - 1)) << s;
  PretrainOptions flat = o;
  flat.warmup_steps = 0;
  flat.min_lr_ratio = 1.0;
  for (int64_t s : {0, 1, 500, 999}) EXPECT_DOUBLE_EQ(pretrain_lr(flat, s), 1e-2) << s;
  PretrainOptions short_run = o;
  short_run.steps = 50;  // the cap inside the warmup: warmup only
  EXPECT_DOUBLE_EQ(pretrain_lr(short_run, 49), 5e-3);
  PretrainOptions bad = o;
  bad.min_lr_ratio = 1.5;
  EXPECT_THROW(pretrain_lr(bad, 0), std::invalid_argument);
  bad = o;
  bad.warmup_steps = -1;
  EXPECT_THROW(pretrain_lr(bad, 0), std::invalid_argument);
}
