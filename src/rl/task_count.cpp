// The `count` task: how many times a given digit occurs in a digit string. Difficulty = string
// length; the target digit and the string's digits are drawn uniformly and independently.
#include <algorithm>
#include <string>

#include "lockstep/rl/task.h"

namespace lockstep::rl {
namespace {

class CountTask final : public Task {
 public:
  std::string_view name() const override { return "count"; }
  std::string_view description() const override {
    return "count the occurrences of a digit in a string of difficulty digits";
  }
  int32_t marker() const override { return kTaskCount; }
  int min_difficulty() const override { return 1; }
  int max_difficulty() const override { return 32; }
  int64_t max_answer_tokens(int n) const override { return int64_t(std::to_string(n).size()); }

  // The count does not depend on the order of the string: the canonical form keeps the target
  // and sorts the string's digits.
  std::vector<int32_t> canonical_form(std::span<const int32_t> prompt) const override {
    std::vector<int32_t> c(prompt.begin(), prompt.end());
    if (c.size() >= 5) std::sort(c.begin() + 4, c.end() - 1);
    return c;
  }

 protected:
  // Prompt: <bos> <count> t : s_1 .. s_n =   Answer: the count of t among s_1..s_n in decimal,
  // most significant digit first, no leading zeros ("0" when absent).
  Example generate(ExampleRng& rng, int n) const override {
    Example ex;
    const int target = rng.digit();
    ex.prompt = {kBos, kTaskCount, digit_token(target), kColon};
    int count = 0;
    for (int i = 0; i < n; ++i) {
      const int x = rng.digit();
      count += x == target;
      ex.prompt.push_back(digit_token(x));
    }
    ex.prompt.push_back(kSep);
    for (char c : std::to_string(count)) ex.answer.push_back(digit_token(c - '0'));
    return ex;
  }
};

}  // namespace

std::unique_ptr<Task> make_count_task() { return std::make_unique<CountTask>(); }

}  // namespace lockstep::rl
