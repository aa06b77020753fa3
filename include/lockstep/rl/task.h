// RL tasks: the interface a task implements (a prompt generator and a verifier), the example it
// produces, its deterministic random source, and the registry the CLI and trainer look names up
// in. The built-in tasks (add, sort, reverse, count, cumsum) are defined in docs/rl.md, "Tasks".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/rl/vocab.h"

namespace lockstep::rl {

// The parts of a task's problem space. A problem's part is decided by a hash of its canonical
// form (Task::canonical_form: one representative of all prompts that pose the same problem, e.g.
// the unordered operand pair for `add`, the multiset for `sort`), whatever the seed, so no
// held-out or validation problem has an equivalent in training:
//   h = FNV-1a 64 of the canonical form's tokens; h % 10 in {0, 1}: held-out (kEval, 20 %),
//   h % 10 == 2: validation (kValidation, 10 %), else training (kTrain, 70 %).
// Training prompts (and the warm start's) come from the train part, the reported held-out
// accuracy from the held-out part, and choosing defaults uses the validation part only.
// Each split draws from its own Philox stream id under the same seed; Task::make draws until the
// prompt falls in its part.
enum class Split { kTrain, kValidation, kEval };
constexpr uint32_t kTrainStream = 0x524C0001u;       // "RL" 1
constexpr uint32_t kEvalStream = 0x524C0002u;        // "RL" 2
constexpr uint32_t kValidationStream = 0x524C0004u;  // "RL" 4 ("RL" 3 is the rollout seed)
constexpr uint64_t kSplitBuckets = 10;               // h % 10 picks the part (see above)
constexpr int kMaxSplitDraws = 4096;                 // draws before a too-small space is refused
uint32_t split_stream(Split split);
std::string_view split_name(Split split);  // "train", "validation", "heldout"
Split parse_split(std::string_view name);  // "validation" or "heldout" (throws otherwise)
// The part a canonical form belongs to.
Split split_of_canonical(std::span<const int32_t> canonical);

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

  // The task's canonical form of a prompt: equal for exactly the prompts that pose the same
  // problem (by default the prompt itself). The split is a function of it (split_of).
  virtual std::vector<int32_t> canonical_form(std::span<const int32_t> prompt) const;
  Split split_of(std::span<const int32_t> prompt) const {
    return split_of_canonical(canonical_form(prompt));
  }

  // The longest reference answer at this difficulty (tokens, <eos> not counted), so a run can
  // refuse a --max-new that cannot hold it; 0 when the task does not say.
  virtual int64_t max_answer_tokens(int difficulty) const;

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

// Partial credit for long answers: 1 when reward() is 1; otherwise, for a response with an <eos>,
// the length of the longest common prefix of the response (up to and including its first <eos>)
// and answer + <eos>, divided by answer + 1 tokens; 0 for a response without <eos> (it reached
// the token limit: scored as wrong whatever it wrote). Always < 1 for a wrong answer.
float prefix_credit(const Task& task, const Example& ex, std::span<const int32_t> response);

// How a run turns a response into its reward: exact match (reward_with_format with the format
// bonus) or prefix credit.
enum class RewardKind { kExact, kPrefix };
std::string_view reward_kind_name(RewardKind k);  // "exact", "prefix"
RewardKind parse_reward_kind(std::string_view name);
float task_reward(const Task& task, const Example& ex, std::span<const int32_t> response,
                  RewardKind kind, float format_bonus = 0.0f);

// Registry. find_task throws std::invalid_argument "unknown task 'x' (known: add, count, ...)".
const Task& find_task(std::string_view name);
std::vector<std::string> task_names();  // sorted
// Adds a user task; throws std::invalid_argument when its name is empty or already registered.
void register_task(std::unique_ptr<Task> task);

// How many of the first n_eval prompts of split `eval` have the canonical form of one of the first
// n_train training prompts (same seed and difficulty): 0 by construction, reported in
// run_meta.json so a reader sees it measured.
int64_t count_prompt_overlap(const Task& task, uint64_t seed, int difficulty, int64_t n_train,
                             int64_t n_eval, Split eval = Split::kEval);

// Factories of the built-in tasks (src/rl/task_*.cpp).
std::unique_ptr<Task> make_add_task();
std::unique_ptr<Task> make_sort_task();
std::unique_ptr<Task> make_reverse_task();
std::unique_ptr<Task> make_count_task();
std::unique_ptr<Task> make_cumsum_task();

}  // namespace lockstep::rl
