// The `sort` task: sort a digit string in ascending order. Difficulty = string length; digits
// are drawn uniformly (repeats allowed).
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
  int max_difficulty() const override { return 32; }

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
