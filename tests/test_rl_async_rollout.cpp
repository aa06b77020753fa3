// Overlapped rollouts (TrainOptions::async_rollout = 1, docs/rl.md "Overlapped rollouts") on a
// tiny MoE model on the CPU: step k trains on the batch of version max(0, k - 2) and its rows say
// so, the first step is the synchronous run's, two runs give the same rows and checkpoint bytes,
// a run stopped after a checkpoint and resumed in a new Trainer ends with the uninterrupted run's
// bits, a resume that asks for another schedule or lacks the stored batch is refused, the stored
// batch round-trips, and an error of the sampling thread reaches the caller with its message.
// (--async-rollout 0 against the trainer before overlapped rollouts existed: the bit-identity
// checks of tests/py/test_train_cli.py and test_train_dp.py run the default, synchronous loop.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "lockstep/diag/metrics.h"
#include "lockstep/recipe/selection.h"
#include "lockstep/rl/trainer.h"
#include "rl/async_rollout.h"
#include "tiny_model_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the test temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / fmt::format("lockstep-async-{}-{}", name, getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

model::ModelWeights init_weights() {
  test::TinyOptions t;
  t.moe = true;
  t.vocab = 32;
  t.max_pos = 32;
  return test::tiny_weights(test::tiny_config(t), 11);
}

// The micro run of tests/py/test_train_cli.py: rewards vary (format bonus), so the policy moves
// every step and a batch sampled one version earlier differs.
rl::TrainOptions small_options(int async_rollout, int64_t steps = 5) {
  rl::TrainOptions o;
  o.steps = steps;
  o.prompts = 4;
  o.group = 4;
  o.max_new = 4;
  o.difficulty = 1;
  o.format_bonus = 0.5f;
  o.lr = 0.01;
  o.eval_prompts = 8;
  o.eval_every = 1;
  o.checkpoint_every = 2;
  o.async_rollout = async_rollout;
  return o;
}

SelectedRecipe recipe() {
  SelectionInputs in;
  in.recipe_name = "nvfp4_per_token";
  return select_recipe(in);
}

std::vector<Json> rows_of(const fs::path& run) {
  std::vector<Json> out;
  for (const diag::MetricsRow& r : diag::read_metrics(run / diag::kMetricsFileName).rows)
    out.push_back(r);
  return out;
}

// The rows without the keys that measure time.
std::vector<Json> untimed(std::vector<Json> rows) {
  for (Json& r : rows) {
    Json keep = Json::object();
    for (const auto& [k, v] : r.items())
      if (k.rfind("time_", 0) != 0 && k != "elapsed_s" && k != "tokens_per_s") keep[k] = v;
    r = keep;
  }
  return rows;
}

// "" when equal, else where the first difference is: "row 2 key entropy: 3.1 vs 3.2".
std::string first_difference(const std::vector<Json>& a, const std::vector<Json>& b) {
  if (a.size() != b.size()) return fmt::format("{} rows vs {}", a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    for (const auto& [k, v] : a[i].items())
      if (!b[i].contains(k) || b[i][k] != v)
        return fmt::format("row {} key {}: {} vs {}", i, k, v.dump(),
                           b[i].contains(k) ? b[i][k].dump() : "absent");
    return fmt::format("row {}: keys only in the second", i);
  }
  return "";
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// A new run in `dir` (stop_after > 0: stopped cleanly after that many steps of this process).
rl::TrainResult train(const fs::path& dir, const rl::TrainOptions& o, int64_t stop_after = 0) {
  auto t = rl::Trainer::create(dir, o, recipe(), init_weights(), {});
  rl::TrainCallbacks cb;
  int64_t done = 0;
  if (stop_after > 0) cb.stop_requested = [&] { return ++done >= stop_after; };
  return t->run(cb);
}

TEST(RlAsyncRollout, StepKTrainsOnTheBatchOfVersionKMinus2) {
  TempDir tmp("versions");
  const rl::TrainResult r = train(tmp.path / "run", small_options(1));
  ASSERT_TRUE(r.finished);
  const std::vector<Json> rows = rows_of(tmp.path / "run");
  ASSERT_EQ(rows.size(), 6u);
  for (int64_t k = 1; k <= 5; ++k) {
    const Json& row = rows[size_t(k)];
    ASSERT_EQ(row["step"].get<int64_t>(), k);
    EXPECT_EQ(row["policy_version"].get<int64_t>(), k);
    EXPECT_EQ(row["rollout_policy_version"].get<int64_t>(), std::max<int64_t>(0, k - 2)) << k;
    EXPECT_EQ(row["policy_lag"].get<double>(), k == 1 ? 0.0 : 1.0) << k;
    EXPECT_TRUE(row.contains("time_rollout_gen_s")) << k;
    // Every evaluation reads version k (eval_every 1).
    EXPECT_TRUE(row.contains("eval_accuracy")) << k;
  }
  const Json meta = Json::parse(file_bytes(tmp.path / "run" / "run_meta.json"));
  EXPECT_EQ(meta["async_rollout"].get<int>(), 1);
  EXPECT_EQ(meta["options"]["async_rollout"].get<int>(), 1);
  // The last checkpoint has nothing pending.
  const Json state = Json::parse(file_bytes(tmp.path / "run" / "checkpoint" / "trainer.json"));
  EXPECT_TRUE(state["pending_rollout"].is_null());
  EXPECT_FALSE(fs::exists(tmp.path / "run" / "checkpoint" / "rollout.safetensors"));
}

TEST(RlAsyncRollout, FirstStepIsTheSynchronousRunsAndTheSecondIsNot) {
  TempDir tmp("sync");
  train(tmp.path / "async", small_options(1, 2));
  train(tmp.path / "sync", small_options(0, 2));
  const std::vector<Json> a = untimed(rows_of(tmp.path / "async")),
                          s = untimed(rows_of(tmp.path / "sync"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(s.size(), 3u);
  // Step 1 trains on version 0's batch either way (its evaluation reads version 1 in both).
  EXPECT_EQ(first_difference({a[0], a[1]}, {s[0], s[1]}), "");
  EXPECT_GT(a[1]["grad_norm"].get<double>(), 0.0);  // the policy moved
  // The synchronous run samples step 2's batch with version 1.
  EXPECT_EQ(s[2]["rollout_policy_version"].get<int64_t>(), 1);
  EXPECT_EQ(s[2]["policy_lag"].get<double>(), 0.0);
  EXPECT_EQ(a[2]["rollout_policy_version"].get<int64_t>(), 0);
  // The learner is the same at step 2 in both runs (version 1): its entropy over the batch tells
  // the two batches apart.
  EXPECT_NE(a[2]["entropy"], s[2]["entropy"]) << "the same batch twice?";
}

TEST(RlAsyncRollout, TwoRunsAndAResumedRunGiveTheSameBits) {
  TempDir tmp("bits");
  rl::TrainOptions replay = small_options(1, 6);
  replay.routing_replay = true;  // the stored batch carries the sampler's experts
  replay.minibatches = 2;
  replay.guard = "triage";
  for (const rl::TrainOptions& o : {small_options(1, 6), replay}) {
    const std::string tag = o.routing_replay ? "replay" : "plain";
    SCOPED_TRACE(tag);
    const fs::path a = tmp.path / (tag + "-a"), b = tmp.path / (tag + "-b");
    train(a, o);
    train(b, o);
    const fs::path resumed = tmp.path / (tag + "-resumed");
    // Stopped after 3 steps: the stop writes a checkpoint at step 3 with step 4's batch (sampled
    // by version 2, which the checkpoint does not hold).
    const rl::TrainResult first = train(resumed, o, 3);
    EXPECT_FALSE(first.finished);
    const Json state = Json::parse(file_bytes(resumed / "checkpoint" / "trainer.json"));
    EXPECT_EQ(state["step"].get<int64_t>(), 3);
    EXPECT_EQ(state["pending_rollout"]["step"].get<int64_t>(), 4);
    EXPECT_EQ(state["pending_rollout"]["policy_version"].get<int64_t>(), 2);
    EXPECT_TRUE(fs::exists(resumed / "checkpoint" / "rollout.safetensors"));
    {
      auto t = rl::Trainer::resume(resumed, {});
      EXPECT_EQ(t->step(), 3);
      EXPECT_TRUE(t->run().finished);
    }
    for (const fs::path& d : {b, resumed}) {
      EXPECT_EQ(first_difference(untimed(rows_of(d)), untimed(rows_of(a))), "") << d;
      for (const char* f : {"learner.safetensors", "learner.json"})
        EXPECT_EQ(file_bytes(d / "checkpoint" / f), file_bytes(a / "checkpoint" / f))
            << d << " " << f;
    }
  }
}

std::string resume_error(const fs::path& dir, const rl::ResumePlacement& where) {
  try {
    rl::Trainer::resume(dir, where);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(RlAsyncRollout, ResumeRefusesAnotherScheduleOrAMissingBatch) {
  TempDir tmp("refuse");
  const fs::path run = tmp.path / "run";
  train(run, small_options(1, 6), 2);  // checkpoint at step 2 with step 3's batch
  rl::ResumePlacement other;
  other.async_rollout = 0;
  EXPECT_NE(resume_error(run, other)
                .find("--async-rollout 0 differs from the run's "
                      "--async-rollout 1"),
            std::string::npos)
      << resume_error(run, other);
  rl::ResumePlacement same;
  same.async_rollout = 1;
  EXPECT_EQ(resume_error(run, same), "");
  // Without the stored batch the next step cannot be trained as the run would have.
  const std::string batch = file_bytes(run / "checkpoint" / "rollout.safetensors");
  fs::remove(run / "checkpoint" / "rollout.safetensors");
  EXPECT_NE(resume_error(run, {}).find("rollout.safetensors"), std::string::npos)
      << resume_error(run, {});
  {
    std::ofstream f(run / "checkpoint" / "rollout.safetensors", std::ios::binary);
    f << batch;
  }
  EXPECT_EQ(resume_error(run, {}), "");
  // A synchronous run's checkpoint is resumed as before and refuses --async-rollout 1.
  const fs::path sync = tmp.path / "sync";
  train(sync, small_options(0, 6), 2);
  rl::ResumePlacement one;
  one.async_rollout = 1;
  EXPECT_NE(resume_error(sync, one).find("--async-rollout 1 differs"), std::string::npos);
  EXPECT_EQ(resume_error(sync, {}), "");
}

TEST(RlAsyncRollout, StoredSamplesRoundTrip) {
  TempDir tmp("store");
  std::vector<model::SampleResult> s(3);
  s[0] = {{4, 5, 2}, {-0.5f, -1.25f, -3e-8f}, true, {1, 0, 3, 2, 0, 1}};
  s[1] = {{7}, {-0.0f}, false, {}};
  s[2] = {{9, 9, 9, 9}, {-1.0f, -2.0f, -4.0f, -8.0f}, false, {2, 3}};
  for (bool routed : {true, false}) {
    std::vector<model::SampleResult> in = s;
    if (!routed)
      for (auto& x : in) x.routing.clear();
    const fs::path f = tmp.path / (routed ? "routed.safetensors" : "plain.safetensors");
    rl::detail::save_rollout_samples(f, in);
    const std::vector<model::SampleResult> out = rl::detail::load_rollout_samples(f);
    ASSERT_EQ(out.size(), in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(out[i].tokens, in[i].tokens);
      EXPECT_EQ(out[i].eos, in[i].eos);
      EXPECT_EQ(out[i].routing, in[i].routing);
      ASSERT_EQ(out[i].logprobs.size(), in[i].logprobs.size());
      for (size_t t = 0; t < in[i].logprobs.size(); ++t)  // the bits, -0 included
        EXPECT_EQ(std::bit_cast<uint32_t>(out[i].logprobs[t]),
                  std::bit_cast<uint32_t>(in[i].logprobs[t]));
    }
  }
  EXPECT_THROW(rl::detail::load_rollout_samples(tmp.path / "none.safetensors"),
               std::invalid_argument);
}

TEST(RlAsyncRollout, AnErrorOfTheSamplingThreadReachesTheCaller) {
  rl::detail::RolloutThread thread;
  rl::detail::PendingRollout p(4, 2, thread, Device::cpu(), []() -> rl::RolloutBatch {
    throw std::domain_error("sampler: logits of request 3 are NaN");
  });
  for (int i = 0; i < 2; ++i) {  // again on every wait
    try {
      p.wait();
      ADD_FAILURE() << "no exception";
    } catch (const std::domain_error& e) {
      EXPECT_STREQ(e.what(), "sampler: logits of request 3 are NaN");
    }
  }
  EXPECT_EQ(p.step(), 4);
  EXPECT_EQ(p.policy_version(), 2);
  // A rollout nobody waits for is waited for by its destructor; the next one runs after it on
  // the same thread.
  std::thread::id first, second;
  {
    rl::detail::PendingRollout q(1, 0, thread, Device::cpu(), [&] {
      first = std::this_thread::get_id();
      return rl::RolloutBatch{};
    });
  }
  rl::detail::PendingRollout ok(2, 0, thread, Device::cpu(), [&] {
    second = std::this_thread::get_id();
    rl::RolloutBatch b;
    b.correct = 3;
    return b;
  });
  EXPECT_EQ(ok.wait().correct, 3);
  EXPECT_GE(ok.waited_s(), 0.0);
  EXPECT_EQ(first, second);
  EXPECT_NE(first, std::this_thread::get_id());
}

}  // namespace
}  // namespace lockstep
