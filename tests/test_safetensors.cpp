// Tests of safetensors I/O: round trips for every dtype, a file written by Hugging Face's
// `safetensors` package, one test per malformed-input rule (bad bytes built by hand, message
// checked), and the atomic writer's failure paths.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "lockstep/tensor/file_io.h"
#include "lockstep/tensor/safetensors.h"
#include "safetensors_test_util.h"
#include "temp_dir.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
const std::string kOrigin = "bad.safetensors";

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// 8-byte little-endian `length` + `header` + `data`; `length` defaults to header.size().
std::vector<std::byte> make_file(std::string_view header, std::string_view data = "",
                                 std::optional<uint64_t> length = std::nullopt) {
  uint64_t n = length.value_or(header.size());
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = std::byte(uint8_t(n >> (8 * i)));
  auto h = bytes_of(header), d = bytes_of(data);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

// Parses `bytes`, expects SafetensorsError, and checks the message names the file and contains
// every fragment in `needles` (the tensor and the problem).
void expect_parse_error(const std::vector<std::byte>& bytes,
                        std::initializer_list<std::string> needles) {
  try {
    parse_safetensors(bytes, kOrigin);
    ADD_FAILURE() << "no error; expected one mentioning " << *needles.begin();
  } catch (const SafetensorsError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(kOrigin), std::string::npos) << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

using test_util::every_dtype_file;
using test_util::expect_same;
using test_util::patterned;
using test_util::slurp;
using test_util::TempDir;

// ---- round trips ------------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDTypeInMemory) {
  SafetensorsFile f = every_dtype_file();
  ASSERT_EQ(f.tensors.size(), 3 * kDTypes.size());
  expect_same(f, parse_safetensors(serialize_safetensors(f), "mem"));
}

TEST(Safetensors, RoundTripEveryDTypeThroughFile) {
  TempDir dir;
  SafetensorsFile f = every_dtype_file();
  f.metadata = {
      {"lockstep.contract", "1"}, {"format", "pt"}, {"empty", ""}, {"utf8", "\xc3\xa9t\xc3\xa9"}};
  auto path = (dir.path() / "all.safetensors").string();
  write_safetensors(path, f);
  expect_same(f, read_safetensors(path));
  EXPECT_EQ(dir.entries(), 1u) << "temporary file left behind";
  SafetensorsHeader h = read_safetensors_header(path);
  ASSERT_EQ(h.tensors.size(), f.tensors.size());
  EXPECT_EQ(h.metadata, f.metadata);
}

TEST(Safetensors, MetadataRoundTrip) {
  SafetensorsFile f;
  f.metadata = {{"a", "1"}, {"lockstep.w.format", "nvfp4"}, {"quote\"and\\slash", "line\nbreak"}};
  auto back = parse_safetensors(serialize_safetensors(f), "mem");
  EXPECT_TRUE(back.tensors.empty());
  EXPECT_EQ(back.metadata, f.metadata);
}

TEST(Safetensors, LayoutIsPaddedAndInGivenOrder) {
  SafetensorsFile f;
  f.tensors.push_back({"z", patterned(DType::kF32, {3}, 1)});
  f.tensors.push_back({"a", patterned(DType::kU8, {5}, 2)});
  f.tensors.push_back({"m", patterned(DType::kBF16, {2}, 3)});
  auto bytes = serialize_safetensors(f);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint64_t(bytes[size_t(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12 + 5 + 4);
  auto back = parse_safetensors(bytes, "mem");
  ASSERT_EQ(back.tensors.size(), 3u);
  EXPECT_EQ(back.tensors[0].name, "z");  // data order is the given order, not sorted by name
  EXPECT_EQ(back.tensors[1].name, "a");
  EXPECT_EQ(back.tensors[2].name, "m");
  expect_same(f, back);
}

TEST(Safetensors, WriteRejectsDuplicateAndReservedNames) {
  SafetensorsFile f;
  f.tensors.push_back({"w", Tensor(DType::kF32, {1})});
  f.tensors.push_back({"w", Tensor(DType::kF32, {1})});
  EXPECT_THROW(serialize_safetensors(f), SafetensorsError);
  f.tensors[1].name = "__metadata__";
  EXPECT_THROW(serialize_safetensors(f), SafetensorsError);
}

// Bytes written by Hugging Face safetensors 0.8 (`safetensors.numpy.save`) for
// {"b": int64 [[1,2,3]], "a": float16 [1.5, -2.0], "c": bool True}, metadata {"k": "v"}.
TEST(Safetensors, ReadsFileWrittenByHuggingFace) {
  const std::string header =
      R"({"__metadata__":{"k":"v"},"b":{"dtype":"I64","shape":[1,3],"data_offsets":[0,24]},)"
      R"("a":{"dtype":"F16","shape":[2],"data_offsets":[24,28]},)"
      R"("c":{"dtype":"BOOL","shape":[],"data_offsets":[28,29]}})";
  ASSERT_EQ(header.size(), 192u);
  const std::string data(
      "\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0\x03\0\0\0\0\0\0\0"
      "\x00\x3e\x00\xc0\x01",
      29);
  auto f = parse_safetensors(make_file(header, data), "hf.safetensors");
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].name, "b");
  EXPECT_EQ(f.tensors[1].name, "a");
  EXPECT_EQ(f.tensors[2].name, "c");
  EXPECT_EQ(f.metadata.at("k"), "v");
  auto b = f.find("b")->data<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(b.begin(), b.end()), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f.find("b")->shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(to_f32(*f.find("a")), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.find("c")->dtype(), DType::kBool);
  EXPECT_TRUE(f.find("c")->shape().empty());
  EXPECT_EQ(f.find("c")->bytes()[0], std::byte{1});
}

TEST(Safetensors, AcceptsSpacePaddingAndHeaderOutOfDataOrder) {
  auto f = parse_safetensors(
      make_file(R"({"second":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                R"("first":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}     )",
                "\x01\x02\x03\x04"),
      "mem");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "first");
  EXPECT_EQ(f.tensors[0].tensor.bytes()[1], std::byte{2});
  EXPECT_EQ(f.tensors[1].tensor.bytes()[0], std::byte{3});
}

// ---- malformed input: one test per rule --------------------------------------------------------

TEST(SafetensorsMalformed, FileShorterThan8Bytes) {
  expect_parse_error(bytes_of(std::string_view("\x10\0\0", 3)),
                     {"3 bytes", "shorter than the 8-byte header length"});
  expect_parse_error({}, {"0 bytes", "shorter"});
}

TEST(SafetensorsMalformed, HeaderLengthLargerThanFile) {
  expect_parse_error(make_file("{}", "", 1000), {"header length 1000", "larger than the file"});
}

TEST(SafetensorsMalformed, HeaderLengthOver100MB) {
  expect_parse_error(make_file("{}", "", 200ull << 20), {"header length 209715200", "byte limit"});
  expect_parse_error(make_file("{}", "", ~0ull), {"byte limit"});
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  expect_parse_error(make_file(R"({"a": {"dtype": )"), {"not valid JSON"});
  expect_parse_error(make_file("\xff\xfe garbage"), {"not valid JSON"});
}

TEST(SafetensorsMalformed, HeaderNotObject) {
  expect_parse_error(make_file("[1, 2]"), {"header is a JSON array, not an object"});
}

TEST(SafetensorsMalformed, EntryNotObject) {
  expect_parse_error(make_file(R"({"w": [1, 2]})"), {"tensor 'w'", "not an object"});
}

TEST(SafetensorsMalformed, MissingFields) {
  expect_parse_error(make_file(R"({"w": {"shape": [], "data_offsets": [0, 4]}})", "abcd"),
                     {"tensor 'w'", "missing field 'dtype'"});
  expect_parse_error(make_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd"),
                     {"tensor 'w'", "missing field 'shape'"});
  expect_parse_error(make_file(R"({"w": {"dtype": "F32", "shape": []}})", "abcd"),
                     {"tensor 'w'", "missing field 'data_offsets'"});
}

TEST(SafetensorsMalformed, WronglyTypedFields) {
  expect_parse_error(
      make_file(R"({"w": {"dtype": 7, "shape": [], "data_offsets": [0, 4]}})", "abcd"),
      {"tensor 'w'", "'dtype' is not a string"});
  expect_parse_error(
      make_file(R"({"w": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", "abcd"),
      {"tensor 'w'", "'shape' is not an array"});
  expect_parse_error(
      make_file(R"({"w": {"dtype": "F32", "shape": [], "data_offsets": "0,4"}})", "abcd"),
      {"tensor 'w'", "not [begin, end]"});
  expect_parse_error(
      make_file(R"({"w": {"dtype": "F32", "shape": [], "data_offsets": [0, "4"]}})", "abcd"),
      {"tensor 'w'", "data_offsets end \"4\" is not an integer"});
}

TEST(SafetensorsMalformed, UnknownDTypeIsNamed) {
  expect_parse_error(
      make_file(R"({"w": {"dtype": "F4_E2M1", "shape": [1], "data_offsets": [0, 1]}})", "a"),
      {"tensor 'w'", "unknown dtype 'F4_E2M1'"});
}

TEST(SafetensorsMalformed, NegativeDimension) {
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": [2, -1], "data_offsets": [0, 0]}})"),
      {"tensor 'w'", "dimension -1 is negative"});
}

TEST(SafetensorsMalformed, NonIntegerDimension) {
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": [2.5], "data_offsets": [0, 2]}})", "ab"),
      {"tensor 'w'", "dimension 2.5 is not an integer"});
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": [true], "data_offsets": [0, 1]}})", "a"),
      {"tensor 'w'", "dimension true is not an integer"});
}

TEST(SafetensorsMalformed, ShapeByteCountOverflows) {
  // 2^32 * 2^32 * 4 bytes does not fit 64 bits.
  expect_parse_error(
      make_file(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})"),
      {"tensor 'w'", "overflows"});
  // 2^62 elements fit, 2^62 * 4 bytes do not.
  expect_parse_error(
      make_file(
          R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})"),
      {"tensor 'w'", "overflows"});
}

TEST(SafetensorsMalformed, DataOffsetsNotAPair) {
  expect_parse_error(make_file(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", "a"),
                     {"tensor 'w'", "data_offsets [0] is not [begin, end]"});
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})", "ab"),
      {"tensor 'w'", "is not [begin, end]"});
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", "a"),
      {"tensor 'w'", "data_offsets begin -1 is negative"});
}

TEST(SafetensorsMalformed, DataOffsetsBeginAfterEnd) {
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}})", "abc"),
      {"tensor 'w'", "[2, 1] has begin > end"});
}

TEST(SafetensorsMalformed, EndBeyondBuffer) {
  expect_parse_error(
      make_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "abcd"),
      {"tensor 'w'", "end 8 is beyond the data buffer (4 bytes)"});
}

TEST(SafetensorsMalformed, SizeMismatch) {
  expect_parse_error(
      make_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "abcdefgh"),
      {"tensor 'w'", "size mismatch", "hold 4 bytes", "needs 8"});
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  expect_parse_error(make_file(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                               R"( "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}})",
                               "abcde"),
                     {"tensor 'b'", "overlap tensor 'a'"});
  // Aliasing the same bytes is an overlap too.
  expect_parse_error(make_file(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                               R"( "b": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
                               "abcd"),
                     {"overlap"});
}

// The Hugging Face reader's coverage rule: sorted by offsets, tensors tile the data buffer with
// no gap before, between or after them (tests/py/test_safetensors_interop.py checks the same
// files against the `safetensors` package itself).
TEST(SafetensorsMalformed, GapBetweenTensors) {
  expect_parse_error(make_file(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
                               R"( "b": {"dtype": "U8", "shape": [1], "data_offsets": [3, 4]}})",
                               "abcd"),
                     {"tensor 'b'", "gap of 1 unindexed bytes after tensor 'a' (ends at 2)"});
  expect_parse_error(
      make_file(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})", "abc"),
      {"tensor 'a'", "gap of 1 unindexed bytes after the start of the data buffer"});
}

TEST(SafetensorsMalformed, TrailingBytes) {
  expect_parse_error(
      make_file(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "abc"),
      {"1 trailing bytes after tensor 'a' (ends at 2)", "data buffer is 3 bytes"});
  expect_parse_error(make_file("{}", "zz"), {"2 trailing bytes", "no tensor holds data"});
  expect_parse_error(
      make_file(R"({"e": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}})", "x"),
      {"1 trailing bytes"});
}

TEST(SafetensorsMalformed, EmptyTensorMustSitWhereThePreviousEnds) {
  const std::string a = R"("a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]})";
  expect_parse_error(
      make_file("{" + a + R"(, "e": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}})",
                "abcd"),
      {"tensor 'e'", "overlap tensor 'a'"});
  expect_parse_error(
      make_file("{" + a + R"(, "e": {"dtype": "F32", "shape": [0], "data_offsets": [9, 9]}})",
                "abcd"),
      {"tensor 'e'", "beyond the data buffer"});
  // At a boundary (the start or the end) an empty tensor is fine, as for Hugging Face.
  for (const char* at : {"[0, 0]", "[4, 4]"}) {
    const auto f = parse_safetensors(
        make_file("{" + a + R"(, "e": {"dtype": "U8", "shape": [0], "data_offsets": )" + at + "}}",
                  "abcd"),
        "mem");
    EXPECT_EQ(f.tensors.size(), 2u) << at;
  }
  EXPECT_EQ(parse_safetensors(make_file("{}"), "mem").tensors.size(), 0u);
}

TEST(SafetensorsMalformed, EmptyTensorName) {
  expect_parse_error(
      make_file(R"({"": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "ab"),
      {"a tensor has an empty name"});
  SafetensorsFile f;
  f.tensors.push_back({"", Tensor(DType::kU8, {2})});
  EXPECT_THROW(serialize_safetensors(f), SafetensorsError);
}

TEST(SafetensorsMalformed, NestingDeeperThanTheReferenceReader) {
  // serde_json, behind the Hugging Face reader, stops at 128 levels; so does lockstep, which
  // also keeps the recursive parts of the JSON library (printing a value in a message) shallow.
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": )" + deep + R"(, "data_offsets": [0, 0]}})"),
      {"nested deeper than 128 levels"});
  const std::string ok = std::string(100, '[') + std::string(100, ']');
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "shape": [)" + ok + R"(], "data_offsets": [0, 0]}})"),
      {"tensor 'w'", "is not an integer"});
}

TEST(SafetensorsMalformed, MetadataNotAnObjectOfStrings) {
  expect_parse_error(make_file(R"({"__metadata__": ["a"]})"),
                     {"__metadata__ is a JSON array, not an object"});
  expect_parse_error(make_file(R"({"__metadata__": {"epoch": 3}})"),
                     {"__metadata__ value of 'epoch' is a JSON number, not a string"});
}

TEST(SafetensorsMalformed, DuplicateTensorName) {
  expect_parse_error(make_file(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
                               R"( "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                               "ab"),
                     {"duplicate tensor name 'w'"});
  expect_parse_error(
      make_file(R"({"w": {"dtype": "U8", "dtype": "I8", "shape": [1], "data_offsets": [0, 1]}})",
                "a"),
      {"duplicate key 'dtype'"});
}

TEST(SafetensorsMalformed, TruncatedFileOnDisk) {
  TempDir dir;
  SafetensorsFile f;
  f.tensors.push_back({"w", patterned(DType::kF32, {16}, 3)});
  auto path = (dir.path() / "t.safetensors").string();
  write_safetensors(path, f);
  fs::resize_file(path, fs::file_size(path) - 1);
  try {
    read_safetensors(path);
    ADD_FAILURE() << "truncated file was accepted";
  } catch (const SafetensorsError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("beyond the data buffer"), std::string::npos) << msg;
  }
  EXPECT_THROW(read_safetensors((dir.path() / "missing.safetensors").string()), SafetensorsError);
  EXPECT_THROW(read_safetensors(dir.path().string()), SafetensorsError);  // a directory
}

// ---- atomic writes ------------------------------------------------------------------------------

TEST(SafetensorsWrite, IntoMissingDirectoryFailsCleanly) {
  TempDir dir;
  auto path = (dir.path() / "no_such_dir" / "w.safetensors").string();
  SafetensorsFile f;
  f.tensors.push_back({"w", Tensor(DType::kF32, {2})});
  try {
    write_safetensors(path, f);
    ADD_FAILURE() << "write into a missing directory succeeded";
  } catch (const OutputPathError& e) {  // the caller's path: checked before anything is created
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path() / "no_such_dir"));
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(SafetensorsWrite, RejectedInputLeavesExistingTarget) {
  TempDir dir;
  auto path = (dir.path() / "w.safetensors").string();
  SafetensorsFile good;
  good.tensors.push_back({"w", patterned(DType::kBF16, {4, 4}, 9)});
  write_safetensors(path, good);
  const std::string before = slurp(path);
  SafetensorsFile bad = good;
  bad.tensors.push_back(bad.tensors[0]);  // duplicate name
  EXPECT_THROW(write_safetensors(path, bad), SafetensorsError);
  EXPECT_EQ(slurp(path), before);
  EXPECT_EQ(dir.entries(), 1u);
}

// A write that fails half way (file size limit hit: EFBIG) removes the temporary file and keeps
// the old target. Permission tricks would not work when the tests run as root; RLIMIT_FSIZE does.
TEST(SafetensorsWrite, FailureMidWriteLeavesExistingTargetAndNoTempFile) {
  TempDir dir;
  auto path = (dir.path() / "w.safetensors").string();
  SafetensorsFile small;
  small.tensors.push_back({"w", patterned(DType::kU8, {64}, 1)});
  write_safetensors(path, small);
  const std::string before = slurp(path);

  SafetensorsFile big;
  big.tensors.push_back({"w", patterned(DType::kF32, {1 << 16}, 2)});  // 256 KiB
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    write_safetensors(path, big);
  } catch (const FileWriteError& e) {  // not the caller's input: the CLI exits 1, not 2
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);

  EXPECT_NE(message.find(path), std::string::npos)
      << "expected a failed write, got: '" << message << "'";
  EXPECT_NE(message.find("write failed"), std::string::npos) << message;
  EXPECT_EQ(slurp(path), before);
  EXPECT_EQ(dir.entries(), 1u) << "temporary file left behind";
}

TEST(SafetensorsWrite, RenameOntoDirectoryFailsAndCleansUp) {
  TempDir dir;
  auto path = dir.path() / "occupied";
  fs::create_directories(path / "child");
  SafetensorsFile f;
  f.tensors.push_back({"w", Tensor(DType::kF32, {2})});
  EXPECT_THROW(write_safetensors(path.string(), f), OutputPathError);
  EXPECT_TRUE(fs::is_directory(path / "child"));
  EXPECT_EQ(dir.entries(), 1u) << "temporary file left behind";
}

TEST(SafetensorsWrite, OverwritesExistingFile) {
  TempDir dir;
  auto path = (dir.path() / "w.safetensors").string();
  SafetensorsFile a, b;
  a.tensors.push_back({"a", patterned(DType::kF64, {3}, 1)});
  b.tensors.push_back({"b", patterned(DType::kI16, {2, 2}, 2)});
  b.metadata["k"] = "v";
  write_safetensors(path, a);
  write_safetensors(path, b);
  expect_same(b, read_safetensors(path));
  EXPECT_EQ(dir.entries(), 1u);
}

}  // namespace
}  // namespace lockstep
