// Tests of the library parts behind the hostile-user fixes: inputs that are not regular files,
// a write past the file size limit, the run-folder lock, the header parser's linear SAX path (same
// result whatever the key order, the first error in name order, NUL bytes), and the exact inverse
// of the Hadamard transform.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lockstep/numerics/hadamard.h"
#include "lockstep/tensor/file_io.h"
#include "lockstep/tensor/safetensors.h"
#include "rl/dir_util.h"
#include "temp_dir.h"

namespace lockstep {
namespace {

std::vector<std::byte> header_file_bytes(const std::string& header, size_t data) {
  std::vector<std::byte> out(8 + header.size() + data);
  for (int i = 0; i < 8; ++i)
    out[size_t(i)] = std::byte(uint8_t(uint64_t(header.size()) >> (8 * i)));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string header_error_of(const std::vector<std::byte>& bytes) {
  try {
    parse_safetensors_header(bytes, bytes.size(), "f");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

// ---- inputs that are not regular files -------------------------------------------------------

TEST(FileInputs, FifoDeviceAndFolderAreRefusedWithoutBlocking) {
  test_util::TempDir dir;
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens the FIFO: a blocking open(2) would hang this test until ctest kills it.
  for (const std::string& p : {fifo, std::string("/dev/zero"), dir.path().string()}) {
    try {
      read_input_file(p);
      ADD_FAILURE() << p << " was read";
    } catch (const InputPathError& e) {
      EXPECT_NE(std::string(e.what()).find("regular files only"), std::string::npos) << e.what();
    }
    EXPECT_THROW(read_safetensors_header(p), SafetensorsError) << p;
  }
  EXPECT_THROW(read_input_file((dir / "missing").string()), InputPathError);
  const std::string regular = (dir / "a.txt").string();
  write_file_atomic(regular, "abc");
  EXPECT_EQ(read_input_file(regular), "abc");
  const int fd = open_input_file(regular);
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0) << "the descriptor is handed back blocking";
  ::close(fd);
}

// ---- a write past the file size limit ----------------------------------------------------------

TEST(FileOutputs, FileSizeLimitFailsTheWriteAndRemovesTheTemporary) {
  test_util::TempDir dir;
  const std::string target = (dir / "big.bin").string();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The default action of SIGXFSZ is to end the process (with a core): AtomicFile must turn
    // it into an EFBIG write error instead.
    ::signal(SIGXFSZ, SIG_DFL);
    const rlimit lim{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      AtomicFile f(target);
      f.write(std::string(1 << 16, 'x'));
      f.commit();
    } catch (const FileWriteError& e) {
      ::_exit(std::string(e.what()).find("File too large") != std::string::npos ? 0 : 3);
    }
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(dir.names(), std::vector<std::string>{}) << "a temporary was left behind";
}

// ---- the run-folder lock
// -------------------------------------------------------------------------

TEST(FolderLock, SecondHolderIsRefusedUntilTheFirstGoes) {
  test_util::TempDir dir;
  {
    rl::detail::FolderLock first(dir.path());
    first.record_holder();
    try {
      rl::detail::FolderLock second(dir.path());
      ADD_FAILURE() << "the folder was locked twice";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(dir.path().string()), std::string::npos) << m;
      EXPECT_NE(m.find("pid " + std::to_string(::getpid())), std::string::npos) << m;
    }
  }
  EXPECT_NO_THROW(rl::detail::FolderLock again(dir.path()));
}

TEST(FolderLock, ReleasedWhenTheHolderIsKilled) {
  test_util::TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rl::detail::FolderLock lock(dir.path());
    [[maybe_unused]] const ssize_t w = ::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_THROW(rl::detail::FolderLock(dir.path()), std::invalid_argument);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_NO_THROW(rl::detail::FolderLock(dir.path()));
  ::close(ready[0]);
  ::close(ready[1]);
}

// ---- the header parser
// -----------------------------------------------------------------------------

TEST(SafetensorsHeaderParse, SameResultWhateverTheKeyOrder) {
  // 200 tensors (some empty, sharing an offset) written in shuffled key orders parse to the same
  // list: data order, ties of empty tensors by name.
  std::vector<std::string> entries;
  uint64_t off = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t n = i % 7 == 0 ? 0 : uint64_t(i % 5 + 1);
    entries.push_back(fmt::format(R"("t{}":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}})",
                                  i, n, off, off + n));
    off += n;
  }
  std::mt19937 rng(7);
  std::vector<std::vector<std::string>> names;
  for (int trial = 0; trial < 4; ++trial) {
    std::shuffle(entries.begin(), entries.end(), rng);
    std::string h = R"({"__metadata__":{"k":"v"})";
    for (const auto& e : entries) h += "," + e;
    h += "}";
    const auto bytes = header_file_bytes(h, off);
    const SafetensorsHeader p = parse_safetensors_header(bytes, bytes.size(), "f");
    EXPECT_EQ(p.metadata.at("k"), "v");
    std::vector<std::string> got;
    for (const TensorInfo& t : p.tensors) got.push_back(t.name);
    names.push_back(got);
    for (size_t i = 1; i < p.tensors.size(); ++i) {
      const TensorInfo &a = p.tensors[i - 1], &b = p.tensors[i];
      EXPECT_TRUE(a.begin < b.begin || (a.begin == b.begin && a.name < b.name));
    }
  }
  for (const auto& n : names) EXPECT_EQ(n, names.front());
}

TEST(SafetensorsHeaderParse, TheFirstBadEntryInNameOrderIsReported) {
  const std::string h = R"({"zz":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]},)"
                        R"("aa":{"dtype":"U8","shape":[-1],"data_offsets":[1,2]}})";
  const std::string m = header_error_of(header_file_bytes(h, 2));
  EXPECT_NE(m.find("tensor 'aa'"), std::string::npos) << m;
  // A JSON error anywhere wins over entry errors, a duplicate over both.
  EXPECT_NE(header_error_of(header_file_bytes(h.substr(0, h.size() - 1), 2)).find("not valid JSON"),
            std::string::npos);
  const std::string dup = R"({"aa":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]},)"
                          R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},)"
                          R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_NE(header_error_of(header_file_bytes(dup, 2)).find("duplicate tensor name 'b'"),
            std::string::npos);
  EXPECT_NE(header_error_of(header_file_bytes(R"([1, 2])", 0)).find("a JSON array, not an object"),
            std::string::npos);
  EXPECT_NE(header_error_of(header_file_bytes(R"("text")", 0)).find("a JSON string, not an object"),
            std::string::npos);
}

TEST(SafetensorsHeaderParse, NulBytesAreRefusedWhereverTheyAre) {
  const std::string ok = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  for (const std::string& h :
       {ok + std::string(3, '\0'), ok + std::string("\0xyz", 4), std::string("{\0}", 3)}) {
    const std::string m = header_error_of(header_file_bytes(h, 1));
    EXPECT_NE(m.find("NUL byte"), std::string::npos) << m;
  }
  EXPECT_EQ(header_error_of(header_file_bytes(ok + "   ", 1)), "")
      << "trailing spaces are JSON whitespace";
}

// ---- the inverse Hadamard transform ------------------------------------------------------------

TEST(HadamardInverse, ExactOnValuesWhoseTransformIsExact) {
  // y: small integers (exact in bf16); x = y M^T holds multiples of 1/4 below 32, exact in fp32,
  // and the forward sums of such x are exact too: forward(inverse(y)) == y and back, bit for bit.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> d(-8, 8);
  for (int trial = 0; trial < 1000; ++trial) {
    float y[16], x[16], y2[16], x2[16];
    for (float& v : y) v = float(d(rng));
    num::inverse_hadamard16_chunk(y, x);
    num::hadamard16_chunk(x, y2);
    num::inverse_hadamard16_chunk(y2, x2);
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(y2[i], y[i]) << "trial " << trial << " i " << i;
      ASSERT_EQ(x2[i], x[i]) << "trial " << trial << " i " << i;
    }
  }
}

TEST(HadamardInverse, ErrorIsTheForwardRoundingOnly) {
  // x' = inverse(forward(x)): M is orthogonal, so ||x' - x|| = ||forward(x) - x M|| up to the
  // final fp32 rounding, and forward(x) differs from x M by its bf16 rounding (at most 2^-9
  // relative, bounded here by 2^-8 |y_j|) plus the fp32 sum's rounding (15 adds, each at most
  // 2^-24 of a partial sum bounded by sum |x_i|, then exact / 4).
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    float x[16], y[16], back[16];
    double sum_abs = 0;
    for (float& v : x) {
      v = nd(rng) * std::ldexp(1.0f, trial % 40 - 20);
      sum_abs += std::fabs(v);
    }
    num::hadamard16_chunk(x, y);
    num::inverse_hadamard16_chunk(y, back);
    double bound2 = 0, err2 = 0, norm2 = 0;
    for (int j = 0; j < 16; ++j) {
      const double b = std::ldexp(std::fabs(double(y[j])), -8) + 15 * std::ldexp(sum_abs, -24) / 4;
      bound2 += b * b;
    }
    for (int i = 0; i < 16; ++i) {
      err2 += (double(back[i]) - double(x[i])) * (double(back[i]) - double(x[i]));
      norm2 += double(back[i]) * double(back[i]);
    }
    ASSERT_LE(std::sqrt(err2), std::sqrt(bound2) + std::ldexp(std::sqrt(norm2), -24))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace lockstep
