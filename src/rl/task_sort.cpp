// The `sort` task: sort a digit string in ascending order. Difficulty = string length (up to 256,
// long answers); digits are drawn uniformly (repeats allowed). One problem per multiset.
#include <algorithm>

#include "lockstep/rl/task.h"

namespace lockstep::rl {
namespace {

class SortTask final : public Task {
 public:
  std::string_view name() const override { return "sort"; }
  std::string_view description() const override {
    return "sort a string of difficulty digits in ascending order";
  }
  int32_t marker() const override { return kTaskSort; }
  int min_difficulty() const override { return 1; }
  int max_difficulty() const override { return 256; }
  int64_t max_answer_tokens(int n) const override { return n; }

  // Every ordering of one multiset is the same problem: the canonical form is the prompt with
  // its digits sorted (the answer itself, framed).
  std::vector<int32_t> canonical_form(std::span<const int32_t> prompt) const override {
    std::vector<int32_t> c(prompt.begin(), prompt.end());
    if (c.size() >= 3) std::sort(c.begin() + 2, c.end() - 1);
    return c;
  }

 protected:
  // Prompt: <bos> <sort> s_1 .. s_n =   Answer: the n digits in ascending order.
  Example generate(ExampleRng& rng, int n) const override {
    Example ex;
    ex.prompt = {kBos, kTaskSort};
    for (int i = 0; i < n; ++i) ex.prompt.push_back(digit_token(rng.digit()));
    ex.answer.assign(ex.prompt.begin() + 2, ex.prompt.end());
    std::sort(ex.answer.begin(), ex.answer.end());  // digit tokens are consecutive ids
    ex.prompt.push_back(kSep);
    return ex;
  }
};

}  // namespace

std::unique_ptr<Task> make_sort_task() { return std::make_unique<SortTask>(); }

}  // namespace lockstep::rl
