// Tests of the RL vocabulary and tasks: encode/decode, every built-in task's examples checked by
// an independent solver, Philox determinism (a pinned example per task), rewards (exact, format,
// prefix credit), registry errors, and the split: canonical forms against independently built
// equivalents, and no held-out or validation problem with an equivalent in training, for every
// task and difficulty.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

#include "lockstep/rl/task.h"
#include "test_util.h"

using namespace lockstep::rl;

namespace {

// The answer as text: digits, and "=" / "+" where the cumsum task writes them.
std::string digits_of(std::span<const int32_t> t) { return decode(t); }

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
  if (task == "cumsum") {
    // Steps "x=sss" joined by "+": the running total as a 3-digit string, least significant
    // digit first, built by decimal string arithmetic (no integer sum kept).
    std::string total = "000", out;
    for (char c : body) {
      int carry = c - '0';
      for (char& d : total) {  // total[0] is the ones digit
        const int v = (d - '0') + carry;
        d = char('0' + v % 10);
        carry = v / 10;
      }
      if (carry != 0) ADD_FAILURE() << "cumsum overflow in " << body;
      if (!out.empty()) out += '+';
      out += std::string(1, c) + "=" + total;
    }
    return out;
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
  EXPECT_THROW(encode("<reserved21>"), std::invalid_argument);
  const std::vector<int32_t> bad = {1, 40};
  EXPECT_THROW(decode(bad), std::out_of_range);
}

TEST(RlTasks, RegistryListsBuiltinsAndNamesUnknown) {
  const std::vector<std::string> want = {"add", "count", "cumsum", "reverse", "sort"};
  EXPECT_EQ(task_names(), want);
  EXPECT_EQ(find_task("sort").name(), "sort");
  try {
    find_task("multiply");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown task 'multiply' (known: add, count, cumsum, reverse, sort)");
  }
}

TEST(RlTasks, ExamplesAreSolvedByAnIndependentSolver) {
  for (const std::string& name : task_names()) {
    const Task& task = find_task(name);
    for (int d : {task.min_difficulty(), 2, 5, 11, task.max_difficulty()})
      for (uint64_t i = 0; i < 200; ++i)
        for (Split split : {Split::kTrain, Split::kValidation, Split::kEval}) {
          if (d < task.min_difficulty() || d > task.max_difficulty()) continue;
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
          EXPECT_LE(int64_t(ex.answer.size()), task.max_answer_tokens(d)) << prompt;
          if (name != "count") {
            EXPECT_EQ(int64_t(ex.answer.size()), task.max_answer_tokens(d));
          }
        }
  }
}

// The Philox stream is part of the contract of a run: these examples must never change.
TEST(RlTasks, PinnedExamples) {
  EXPECT_EQ(decode(find_task("add").make(1234, 0, 4).prompt), "<bos><add>3330+1725=");
  EXPECT_EQ(decode(find_task("sort").make(1234, 7, 6).prompt), "<bos><sort>198158=");
  EXPECT_EQ(decode(find_task("reverse").make(1234, 7, 6, Split::kEval).prompt),
            "<bos><reverse>452534=");
  EXPECT_EQ(decode(find_task("count").make(99, 3, 8).prompt), "<bos><count>2:47578201=");
  EXPECT_EQ(decode(find_task("cumsum").make(5, 2, 4, Split::kValidation).prompt),
            "<bos><cumsum>0889=");
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
    find_task("sort").make(1, 0, 257);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "task 'sort': difficulty 257 is outside [1, 256]");
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

namespace {

// Prompt text with the operands of an add prompt swapped (built on the text, not by the task).
std::string swap_operands(const std::string& prompt) {
  const size_t start = std::string("<bos><add>").size();
  const size_t plus = prompt.find('+'), eq = prompt.size() - 1;
  return "<bos><add>" + prompt.substr(plus + 1, eq - plus - 1) + "+" +
         prompt.substr(start, plus - start) + "=";
}

// The digits of a prompt's body shuffled by g (Fisher-Yates), keeping `keep` leading body tokens.
std::vector<int32_t> shuffled_body(std::vector<int32_t> p, size_t head, std::mt19937_64& g) {
  for (size_t i = p.size() - 2; i > head; --i) {
    const size_t j = head + size_t(g() % (i - head + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

// Prompts equivalent to `prompt` under the task's own equivalence, built independently of
// Task::canonical_form: add swaps the operands, sort and count permute the string, reverse reverses
// it; cumsum has no equivalent but itself.
std::vector<std::vector<int32_t>> equivalents(const std::string& task,
                                              const std::vector<int32_t>& prompt,
                                              std::mt19937_64& g) {
  std::vector<std::vector<int32_t>> out = {prompt};
  if (task == "add") out.push_back(encode(swap_operands(decode(prompt))));
  if (task == "sort")
    for (int k = 0; k < 3; ++k) out.push_back(shuffled_body(prompt, 2, g));
  if (task == "count")
    for (int k = 0; k < 3; ++k) out.push_back(shuffled_body(prompt, 4, g));
  if (task == "reverse") {
    std::vector<int32_t> r = prompt;
    std::reverse(r.begin() + 2, r.end() - 1);
    out.push_back(r);
  }
  return out;
}

// Whether two prompts pose the same problem, decided from the text alone.
bool same_problem(const std::string& task, const std::string& a, const std::string& b) {
  if (task == "add") return a == b || a == swap_operands(b);
  if (task == "sort" || task == "count") {
    std::string x = a, y = b;
    const size_t head =
        task == "sort" ? std::string("<bos><sort>").size() : std::string("<bos><count>").size() + 2;
    std::sort(x.begin() + long(head), x.end() - 1);
    std::sort(y.begin() + long(head), y.end() - 1);
    return x.substr(0, head) == y.substr(0, head) && x == y;
  }
  if (task == "reverse") {
    const size_t head = std::string("<bos><reverse>").size();
    std::string r = b;
    std::reverse(r.begin() + long(head), r.end() - 1);
    return a == b || a == r;
  }
  return a == b;
}

// The built-in tasks (user tasks registered by other tests are not these tests' subject).
const std::vector<std::string> kBuiltins = {"add", "count", "cumsum", "reverse", "sort"};

}  // namespace

// Canonical forms name exactly the equivalence classes: equal for equivalent prompts, different
// otherwise (add with one digit: all 100 x 100 pairs of prompts; the others on random pairs and
// on built equivalents).
TEST(RlTasks, CanonicalFormsAreTheEquivalenceClasses) {
  const uint64_t seed = lockstep::test::test_seed();
  std::mt19937_64 g(seed);
  const Task& add = find_task("add");
  std::vector<std::vector<int32_t>> all;
  for (int a = 0; a < 10; ++a)
    for (int b = 0; b < 10; ++b) all.push_back(encode(fmt::format("<bos><add>{}+{}=", a, b)));
  for (const auto& x : all)
    for (const auto& y : all)
      ASSERT_EQ(add.canonical_form(x) == add.canonical_form(y),
                same_problem("add", decode(x), decode(y)))
          << decode(x) << " vs " << decode(y);
  for (const std::string& name : kBuiltins) {
    const Task& task = find_task(name);
    for (int d : {task.min_difficulty(), task.min_difficulty() + 1, 3, 8}) {
      if (d > task.max_difficulty()) continue;
      for (uint64_t i = 0; i < 100; ++i) {
        const Example x = task.make(seed, i, d), y = task.make(seed, i + 1000, d, Split::kEval);
        for (const auto& e : equivalents(name, x.prompt, g))
          ASSERT_EQ(task.canonical_form(e), task.canonical_form(x.prompt))
              << name << ": " << decode(e) << " vs " << decode(x.prompt) << "; seed " << seed;
        ASSERT_EQ(task.canonical_form(x.prompt) == task.canonical_form(y.prompt),
                  same_problem(name, decode(x.prompt), decode(y.prompt)))
            << name << ": " << decode(x.prompt) << " vs " << decode(y.prompt);
      }
    }
  }
}

// The split is a function of the problem: every example is in its split's part, every
// equivalent of it too, and no validation or held-out problem has an equivalent among the
// training examples, for every task and every difficulty.
TEST(RlTasks, HeldOutAndValidationProblemsAreNeverTrainingProblems) {
  const uint64_t seed = lockstep::test::test_seed();
  std::mt19937_64 g(seed);
  for (const std::string& name : kBuiltins) {
    const Task& task = find_task(name);
    for (int d = task.min_difficulty(); d <= task.max_difficulty(); ++d) {
      const int64_t n = d <= 3 ? 400 : 40;  // small spaces: cover them
      std::map<Split, std::set<std::vector<int32_t>>> forms;
      for (Split split : {Split::kTrain, Split::kValidation, Split::kEval})
        for (int64_t i = 0; i < n; ++i) {
          const Example ex = task.make(seed, uint64_t(i), d, split);
          for (const auto& e : equivalents(name, ex.prompt, g))
            ASSERT_EQ(task.split_of(e), split)
                << name << " d " << d << ": " << decode(e) << " (equivalent of "
                << decode(ex.prompt) << "); seed " << seed;
          forms[split].insert(task.canonical_form(ex.prompt));
        }
      for (const auto& f : forms[Split::kEval]) {
        ASSERT_EQ(forms[Split::kTrain].count(f), 0u) << name << " d " << d;
        ASSERT_EQ(forms[Split::kValidation].count(f), 0u) << name << " d " << d;
      }
      for (const auto& f : forms[Split::kValidation])
        ASSERT_EQ(forms[Split::kTrain].count(f), 0u) << name << " d " << d;
      ASSERT_EQ(count_prompt_overlap(task, seed, d, n, n), 0) << name << " d " << d;
      ASSERT_EQ(count_prompt_overlap(task, seed, d, n, n, Split::kValidation), 0)
          << name << " d " << d;
    }
  }
  // add with one digit: 55 problems (unordered pairs); training holds only its part of them.
  const Task& add = find_task("add");
  std::set<std::vector<int32_t>> train, eval;
  for (uint64_t i = 0; i < 2000; ++i) {
    train.insert(add.canonical_form(add.make(7, i, 1, Split::kTrain).prompt));
    eval.insert(add.canonical_form(add.make(7, i, 1, Split::kEval).prompt));
  }
  EXPECT_GT(eval.size(), 5u);
  EXPECT_LT(train.size() + eval.size(), 55u);
  std::printf("add d=1: %zu training and %zu held-out problems of 55\n", train.size(), eval.size());
}

TEST(RlTasks, CumsumVerifierAndPrefixCredit) {
  const Task& task = find_task("cumsum");
  Example ex;
  ex.prompt = encode("<bos><cumsum>395=");
  ex.answer = encode("3=300+9=210+5=710");
  EXPECT_EQ(task.reward(ex, encode("3=300+9=210+5=710<eos>")), 1.0f);
  EXPECT_EQ(prefix_credit(task, ex, encode("3=300+9=210+5=710<eos>")), 1.0f);
  // 6 of 17 answer tokens right, then a wrong digit: 6 / 18.
  EXPECT_EQ(prefix_credit(task, ex, encode("3=300+8=110+5=610<eos>")), 6.0f / 18.0f);
  // No <eos>: it reached the limit, wrong whatever it wrote.
  EXPECT_EQ(prefix_credit(task, ex, encode("3=300+9=210+5=710")), 0.0f);
  // The whole answer then more: never 1.
  EXPECT_EQ(prefix_credit(task, ex, encode("3=300+9=210+5=7100<eos>")), 17.0f / 18.0f);
  EXPECT_EQ(prefix_credit(task, ex, encode("<eos>")), 0.0f);
  // Format: the shape of the answer with other digits is well formed; other shapes are not.
  EXPECT_EQ(reward_with_format(task, ex, encode("1=100+1=200+1=300<eos>"), 0.25f), 0.25f);
  EXPECT_EQ(reward_with_format(task, ex, encode("1=100+1=200+1=30<eos>"), 0.25f), 0.0f);
  EXPECT_EQ(reward_with_format(task, ex, encode("1=100+1=200+1+300<eos>"), 0.25f), 0.0f);
  EXPECT_EQ(task_reward(task, ex, encode("3=300+8<eos>"), RewardKind::kPrefix), 6.0f / 18.0f);
  EXPECT_EQ(task_reward(task, ex, encode("3=300+8<eos>"), RewardKind::kExact), 0.0f);
  // Answers of 64 to 256 tokens: 6 d - 1.
  EXPECT_EQ(task.max_answer_tokens(11), 65);
  EXPECT_EQ(task.max_answer_tokens(42), 251);
  EXPECT_EQ(int64_t(task.make(3, 0, 42).answer.size()), 251);
  EXPECT_EQ(parse_reward_kind("prefix"), RewardKind::kPrefix);
  EXPECT_THROW(parse_reward_kind("partial"), std::invalid_argument);
}
