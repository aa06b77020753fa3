// Helpers shared by the C++ test programs: the test seed (fresh per run, printed, replayable with
// LOCKSTEP_TEST_SEED), host tensors from value vectors, and the bytes of a QTensor's parts as
// plain vectors for comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "lockstep/numerics/hd.h"
#include "lockstep/quant/qtensor.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::test {

// One seed per test program run: LOCKSTEP_TEST_SEED when set, else a fresh random one. Printed
// once to stderr so that any failure can be replayed.
inline uint64_t test_seed() {
  static const uint64_t s = [] {
    uint64_t v = 0;
    if (const char* e = std::getenv("LOCKSTEP_TEST_SEED"))
      v = std::strtoull(e, nullptr, 0);
    else
      v = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
    std::fprintf(stderr, "test seed %llu (replay with LOCKSTEP_TEST_SEED=%llu)\n",
                 (unsigned long long)v, (unsigned long long)v);
    return v;
  }();
  return s;
}

// The message of the E that fn throws, or "" when it throws nothing.
template <class E>
std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// A built-in recipe by name (throws for an unknown one).
inline const Recipe& builtin(const char* name) {
  return builtin_recipe_or_throw(name, "test").recipe;
}

// A host F32 tensor [rows, cols] holding v.
inline Tensor mat(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return Tensor::from_vector<float>(v, {rows, cols}, DType::kF32);
}

// A host I64 tensor holding v (group offsets).
inline Tensor i64_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}, DType::kI64);
}

template <class T>
std::vector<T> vec(const Tensor& t) {
  if (!t.defined()) return {};
  const Tensor h = t.to(Device::cpu()).contiguous();
  auto s = h.data<T>();
  return {s.begin(), s.end()};
}

inline std::vector<float> floats(const Tensor& t) { return vec<float>(t); }

// a and b hold the same values bit for bit (signed zeros and NaN payloads included).
inline void expect_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  const std::vector<float> x = floats(a), y = floats(b);
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(num::f32_bits(x[i]), num::f32_bits(y[i]))
        << what << " element " << i << " (" << x[i] << " vs " << y[i] << ", seed " << test_seed()
        << ")";
}

// The parts of one copy as vectors.
struct CopyBytes {
  std::vector<uint8_t> data, block_scale;
  std::vector<float> amax, scale_inv;
  int64_t scale_rows = 0, scale_cols = 0;
  bool operator==(const CopyBytes& o) const {
    auto bits = [](const std::vector<float>& v) {
      std::vector<uint32_t> b;
      for (float x : v) b.push_back(num::f32_bits(x));
      return b;
    };
    return data == o.data && block_scale == o.block_scale && bits(amax) == bits(o.amax) &&
           bits(scale_inv) == bits(o.scale_inv);
  }
};
inline CopyBytes bytes_of(const QData& d) {
  return CopyBytes{vec<uint8_t>(d.data), vec<uint8_t>(d.block_scale),
                   vec<float>(d.amax),   vec<float>(d.scale_inv),
                   d.scale_rows,         d.scale_cols};
}
inline CopyBytes rowwise(const QTensor& q) { return bytes_of(q.rowwise); }
inline CopyBytes colwise(const QTensor& q) { return bytes_of(q.colwise); }
inline bool same_bytes(const QTensor& a, const QTensor& b) {
  return rowwise(a) == rowwise(b) && colwise(a) == colwise(b);
}

// Code of element (r, c) of a packed NVFP4 copy with `cols` columns.
inline uint8_t nibble(const std::vector<uint8_t>& data, int64_t cols, int64_t r, int64_t c) {
  const uint8_t b = data[size_t((r * cols + c) / 2)];
  return c % 2 == 0 ? (b & 0xF) : (b >> 4);
}

}  // namespace lockstep::test
