// The task machinery shared by every task (include/lockstep/rl/task.h): the per-example Philox
// stream, the checks on generated examples, the exact-match reward, and the task registry.
#include "lockstep/rl/task.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>

#include "lockstep/numerics/philox.h"

namespace lockstep::rl {

uint32_t split_stream(Split split) {
  switch (split) {
    case Split::kTrain:
      return kTrainStream;
    case Split::kValidation:
      return kValidationStream;
    case Split::kEval:
      return kEvalStream;
  }
  return kTrainStream;
}

std::string_view split_name(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kValidation:
      return "validation";
    case Split::kEval:
      return "heldout";
  }
  return "?";
}

Split parse_split(std::string_view name) {
  if (name == "heldout") return Split::kEval;
  if (name == "validation") return Split::kValidation;
  throw std::invalid_argument(fmt::format(
      "unknown evaluation split '{}' (known: heldout, validation; training prompts are never "
      "evaluated as held-out)",
      name));
}

Split split_of_canonical(std::span<const int32_t> canonical) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the tokens' little-endian bytes
  for (int32_t t : canonical)
    for (int b = 0; b < 4; ++b) h = (h ^ ((uint32_t(t) >> (8 * b)) & 0xFFu)) * 0x100000001B3ull;
  const uint64_t bucket = h % kSplitBuckets;
  return bucket < 2 ? Split::kEval : bucket == 2 ? Split::kValidation : Split::kTrain;
}

std::vector<int32_t> Task::canonical_form(std::span<const int32_t> prompt) const {
  return {prompt.begin(), prompt.end()};
}

int64_t Task::max_answer_tokens(int) const { return 0; }

ExampleRng::ExampleRng(uint64_t seed, uint32_t stream, uint64_t index)
    : seed_(seed), stream_(stream), index_(index) {}

void ExampleRng::refill() {
  const num::Philox4x32 ctr{{uint32_t(index_), uint32_t(index_ >> 32), stream_, block_}};
  const num::Philox4x32 out = num::philox4x32_10(ctr, uint32_t(seed_), uint32_t(seed_ >> 32));
  for (int i = 0; i < 4; ++i) words_[i] = out.v[i];
  ++block_;
  next_ = 0;
}

uint32_t ExampleRng::next_u32() {
  if (next_ == 4) refill();
  return words_[next_++];
}

uint32_t ExampleRng::uniform(uint32_t n) {
  if (n == 0) throw std::invalid_argument("ExampleRng::uniform: n must be >= 1");
  // Accept words below the largest multiple of n that fits in 2^32.
  const uint64_t limit = (uint64_t(1) << 32) - ((uint64_t(1) << 32) % n);
  for (;;) {
    const uint32_t w = next_u32();
    if (w < limit) return w % n;
  }
}

void Task::check_example(const Example& ex, uint64_t seed) const {
  const uint64_t index = ex.index;
  const int difficulty = ex.difficulty;
  const auto fail = [&](const std::string& rule) {
    throw std::invalid_argument(
        fmt::format("task '{}' generated a bad example (seed {}, index {}, "
                    "difficulty {}): {}; prompt \"{}\"",
                    name(), seed, index, difficulty, rule, decode(ex.prompt)));
  };
  for (int32_t t : ex.prompt)
    if (t < 0 || t >= kFirstReserved || t == kPad)
      fail(fmt::format("prompt token {} is not usable", t));
  for (int32_t t : ex.answer)
    if (t < 0 || t >= kFirstReserved || t == kPad || t == kBos || t == kEos)
      fail(fmt::format("answer token {} is not usable", t));
  if (ex.prompt.size() < 3 || ex.prompt[0] != kBos || ex.prompt[1] != marker())
    fail("the prompt must start with <bos> and the task marker");
  if (ex.prompt.back() != kSep) fail("the prompt must end with '='");
  if (ex.answer.empty()) fail("the answer is empty");
}

Example Task::make(uint64_t seed, uint64_t index, int difficulty, Split split) const {
  if (difficulty < min_difficulty() || difficulty > max_difficulty())
    throw std::invalid_argument(fmt::format("task '{}': difficulty {} is outside [{}, {}]", name(),
                                            difficulty, min_difficulty(), max_difficulty()));
  // Draws until the prompt falls in the requested part of the held-out partition; the words of
  // one example's stream are consumed in order, so the result depends on (seed, split, index).
  // Every draw is checked, so a broken generate() is named whichever part it lands in.
  ExampleRng rng(seed, split_stream(split), index);
  Example ex;
  for (int attempt = 0;; ++attempt) {
    ex = generate(rng, difficulty);
    ex.index = index;
    ex.difficulty = difficulty;
    check_example(ex, seed);
    if (split_of(ex.prompt) == split) break;
    if (attempt == kMaxSplitDraws)
      throw std::invalid_argument(fmt::format(
          "task '{}' at difficulty {}: no {} prompt in {} draws (the problem space is too small "
          "for held-out and validation parts; use a larger difficulty)",
          name(), difficulty, split_name(split), kMaxSplitDraws));
  }
  return ex;
}

float Task::reward(const Example& ex, std::span<const int32_t> response) const {
  const size_t n = ex.answer.size();
  if (response.size() < n + 1 || response[n] != kEos) return 0.0f;
  return std::equal(ex.answer.begin(), ex.answer.end(), response.begin()) ? 1.0f : 0.0f;
}

bool Task::well_formed(const Example&, std::span<const int32_t> response) const {
  const auto eos = std::find(response.begin(), response.end(), int32_t(kEos));
  if (eos == response.end() || eos == response.begin()) return false;
  return std::all_of(response.begin(), eos, [](int32_t t) { return is_digit_token(t); });
}

float reward_with_format(const Task& task, const Example& ex, std::span<const int32_t> response,
                         float format_bonus) {
  const float r = task.reward(ex, response);
  if (r != 0.0f || format_bonus == 0.0f) return r;
  return task.well_formed(ex, response) ? format_bonus : 0.0f;
}

float prefix_credit(const Task& task, const Example& ex, std::span<const int32_t> response) {
  if (task.reward(ex, response) == 1.0f) return 1.0f;
  const auto eos = std::find(response.begin(), response.end(), int32_t(kEos));
  if (eos == response.end()) return 0.0f;  // reached the token limit
  // Answer tokens matched before the first <eos> or the first difference. A wrong answer never
  // reaches 1: the full answer followed by anything but <eos> scores answer / (answer + 1).
  const size_t before_eos = size_t(eos - response.begin());
  size_t common = 0;
  while (common < before_eos && common < ex.answer.size() && response[common] == ex.answer[common])
    ++common;
  return float(common) / float(ex.answer.size() + 1);
}

std::string_view reward_kind_name(RewardKind k) {
  return k == RewardKind::kExact ? "exact" : "prefix";
}

RewardKind parse_reward_kind(std::string_view name) {
  if (name == "exact") return RewardKind::kExact;
  if (name == "prefix") return RewardKind::kPrefix;
  throw std::invalid_argument(fmt::format("unknown reward '{}' (known: exact, prefix)", name));
}

float task_reward(const Task& task, const Example& ex, std::span<const int32_t> response,
                  RewardKind kind, float format_bonus) {
  return kind == RewardKind::kPrefix ? prefix_credit(task, ex, response)
                                     : reward_with_format(task, ex, response, format_bonus);
}

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<Task>> tasks;
};

// The built-in tasks, in registry order.
std::vector<std::unique_ptr<Task>> builtin_tasks() {
  std::vector<std::unique_ptr<Task>> v;
  v.push_back(make_add_task());
  v.push_back(make_sort_task());
  v.push_back(make_reverse_task());
  v.push_back(make_count_task());
  v.push_back(make_cumsum_task());
  return v;
}

Registry& registry() {
  static Registry r{{}, builtin_tasks()};
  return r;
}

std::string joined_names(const std::vector<std::unique_ptr<Task>>& tasks) {
  std::vector<std::string> names;
  for (const auto& t : tasks) names.emplace_back(t->name());
  std::sort(names.begin(), names.end());
  std::string joined;
  for (const std::string& n : names) joined.append(joined.empty() ? "" : ", ").append(n);
  return joined;
}

}  // namespace

const Task& find_task(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& t : r.tasks)
    if (t->name() == name) return *t;
  throw std::invalid_argument(
      fmt::format("unknown task '{}' (known: {})", name, joined_names(r.tasks)));
}

std::vector<std::string> task_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& t : r.tasks) names.emplace_back(t->name());
  std::sort(names.begin(), names.end());
  return names;
}

void register_task(std::unique_ptr<Task> task) {
  if (!task) throw std::invalid_argument("register_task: null task");
  if (task->name().empty()) throw std::invalid_argument("register_task: a task needs a name");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& t : r.tasks)
    if (t->name() == task->name())
      throw std::invalid_argument(
          fmt::format("register_task: task '{}' is already registered", task->name()));
  r.tasks.push_back(std::move(task));
}

int64_t count_prompt_overlap(const Task& task, uint64_t seed, int difficulty, int64_t n_train,
                             int64_t n_eval, Split eval) {
  std::set<std::vector<int32_t>> train;
  for (int64_t i = 0; i < n_train; ++i)
    train.insert(
        task.canonical_form(task.make(seed, uint64_t(i), difficulty, Split::kTrain).prompt));
  int64_t overlap = 0;
  for (int64_t i = 0; i < n_eval; ++i)
    overlap +=
        train.count(task.canonical_form(task.make(seed, uint64_t(i), difficulty, eval).prompt)) > 0;
  return overlap;
}

}  // namespace lockstep::rl
