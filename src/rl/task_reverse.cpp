// The `reverse` task: write a digit string backwards. Difficulty = string length (up to 256, long
// answers); digits are drawn uniformly. A string and its reverse are one problem.
#include <algorithm>

#include "lockstep/rl/task.h"

namespace lockstep::rl {
namespace {

class ReverseTask final : public Task {
 public:
  std::string_view name() const override { return "reverse"; }
  std::string_view description() const override {
    return "write a string of difficulty digits backwards";
  }
  int32_t marker() const override { return kTaskReverse; }
  int min_difficulty() const override { return 1; }
  int max_difficulty() const override { return 256; }
  int64_t max_answer_tokens(int n) const override { return n; }

  // Reversing s and reversing its reverse are one problem seen from both ends (each one's answer
  // is the other's prompt): the canonical form is the smaller of the two prompts.
  std::vector<int32_t> canonical_form(std::span<const int32_t> prompt) const override {
    std::vector<int32_t> c(prompt.begin(), prompt.end());
    if (c.size() < 3) return c;
    std::vector<int32_t> r = c;
    std::reverse(r.begin() + 2, r.end() - 1);
    return std::min(c, r);
  }

 protected:
  // Prompt: <bos> <reverse> s_1 .. s_n =   Answer: s_n .. s_1.
  Example generate(ExampleRng& rng, int n) const override {
    Example ex;
    ex.prompt = {kBos, kTaskReverse};
    for (int i = 0; i < n; ++i) ex.prompt.push_back(digit_token(rng.digit()));
    ex.answer.assign(ex.prompt.rbegin(), ex.prompt.rend() - 2);
    ex.prompt.push_back(kSep);
    return ex;
  }
};

}  // namespace

std::unique_ptr<Task> make_reverse_task() { return std::make_unique<ReverseTask>(); }

}  // namespace lockstep::rl
