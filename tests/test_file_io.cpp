// Tests of the atomic writer (lockstep/tensor/file_io.h): targets that are not regular files are
// refused and left as they are, symbolic links are written through, temporaries never outlive a
// failure or a SIGINT / SIGTERM / SIGHUP, and permission bits are kept.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "lockstep/tensor/file_io.h"
#include "temp_dir.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

using lockstep::test_util::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Expects write_file_atomic(path) to throw OutputPathError whose message names the path and
// contains `rule`.
void expect_refused(const std::string& path, const std::string& rule) {
  try {
    write_file_atomic(path, "data");
    ADD_FAILURE() << "writing to " << path << " was accepted";
  } catch (const OutputPathError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(rule), std::string::npos) << "missing '" << rule << "' in: " << msg;
  }
}

// Device nodes like /dev/null (1, 3) and /dev/full (1, 7), made in the test folder: the real ones
// are never used as targets, so a regression cannot replace them.
TEST(AtomicFile, RefusesDeviceNodesAndLeavesThem) {
  TempDir dir;
  for (auto [name, minor] : {std::pair{"null", 3u}, std::pair{"full", 7u}}) {
    const std::string dev = (dir / name).string();
    if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, minor)) != 0)
      GTEST_SKIP() << "creating device nodes needs root (CAP_MKNOD): " << std::strerror(errno);
    expect_refused(dev, "is a character device");
    fs::create_symlink(dev, dev + "_link");  // links are followed to what they name
    expect_refused(dev + "_link", "is a character device");
    struct stat after {};
    ASSERT_EQ(::stat(dev.c_str(), &after), 0);
    EXPECT_TRUE(S_ISCHR(after.st_mode)) << dev << " was replaced";
    EXPECT_EQ(after.st_rdev, makedev(1, minor));
  }
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"full", "full_link", "null", "null_link"}))
      << "a temporary was left";
}

TEST(AtomicFile, RefusesFifoSocketAndDirectory) {
  TempDir dir;
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(fifo, "is a FIFO");

  const std::string sock = (dir / "sock").string();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  expect_refused(sock, "is a socket");
  ::close(fd);

  fs::create_directory(dir / "sub");
  expect_refused((dir / "sub").string(), "is a directory");
  expect_refused((dir / "sub").string() + "/", "is a directory");

  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_socket(sock));
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"fifo", "sock", "sub"}))
      << "a temporary was left";
}

TEST(AtomicFile, RefusesMissingFolderFileAsFolderAndEmptyPath) {
  TempDir dir;
  expect_refused((dir / "no_such_dir" / "x.json").string(), "No such file or directory");
  write_file_atomic((dir / "plain").string(), "x");
  expect_refused((dir / "plain" / "x.json").string(), "Not a directory");
  EXPECT_THROW(write_file_atomic("", "x"), OutputPathError);
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"plain"}));
}

TEST(AtomicFile, WritesThroughSymbolicLinksAndRefusesDanglingOnes) {
  TempDir dir;
  write_file_atomic((dir / "real").string(), "old");
  fs::create_symlink(dir / "real", dir / "link");
  write_file_atomic((dir / "link").string(), "new");
  EXPECT_TRUE(fs::is_symlink(dir / "link")) << "the link was replaced by a file";
  EXPECT_EQ(slurp(dir / "real"), "new");

  fs::create_symlink(dir / "missing", dir / "dangling");
  expect_refused((dir / "dangling").string(), "symbolic link");
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"dangling", "link", "real"}));
}

TEST(AtomicFile, TemporaryBesideTargetUntilCommitKeepsMode) {
  TempDir dir;
  const std::string path = (dir / "out.json").string();
  write_file_atomic(path, "v1");
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  {
    AtomicFile f(path);
    f.write(std::string_view("v2"));
    const std::string temp = fs::path(f.temp_path()).filename().string();
    EXPECT_EQ(temp.rfind(".out.json.tmp.", 0), 0u) << temp;
    EXPECT_EQ(temp.size(), std::string(".out.json.tmp.").size() + 6) << temp;
    EXPECT_EQ(slurp(path), "v1");  // not visible before commit
    f.commit();
  }
  EXPECT_EQ(slurp(path), "v2");
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_file_atomic((dir / "fresh").string(), "x");
  EXPECT_EQ(fs::status(dir / "fresh").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::others_read);
  { AtomicFile abandoned((dir / "never").string()); }  // destroyed without commit
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"fresh", "out.json"}));
}

TEST(AtomicFile, LongNamesStayWithinTheFileNameLimit) {
  TempDir dir;
  const std::string name(250, 'n');
  write_file_atomic((dir / name).string(), "x");
  EXPECT_EQ(slurp(dir / name), "x");
}

// The signal handler removes live temporaries and the process still dies of the signal.
void write_then_die(const std::string& path, int sig) {
  AtomicFile f(path);
  f.write(std::string_view("partial"));
  ::raise(sig);
  std::_Exit(0);  // not reached when the signal kills the process
}

TEST(AtomicFile, SignalsRemoveTemporariesAndStillKill) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    TempDir dir;
    const std::string path = (dir / "out.safetensors").string();
    write_file_atomic(path, "old");
    EXPECT_EXIT(write_then_die(path, sig), ::testing::KilledBySignal(sig), "") << strsignal(sig);
    EXPECT_EQ(dir.names(), (std::vector<std::string>{"out.safetensors"})) << strsignal(sig);
    EXPECT_EQ(slurp(path), "old");
  }
}

// A handler the program installed itself is left in place (and then the temporary stays, which
// is that program's business).
void custom_handler(int) { std::_Exit(42); }

TEST(AtomicFile, ProgramsOwnSignalHandlerIsKept) {
  TempDir dir;
  const std::string path = (dir / "out").string();
  EXPECT_EXIT(
      {
        ::signal(SIGTERM, custom_handler);
        write_then_die(path, SIGTERM);
      },
      ::testing::ExitedWithCode(42), "");
}

}  // namespace
}  // namespace lockstep
