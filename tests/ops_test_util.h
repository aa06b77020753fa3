// Shared helpers of the ops/ tests: replayable seeds, random arrays, thread-count sweeps, bitwise
// comparison and the float64 central finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace ops_test {

// Fresh seed per run unless LOCKSTEP_TEST_SEED is set; every test prints it through SeedTrace.
inline uint64_t seed() {
  if (const char* s = std::getenv("LOCKSTEP_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
}

struct SeedTrace {
  uint64_t value = seed();
  ::testing::ScopedTrace trace{__FILE__, __LINE__,
                               "seed " + std::to_string(value) + " (LOCKSTEP_TEST_SEED to replay)"};
};

template <class T>
std::vector<T> uniform(size_t n, std::mt19937_64& g, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(d(g));
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs f() with 1, 2 and 3 OpenMP threads and returns the three results (f returns a value
// comparable with same_bits), restoring the previous thread count.
template <class F>
auto across_thread_counts(F&& f) {
  const int saved = omp_get_max_threads();
  std::vector<decltype(f())> out;
  for (int n : {1, 2, 3}) {
    omp_set_num_threads(n);
    out.push_back(f());
  }
  omp_set_num_threads(saved);
  return out;
}

// Central finite differences of loss() with respect to every element of x (float64), compared
// with grad. Step h = 1e-5; the error of (L(x+h) - L(x-h)) / 2h is at most h^2 |L'''| / 6
// (truncation) plus about 2 eps |L| / h (rounding of L, eps = 2^-52). The accepted difference is
// 100 (h^2 + eps * max(1, |L|) / h), about 1e-8 for |L| of order 1: over both terms with a wide
// margin for |L'''| up to ~600, and still orders of magnitude below the error of a wrong formula.
template <class Loss>
void check_gradient(std::vector<double>& x, const std::vector<double>& grad, Loss&& loss,
                    const char* name) {
  ASSERT_EQ(x.size(), grad.size()) << name;
  const double h = 1e-5, eps = std::numeric_limits<double>::epsilon();
  const double l0 = std::fabs(loss());
  const double tol = 100.0 * (h * h + eps * std::max(1.0, l0) / h);
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    const double fd = (lp - lm) / (2 * h);
    ASSERT_NEAR(grad[i], fd, tol) << name << "[" << i << "]";
  }
}

// sum_i r[i] * y[i], the scalar loss whose gradient with respect to y is r.
inline double dot(const std::vector<double>& r, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < r.size(); ++i) s += r[i] * y[i];
  return s;
}

}  // namespace ops_test
