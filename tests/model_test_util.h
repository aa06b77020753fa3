// Helpers of the model configuration and weights tests: a scratch directory per test, and
// assertions that an exception is thrown and its message names what it must name.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::test {

// A fresh directory under the system temp folder, removed with everything in it at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("lockstep_model_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() +
             "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return str(name);
  }

 private:
  std::filesystem::path path_;
};

// Runs `f`, requires it to throw E, and requires the message to contain every string of `parts`.
template <class E>
void expect_throw_naming(const std::function<void()>& f, const std::vector<std::string>& parts,
                         const std::string& context = "") {
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos)
          << context << ": message \"" << msg << "\" does not name \"" << p << "\"";
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << context << ": wrong exception type: " << e.what();
    return;
  }
  ADD_FAILURE() << context << ": no exception thrown";
}

}  // namespace lockstep::test
