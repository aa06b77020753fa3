// RL tasks: the interface a task implements (a prompt generator and a verifier), the example it
// produces, its deterministic random source, and the registry the CLI and trainer look names up
// in. The built-in tasks (add, sort, reverse, count) are defined in docs/rl.md, "Tasks".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/rl/vocab.h"

namespace lockstep::rl {

// Which example stream: training prompts and the held-out evaluation prompts come from two
// different Philox stream ids (kTrainStream, kEvalStream) under the same seed, and from two
// disjoint parts of the prompt space: a prompt is held out iff is_eval_prompt() (a hash of its
// tokens, 1 in kEvalShare), whatever the seed. Task::make draws until the prompt falls in its
// part, so no held-out prompt is ever a training prompt, even where the space is small (add with
// 1 digit has 100 prompts: about 20 are held out).
enum class Split { kTrain, kEval };
constexpr uint32_t kTrainStream = 0x524C0001u;  // "RL" 1
constexpr uint32_t kEvalStream = 0x524C0002u;   // "RL" 2
constexpr uint64_t kEvalShare = 5;               // 1 prompt in 5 is held out
constexpr int kMaxSplitDraws = 4096;             // draws before a too-small space is refused
uint32_t split_stream(Split split);
bool is_eval_prompt(std::span<const int32_t> prompt);

// One prompt and its reference answer.
struct Example {
  std::vector<int32_t> prompt;  // <bos> <task marker> ... "=": what the policy conditions on
  std::vector<int32_t> answer;  // the reference answer, without the terminating <eos>
  uint64_t index = 0;           // the example index it was generated from
  int difficulty = 0;
};

// Deterministic random words for one example: Philox4x32-10 with key = (seed low, seed high)
// and counter = (index low, index high, stream id, block), block = 0, 1, 2, ...; each call to
// philox gives four words, consumed in order. The same (seed, stream, index) therefore yields the
// same words on every machine and in every thread, whatever other examples are generated.
class ExampleRng {
 public:
  ExampleRng(uint64_t seed, uint32_t stream, uint64_t index);
  uint32_t next_u32();
  // Uniform integer in [0, n), n >= 1, by rejection (no modulo bias).
  uint32_t uniform(uint32_t n);
  int digit() { return int(uniform(10)); }

 private:
  void refill();
  uint64_t seed_;
  uint32_t stream_;
  uint64_t index_;
  uint32_t block_ = 0;
  uint32_t words_[4] = {0, 0, 0, 0};
  int next_ = 4;
};

// A task. To add one: derive from Task in one file (see src/rl/task_add.cpp), implement name,
// description, marker, the difficulty range and generate(), and register it (register_task, or
// add its factory to builtin_tasks() in src/rl/task.cpp for a built-in).
class Task {
 public:
  virtual ~Task() = default;
  virtual std::string_view name() const = 0;         // registry key, e.g. "add"
  virtual std::string_view description() const = 0;  // one line for --help and docs
  virtual int32_t marker() const = 0;                // the task marker token (prompt[1])
  virtual int min_difficulty() const = 0;
  virtual int max_difficulty() const = 0;

  // The example for (seed, index, difficulty) in the given split: builds the ExampleRng of
  // (seed, split_stream(split), index), calls generate(), and checks the result (prompt starts
  // with <bos> and marker() and ends with "=", answer non-empty, every token in [0, kFirstReserved)
  // and no <pad>/<bos>/<eos> in the answer). Throws std::invalid_argument naming the task and the
  // rule broken, including a difficulty outside [min_difficulty, max_difficulty].
  Example make(uint64_t seed, uint64_t index, int difficulty, Split split = Split::kTrain) const;

  // 1 for a correct answer, else 0. The response is the sampled continuation of the prompt; it
  // is correct when its tokens up to and including the first <eos> are exactly the reference
  // answer followed by <eos>. Tokens after that <eos> are ignored (the sampler stops there); a
  // response without <eos> scores 0. A task may override this for answers with several correct
  // forms; the built-ins accept only the reference.
  virtual float reward(const Example& ex, std::span<const int32_t> response) const;

  // Whether the response has the answer's shape (by default: at least one token before the first
  // <eos>, all of them digits). Used only by reward_with_format().
  virtual bool well_formed(const Example& ex, std::span<const int32_t> response) const;

 protected:
  // Fills prompt and answer from rng; difficulty is already range-checked.
  virtual Example generate(ExampleRng& rng, int difficulty) const = 0;

 private:
  // Throws std::invalid_argument naming the task, seed, index and rule for an example whose
  // tokens or shape break the vocabulary's rules.
  void check_example(const Example& ex, uint64_t seed) const;
};

// Optional format shaping, off by default: reward() when it is 1, else format_bonus when the
// response is well_formed(), else 0. With format_bonus = 0 (the default) this equals reward().
// A bonus in (0, 1) rewards producing digits and stopping, which can help a randomly initialised
// policy find <eos>; it also pays for wrong answers, so keep it small and report it.
float reward_with_format(const Task& task, const Example& ex, std::span<const int32_t> response,
                         float format_bonus = 0.0f);

// Registry. find_task throws std::invalid_argument "unknown task 'x' (known: add, count, ...)".
const Task& find_task(std::string_view name);
std::vector<std::string> task_names();  // sorted
// Adds a user task; throws std::invalid_argument when its name is empty or already registered.
void register_task(std::unique_ptr<Task> task);

// How many of the first n_eval evaluation prompts equal one of the first n_train training
// prompts (same seed and difficulty). Used to report the held-out set's overlap with training.
int64_t count_prompt_overlap(const Task& task, uint64_t seed, int difficulty, int64_t n_train,
                             int64_t n_eval);

// Factories of the built-in tasks (src/rl/task_*.cpp).
std::unique_ptr<Task> make_add_task();
std::unique_ptr<Task> make_sort_task();
std::unique_ptr<Task> make_reverse_task();
std::unique_ptr<Task> make_count_task();

}  // namespace lockstep::rl
