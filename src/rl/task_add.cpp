// The `add` task: multi-digit addition a + b. Both operands have exactly `difficulty` digits
// (zero-padded, most significant first); the answer is the sum's difficulty + 1 digits written
// least significant first (docs/rl.md explains why). a + b and b + a are one problem.
#include <algorithm>

#include "lockstep/rl/task.h"

namespace lockstep::rl {
namespace {

class AddTask final : public Task {
 public:
  std::string_view name() const override { return "add"; }
  std::string_view description() const override {
    return "a+b with difficulty-digit operands; answer reversed (least significant digit first)";
  }
  int32_t marker() const override { return kTaskAdd; }
  int min_difficulty() const override { return 1; }
  int max_difficulty() const override { return 16; }
  int64_t max_answer_tokens(int d) const override { return d + 1; }

  // a + b and b + a are one problem: the canonical form is the prompt with the two operands in
  // ascending order (operands have the same width, so comparing their tokens compares values).
  std::vector<int32_t> canonical_form(std::span<const int32_t> prompt) const override {
    std::vector<int32_t> c(prompt.begin(), prompt.end());
    const auto plus = std::find(c.begin(), c.end(), int32_t(kPlus));
    if (c.size() < 5 || plus == c.end()) return c;  // not an add prompt: itself
    const auto a0 = c.begin() + 2, b0 = plus + 1, b1 = c.end() - 1;
    if (b1 - b0 != plus - a0) return c;
    if (std::lexicographical_compare(b0, b1, a0, plus)) {
      std::vector<int32_t> a(a0, plus);
      std::copy(b0, b1, a0);
      std::copy(a.begin(), a.end(), b0);
    }
    return c;
  }

 protected:
  // Prompt: <bos> <add> a_{d-1} .. a_0 + b_{d-1} .. b_0 =   (2d + 4 tokens)
  // Answer: s_0 s_1 .. s_d with s = a + b, zero-padded to d + 1 digits, least significant first:
  // each answer digit then depends on the two operand digits of its place and on the carry out
  // of the digit emitted just before it, the order in which a left-to-right model can compute it.
  Example generate(ExampleRng& rng, int d) const override {
    std::vector<int> a(static_cast<size_t>(d)),
        b(static_cast<size_t>(d));  // most significant first
    for (int& x : a) x = rng.digit();
    for (int& x : b) x = rng.digit();
    Example ex;
    ex.prompt = {kBos, kTaskAdd};
    for (int x : a) ex.prompt.push_back(digit_token(x));
    ex.prompt.push_back(kPlus);
    for (int x : b) ex.prompt.push_back(digit_token(x));
    ex.prompt.push_back(kSep);
    int carry = 0;
    for (int i = d - 1; i >= 0; --i) {
      const int s = a[size_t(i)] + b[size_t(i)] + carry;
      ex.answer.push_back(digit_token(s % 10));
      carry = s / 10;
    }
    ex.answer.push_back(digit_token(carry));
    return ex;
  }
};

}  // namespace

std::unique_ptr<Task> make_add_task() { return std::make_unique<AddTask>(); }

}  // namespace lockstep::rl
