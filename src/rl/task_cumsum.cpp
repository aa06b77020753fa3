// The `cumsum` task: running sums of a digit string, each intermediate result written out, so
// answers are long (6 d - 1 tokens: 65 at d = 11, 251 at d = 42) and each step depends only on the
// step before it and one prompt digit: multi-step arithmetic for segment-level statistics.
#include <algorithm>

#include "lockstep/rl/task.h"

namespace lockstep::rl {
namespace {

constexpr int kWidth = 3;  // digits of every running sum: 9 * 42 = 378 < 1000

class CumsumTask final : public Task {
 public:
  std::string_view name() const override { return "cumsum"; }
  std::string_view description() const override {
    return "running sums of difficulty digits, every step written as x=sss (sum 3 digits, "
           "least significant first), steps joined by +";
  }
  int32_t marker() const override { return kTaskCumsum; }
  int min_difficulty() const override { return 2; }
  int max_difficulty() const override { return 42; }
  int64_t max_answer_tokens(int d) const override { return int64_t(d) * (kWidth + 3) - 1; }

  // The shape of the answer: a digit, "=", kWidth digits per step, "+" between steps.
  bool well_formed(const Example& ex, std::span<const int32_t> response) const override {
    const auto eos = std::find(response.begin(), response.end(), int32_t(kEos));
    if (eos == response.end() || size_t(eos - response.begin()) != ex.answer.size()) return false;
    for (size_t i = 0; i < ex.answer.size(); ++i) {
      const bool digit_here = is_digit_token(ex.answer[i]);
      if (digit_here != is_digit_token(response[i])) return false;
      if (!digit_here && response[i] != ex.answer[i]) return false;
    }
    return true;
  }

 protected:
  // Prompt: <bos> <cumsum> x_1 .. x_d =   (d + 3 tokens)
  // Answer: x_1 = s_1 + x_2 = s_2 + ... + x_d = s_d, s_k = x_1 + ... + x_k written with kWidth
  // digits, least significant first (as `add` writes its sum, so each digit needs only the
  // digits of its place and the carry just emitted).
  Example generate(ExampleRng& rng, int d) const override {
    Example ex;
    ex.prompt = {kBos, kTaskCumsum};
    std::vector<int> x(static_cast<size_t>(d));
    for (int& v : x) {
      v = rng.digit();
      ex.prompt.push_back(digit_token(v));
    }
    ex.prompt.push_back(kSep);
    int sum = 0;
    for (int k = 0; k < d; ++k) {
      sum += x[size_t(k)];
      if (k > 0) ex.answer.push_back(kPlus);
      ex.answer.push_back(digit_token(x[size_t(k)]));
      ex.answer.push_back(kSep);
      for (int j = 0, v = sum; j < kWidth; ++j, v /= 10) ex.answer.push_back(digit_token(v % 10));
    }
    return ex;
  }
};

}  // namespace

std::unique_ptr<Task> make_cumsum_task() { return std::make_unique<CumsumTask>(); }

}  // namespace lockstep::rl
