// The shared RL vocabulary (include/lockstep/rl/vocab.h): printed names of the tokens and the
// text <-> token conversions the tasks, tests and logs use.
#include "lockstep/rl/vocab.h"

#include <fmt/format.h>

#include <array>
#include <stdexcept>

namespace lockstep::rl {
namespace {

// Printed names of ids 0..kFirstReserved-1.
constexpr std::array<std::string_view, kFirstReserved> kNames = {
    "<pad>", "<bos>", "<eos>", "=", "0", "1",     "2",      "3",         "4",       "5",       "6",
    "7",     "8",     "9",     "+", ":", "<add>", "<sort>", "<reverse>", "<count>", "<cumsum>"};
static_assert(kNames.size() == size_t(kFirstReserved), "one name per non-reserved token");
static_assert(kVocabSize % 32 == 0 && kFirstReserved <= kVocabSize);

}  // namespace

std::string token_to_string(int32_t token) {
  if (token < 0 || token >= kVocabSize)
    throw std::out_of_range(
        fmt::format("token id {} is outside the vocabulary [0, {})", token, kVocabSize));
  if (token >= kFirstReserved) return fmt::format("<reserved{}>", token);
  return std::string(kNames[size_t(token)]);
}

std::vector<int32_t> encode(std::string_view text) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    if (c == '<') {
      const size_t close = text.find('>', i);
      if (close == std::string_view::npos)
        throw std::invalid_argument(
            fmt::format("encode: '<' at byte {} of \"{}\" has no closing '>'", i, text));
      const std::string_view name = text.substr(i, close - i + 1);
      int32_t found = -1;
      for (int32_t t = 0; t < kFirstReserved; ++t)
        if (kNames[size_t(t)].size() > 1 && kNames[size_t(t)] == name) found = t;
      if (found < 0)
        throw std::invalid_argument(fmt::format(
            "encode: unknown token \"{}\" at byte {} of \"{}\" (specials: <pad> <bos> <eos> "
            "<add> <sort> <reverse> <count> <cumsum>)",
            name, i, text));
      out.push_back(found);
      i = close + 1;
      continue;
    }
    if (c >= '0' && c <= '9') {
      out.push_back(digit_token(c - '0'));
    } else if (c == '+') {
      out.push_back(kPlus);
    } else if (c == '=') {
      out.push_back(kSep);
    } else if (c == ':') {
      out.push_back(kColon);
    } else {
      throw std::invalid_argument(fmt::format(
          "encode: character '{}' at byte {} of \"{}\" is not in the vocabulary (digits, + = :, "
          "<special>)",
          c, i, text));
    }
    ++i;
  }
  return out;
}

std::string decode(std::span<const int32_t> tokens) {
  std::string s;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= kVocabSize)
      throw std::out_of_range(fmt::format("decode: token {} at position {} is outside [0, {})",
                                          tokens[i], i, kVocabSize));
    s += token_to_string(tokens[i]);
  }
  return s;
}

}  // namespace lockstep::rl
