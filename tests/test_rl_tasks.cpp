// Tests of the RL vocabulary and tasks: encode/decode, every built-in task's examples checked by
// an independent solver, Philox determinism (a pinned example per task), rewards, registry
// errors, and the measured overlap of the train and eval streams.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "lockstep/rl/task.h"

using namespace lockstep::rl;

namespace {

std::string digits_of(std::span<const int32_t> t) {
  std::string s;
  for (int32_t x : t) s += char('0' + digit_value(x));
  return s;
}

// Independent solvers working on the decoded prompt text.
std::string solve(const std::string& task, const std::string& prompt) {
  const size_t start = prompt.find('>', prompt.find('>') + 1) + 1;           // after "<bos><task>"
  const std::string body = prompt.substr(start, prompt.size() - start - 1);  // drop "="
  if (task == "add") {
    const size_t plus = body.find('+');
    const std::string a = body.substr(0, plus), b = body.substr(plus + 1);
    // schoolbook on strings, then reverse and pad to len + 1
    std::string sum;
    int carry = 0;
    for (size_t i = a.size(); i-- > 0;) {
      const int s = (a[i] - '0') + (b[i] - '0') + carry;
      sum += char('0' + s % 10);
      carry = s / 10;
    }
    sum += char('0' + carry);
    return sum;  // already least significant first
  }
  if (task == "sort") {
    std::string s = body;
    std::sort(s.begin(), s.end());
    return s;
  }
  if (task == "reverse") return std::string(body.rbegin(), body.rend());
  if (task == "count") {
    const char target = body[0];
    return std::to_string(std::count(body.begin() + 2, body.end(), target));
  }
  ADD_FAILURE() << "no solver for " << task;
  return "";
}

}  // namespace

TEST(RlVocab, SizeAndNames) {
  EXPECT_EQ(kVocabSize, 32);
  EXPECT_EQ(token_to_string(kPad), "<pad>");
  EXPECT_EQ(token_to_string(kSep), "=");
  EXPECT_EQ(token_to_string(digit_token(7)), "7");
  EXPECT_EQ(token_to_string(kTaskReverse), "<reverse>");
  EXPECT_EQ(token_to_string(25), "<reserved25>");
  EXPECT_THROW(token_to_string(32), std::out_of_range);
  EXPECT_THROW(token_to_string(-1), std::out_of_range);
  // Every printed name is distinct.
  std::vector<std::string> names;
  for (int32_t t = 0; t < kVocabSize; ++t) names.push_back(token_to_string(t));
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
}

TEST(RlVocab, EncodeDecodeRoundTrip) {
  const std::vector<int32_t> want = {kBos, kTaskAdd, 5, 6, kPlus, 7, 8, kSep};
  EXPECT_EQ(encode("<bos><add>12+34="), want);
  EXPECT_EQ(encode(" <bos> <add> 1 2 + 3 4 = "), want);
  EXPECT_EQ(decode(want), "<bos><add>12+34=");
  for (int32_t t = 0; t < kFirstReserved; ++t) {
    const std::vector<int32_t> one = {t};
    EXPECT_EQ(encode(decode(one)), one) << "token " << t;
  }
}

TEST(RlVocab, EncodeErrorsNameTheText) {
  try {
    encode("12x");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'x' at byte 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(encode("<bos"), std::invalid_argument);
  EXPECT_THROW(encode("<nope>"), std::invalid_argument);
  EXPECT_THROW(encode("<reserved20>"), std::invalid_argument);
  const std::vector<int32_t> bad = {1, 40};
  EXPECT_THROW(decode(bad), std::out_of_range);
}

TEST(RlTasks, RegistryListsBuiltinsAndNamesUnknown) {
  const std::vector<std::string> want = {"add", "count", "reverse", "sort"};
  EXPECT_EQ(task_names(), want);
  EXPECT_EQ(find_task("sort").name(), "sort");
  try {
    find_task("multiply");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown task 'multiply' (known: add, count, reverse, sort)");
  }
}

TEST(RlTasks, ExamplesAreSolvedByAnIndependentSolver) {
  for (const std::string& name : task_names()) {
    const Task& task = find_task(name);
    for (int d : {task.min_difficulty(), 2, 5, task.max_difficulty()})
      for (uint64_t i = 0; i < 200; ++i)
        for (Split split : {Split::kTrain, Split::kEval}) {
          const Example ex = task.make(42, i, d, split);
          const std::string prompt = decode(ex.prompt);
          ASSERT_EQ(digits_of(ex.answer), solve(name, prompt)) << name << " " << prompt;
          EXPECT_EQ(ex.prompt[0], kBos);
          EXPECT_EQ(ex.prompt[1], task.marker());
          EXPECT_EQ(ex.prompt.back(), kSep);
          EXPECT_EQ(ex.index, i);
          EXPECT_EQ(ex.difficulty, d);
          // Difficulty = operand digits (add) or string length (others).
          const size_t body = ex.prompt.size() - 3 - (name == "count" ? 2 : 0);
          EXPECT_EQ(body, name == "add" ? size_t(2 * d + 1) : size_t(d)) << prompt;
        }
  }
}

// The Philox stream is part of the contract of a run: these examples must never change.
TEST(RlTasks, PinnedExamples) {
  EXPECT_EQ(decode(find_task("add").make(1234, 0, 4).prompt), "<bos><add>3330+1725=");
  EXPECT_EQ(decode(find_task("sort").make(1234, 7, 6).prompt), "<bos><sort>198158=");
  EXPECT_EQ(decode(find_task("reverse").make(1234, 7, 6, Split::kEval).prompt),
            "<bos><reverse>161802=");
  EXPECT_EQ(decode(find_task("count").make(99, 3, 8).prompt), "<bos><count>4:26099696=");
}

TEST(RlTasks, SameSeedAndIndexSameExampleWhateverTheOrder) {
  const Task& task = find_task("add");
  std::vector<std::vector<int32_t>> forward, backward(50);
  for (uint64_t i = 0; i < 50; ++i) forward.push_back(task.make(7, i, 6).prompt);
  for (uint64_t i = 50; i-- > 0;) backward[i] = task.make(7, i, 6).prompt;
  EXPECT_EQ(forward, backward);
  EXPECT_NE(task.make(7, 0, 6).prompt, task.make(8, 0, 6).prompt);
  EXPECT_NE(task.make(7, 0, 6).prompt, task.make(7, 0, 6, Split::kEval).prompt);
  EXPECT_NE(task.make(7, 0, 6).prompt, task.make(7, uint64_t(1) << 32, 6).prompt);
}

TEST(RlTasks, DifficultyOutOfRangeThrows) {
  const Task& task = find_task("add");
  EXPECT_THROW(task.make(1, 0, 0), std::invalid_argument);
  EXPECT_THROW(task.make(1, 0, task.max_difficulty() + 1), std::invalid_argument);
  try {
    find_task("sort").make(1, 0, 33);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "task 'sort': difficulty 33 is outside [1, 32]");
  }
}

TEST(RlTasks, RewardIsExactMatchTerminatedByEos) {
  const Task& task = find_task("reverse");
  Example ex;
  ex.prompt = encode("<bos><reverse>123=");
  ex.answer = encode("321");
  EXPECT_EQ(task.reward(ex, encode("321<eos>")), 1.0f);
  EXPECT_EQ(task.reward(ex, encode("321<eos>55<pad>")), 1.0f);  // after <eos>: ignored
  EXPECT_EQ(task.reward(ex, encode("321")), 0.0f);              // not terminated
  EXPECT_EQ(task.reward(ex, encode("3215<eos>")), 0.0f);        // extra digit
  EXPECT_EQ(task.reward(ex, encode("32<eos>")), 0.0f);          // short
  EXPECT_EQ(task.reward(ex, encode("<eos>")), 0.0f);
  EXPECT_EQ(task.reward(ex, std::vector<int32_t>{}), 0.0f);
  EXPECT_EQ(task.reward(ex, encode("123<eos>")), 0.0f);
  EXPECT_EQ(
      task.reward(ex, std::vector<int32_t>{digit_token(3), digit_token(2), digit_token(1), 25}),
      0.0f);  // reserved id instead of <eos>
}

TEST(RlTasks, FormatRewardIsOffByDefault) {
  const Task& task = find_task("add");
  Example ex = task.make(3, 0, 2);
  std::vector<int32_t> wrong = ex.answer;
  wrong[0] = digit_token((digit_value(wrong[0]) + 1) % 10);
  wrong.push_back(kEos);
  std::vector<int32_t> right = ex.answer;
  right.push_back(kEos);
  EXPECT_EQ(reward_with_format(task, ex, wrong), 0.0f);
  EXPECT_EQ(reward_with_format(task, ex, wrong, 0.1f), 0.1f);
  EXPECT_EQ(reward_with_format(task, ex, right, 0.1f), 1.0f);
  EXPECT_EQ(reward_with_format(task, ex, encode("12+<eos>"), 0.1f), 0.0f);  // not digits
  EXPECT_EQ(reward_with_format(task, ex, encode("12"), 0.1f), 0.0f);        // no <eos>
  EXPECT_EQ(reward_with_format(task, ex, encode("<eos>"), 0.1f), 0.0f);     // empty
}

namespace {
class EchoTask final : public Task {
 public:
  std::string_view name() const override { return "test_echo"; }
  std::string_view description() const override { return "echo one digit"; }
  int32_t marker() const override { return kTaskAdd; }
  int min_difficulty() const override { return 1; }
  int max_difficulty() const override { return 1; }

 protected:
  Example generate(ExampleRng& rng, int) const override {
    Example ex;
    const int32_t d = digit_token(rng.digit());
    ex.prompt = {kBos, kTaskAdd, d, kSep};
    ex.answer = {d};
    return ex;
  }
};
class BrokenTask final : public Task {
 public:
  std::string_view name() const override { return "test_broken"; }
  std::string_view description() const override { return "forgets <bos>"; }
  int32_t marker() const override { return kTaskSort; }
  int min_difficulty() const override { return 1; }
  int max_difficulty() const override { return 1; }

 protected:
  Example generate(ExampleRng&, int) const override {
    return Example{{kTaskSort, digit_token(1), kSep}, {digit_token(1)}, 0, 0};
  }
};
}  // namespace

TEST(RlTasks, UserTasksRegisterAndAreChecked) {
  register_task(std::make_unique<EchoTask>());
  EXPECT_THROW(register_task(std::make_unique<EchoTask>()), std::invalid_argument);
  const Example ex = find_task("test_echo").make(5, 1, 1);
  EXPECT_EQ(ex.answer[0], ex.prompt[2]);
  register_task(std::make_unique<BrokenTask>());
  try {
    find_task("test_broken").make(5, 1, 1);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("must start with <bos>"), std::string::npos) << e.what();
  }
}

TEST(RlTasks, ExampleRngUniformIsUnbiasedEnough) {
  // 10000 digits: every digit count within 5 sigma of 1000 (sigma = 30).
  std::vector<int> counts(10, 0);
  for (uint64_t i = 0; i < 1000; ++i) {
    ExampleRng rng(11, kTrainStream, i);
    for (int j = 0; j < 10; ++j) ++counts[size_t(rng.digit())];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

// The held-out prompts are a disjoint part of the prompt space: no overlap at any difficulty, even
// where the training stream covers the whole training part (add with 1 digit: 100 prompts).
TEST(RlTasks, HeldOutPromptsAreNeverTrainingPrompts) {
  const Task& add = find_task("add");
  EXPECT_EQ(count_prompt_overlap(add, 2024, 1, 1000, 200), 0);
  EXPECT_EQ(count_prompt_overlap(add, 2024, 2, 10000, 1000), 0);
  EXPECT_EQ(count_prompt_overlap(find_task("sort"), 2024, 16, 2000, 500), 0);
  // Each split's prompts are in its part; both parts of the 1-digit space are non-empty and
  // together hold all 100 prompts.
  std::set<std::vector<int32_t>> train, eval;
  for (uint64_t i = 0; i < 2000; ++i) {
    const Example t = add.make(7, i, 1, Split::kTrain), e = add.make(7, i, 1, Split::kEval);
    EXPECT_FALSE(is_eval_prompt(t.prompt)) << decode(t.prompt);
    EXPECT_TRUE(is_eval_prompt(e.prompt)) << decode(e.prompt);
    train.insert(t.prompt);
    eval.insert(e.prompt);
  }
  EXPECT_GT(eval.size(), 5u);
  EXPECT_EQ(train.size() + eval.size(), 100u);
  std::printf("add d=1: %zu training and %zu held-out prompts\n", train.size(), eval.size());
}
