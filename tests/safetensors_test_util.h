// Helpers shared by the safetensors tests: patterned tensors, a file of every dtype, file-level
// equality, reading a whole file.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "lockstep/tensor/safetensors.h"
#include "temp_dir.h"

namespace lockstep::test_util {

// Fills a tensor with a byte pattern that depends on its position, so swaps and shifts show.
inline Tensor patterned(DType dtype, std::vector<int64_t> shape, uint8_t salt) {
  Tensor t(dtype, std::move(shape));
  auto b = t.bytes();
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte(uint8_t(i * 37 + salt));
  return t;
}

inline void expect_same(const SafetensorsFile& a, const SafetensorsFile& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.tensor.dtype(), y.tensor.dtype()) << x.name;
    EXPECT_EQ(x.tensor.shape(), y.tensor.shape()) << x.name;
    ASSERT_EQ(x.tensor.nbytes(), y.tensor.nbytes()) << x.name;
    EXPECT_TRUE(
        std::equal(x.tensor.bytes().begin(), x.tensor.bytes().end(), y.tensor.bytes().begin()))
        << x.name;
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Three tensors per dtype: [3, cols], an empty [0, 4] and a scalar.
inline SafetensorsFile every_dtype_file(int64_t cols = 5) {
  SafetensorsFile f;
  uint8_t salt = 1;
  for (const auto& row : kDTypes) {
    std::string n(row.name);
    f.tensors.push_back({n + ".matrix", patterned(row.dtype, {3, cols}, salt++)});
    f.tensors.push_back({n + ".empty", patterned(row.dtype, {0, 4}, salt++)});
    f.tensors.push_back({n + ".scalar", patterned(row.dtype, {}, salt++)});
  }
  return f;
}

}  // namespace lockstep::test_util
