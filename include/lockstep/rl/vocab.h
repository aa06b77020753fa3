// The one fixed token vocabulary every RL task shares (docs/rl.md, "Vocabulary"): specials, the
// ten digits, the few operators the tasks need and one marker per task, padded to 32 ids so the
// embedding and LM-head shapes stay multiples of 16 and 32 (NVFP4 / MXFP8 blocks, dgrad's K).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::rl {

// Token ids. Ids kFirstReserved..kVocabSize-1 are reserved: no task emits them and encode() never
// produces them; a sampler may still draw one, which every task scores as a wrong answer.
enum Token : int32_t {
  kPad = 0,
  kBos = 1,
  kEos = 2,
  kSep = 3,     // "=": ends every prompt, the answer follows
  kDigit0 = 4,  // kDigit0 + d is the digit d, d in 0..9
  kPlus = 14,   // "+"
  kColon = 15,  // ":": separates the count task's target digit from its string
  kTaskAdd = 16,
  kTaskSort = 17,
  kTaskReverse = 18,
  kTaskCount = 19,
  kTaskCumsum = 20,
  kFirstReserved = 21,
};
constexpr int32_t kVocabSize = 32;

constexpr bool is_digit_token(int32_t t) { return t >= kDigit0 && t < kDigit0 + 10; }
constexpr int32_t digit_token(int d) { return kDigit0 + d; }  // d in 0..9
constexpr int digit_value(int32_t t) { return t - kDigit0; }  // t a digit token

// The printed form of a token: "<pad>", "<bos>", "<eos>", "=", "0".."9", "+", ":", "<add>",
// "<sort>", "<reverse>", "<count>", "<cumsum>", "<reserved21>".."<reserved31>". Throws
// std::out_of_range naming the id when it is outside [0, kVocabSize).
std::string token_to_string(int32_t token);

// Text -> tokens. Single characters "0".."9", "+", "=", ":" map to their tokens; "<name>" maps to
// a special or task marker; whitespace separates and is dropped. Anything else (including the
// reserved names) throws std::invalid_argument naming the text and the byte offset.
// Example: encode("<bos><add>12+34=") == {kBos, kTaskAdd, 5, 6, kPlus, 7, 8, kSep}.
std::vector<int32_t> encode(std::string_view text);

// Tokens -> text: the concatenation of token_to_string, so encode(decode(t)) == t for every
// sequence without reserved ids. Throws std::out_of_range naming the position of a bad id.
std::string decode(std::span<const int32_t> tokens);

}  // namespace lockstep::rl
