// parse_json (recipe/json.h), the linear-time parser of the one JSON type: the same document and
// the same errors as Json::parse on every input here, repeated keys included.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/recipe/json.h"
#include "test_util.h"

using namespace lockstep;

namespace {

// An object of n keys k0 .. k{n-1} (values i), with key k{dup} repeated at the end (value -1).
std::string object_text(int n, int dup) {
  std::string s = "{";
  for (int i = 0; i < n; ++i)
    s += (i ? ", " : "") + ("\"k" + std::to_string(i) + "\": ") + std::to_string(i);
  if (dup >= 0) s += ", \"k" + std::to_string(dup) + "\": -1";
  return s + "}";
}

}  // namespace

TEST(Json, ParseJsonEqualsJsonParse) {
  std::vector<std::string> texts = {
      "null",
      "true",
      "-3",
      "18446744073709551615",
      "1.5e-3",
      "\"a\\u00e9\\n\"",
      "[]",
      "{}",
      R"({"b": 1, "a": [1, {"x": null, "y": [true, false]}], "c": {"d": {"e": "f"}}})",
      R"([[[[]]], {"a": {"a": {"a": 1}}}, 2.25])",
      R"({"step": 0, "reward": 0.5, "step": 1})",  // a repeated key in a small object
      R"({"x": {"k": 1}, "x": [2]})",              // a repeated key whose value changes type
  };
  for (int n : {15, 16, 17, 40, 1000})
    for (int dup : {-1, 0, n / 2, n - 1}) texts.push_back(object_text(n, dup));
  texts.push_back("[" + object_text(300, 7) + ", " + object_text(20, 19) + "]");
  for (const std::string& t : texts) {
    const Json want = Json::parse(t);
    const Json got = parse_json(t);
    EXPECT_EQ(got, want) << t.substr(0, 80);
    EXPECT_EQ(got.dump(), want.dump()) << t.substr(0, 80);  // key order too
  }
}

TEST(Json, RepeatedKeyKeepsItsFirstPlaceAndLastValue) {
  const Json j = parse_json(object_text(40, 3));
  ASSERT_EQ(j.size(), 40u);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys[0], "k0");
  EXPECT_EQ(keys[3], "k3");
  EXPECT_EQ(keys[39], "k39");
  EXPECT_EQ(j["k3"], -1);
}

TEST(Json, ParseJsonRaisesWhatJsonParseRaises) {
  for (const char* bad : {"", "{", "{\"a\" 1}", "[1,]", "{\"a\": 1} x", "nul"}) {
    EXPECT_THROW(parse_json(bad), Json::parse_error) << bad;
    EXPECT_THROW({ const Json j = Json::parse(bad); }, Json::parse_error) << bad;
  }
  EXPECT_THROW(parse_json("[1e999]"), Json::out_of_range);
  EXPECT_THROW({ const Json j = Json::parse("[1e999]"); }, Json::out_of_range);
}

TEST(Json, AppendNewKeyKeepsOrder) {
  Json j = Json::object();
  append_new_key(j, "z", 1);
  append_new_key(j, "a", Json::array({1, 2}));
  EXPECT_EQ(j.dump(), R"({"z":1,"a":[1,2]})");
  EXPECT_EQ(parse_json(j.dump()), j);
}
