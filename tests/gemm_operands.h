// Operand helpers shared by the CPU GEMM tests (test_gemm.cpp) and the CUDA GEMM test program
// (cuda/test_gemm_cuda.cpp): operand kinds, held operands, random and format-grid values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/gemm/qgemm.h"
#include "lockstep/numerics/hd.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::gemm_test {

// One operand kind: bf16 (no quantization) or a quantizer spec.
struct Kind {
  std::string label;
  bool bf16 = false;
  QuantConfig spec;
};

inline Kind bf16_kind() { return Kind{"bf16", true, {}}; }
inline Kind q_kind(Format f, Scaling s, bool pow2 = false) {
  QuantConfig q;
  q.format = f;
  q.scaling = s;
  q.pow2 = pow2;
  return Kind{
      std::string(format_name(f)) + "/" + std::string(scaling_name(s)) + (pow2 ? "/pow2" : ""),
      false, q};
}

// A held operand: its values, the dense BF16 tensor of them and, when quantized, its QTensor.
// op() views them (the Held must outlive the call it is passed to).
struct Held {
  std::vector<float> x;
  int64_t rows = 0, cols = 0;
  std::optional<QTensor> q;
  Tensor t;  // BF16 [rows, cols]
  GemmArg op(const std::string& = "") const { return q ? GemmArg(*q) : GemmArg(t); }
};

inline Tensor f32_tensor(const std::vector<float>& x, int64_t rows, int64_t cols) {
  return Tensor::from_vector<float>(x, {rows, cols}, DType::kF32);
}

// offsets: quantize as a grouped buffer (quantize_grouped) when non-empty.
inline Held make(const Kind& k, std::vector<float> x, int64_t rows, int64_t cols,
                 std::span<const int64_t> offsets = {}) {
  Held h{std::move(x), rows, cols, std::nullopt, {}};
  h.t = from_f32(h.x, {rows, cols}, DType::kBF16);
  if (!k.bf16) h.q = quantize_grouped(f32_tensor(h.x, rows, cols), offsets, k.spec, "x");
  return h;
}

// Student-t (3) values times `scale`, rounded to bf16.
inline std::vector<float> random_values(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::student_t_distribution<float> d(3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = num::bf16_to_f32(num::f32_to_bf16(d(g) * scale));
  return v;
}

// How far grid_values spreads the values of the formats other than nvfp4: per 32-block a power of
// two 2^(pick(exponents) - exponents / 2) times integers in [-max_int, max_int].
struct GridSpread {
  int exponents = 5;
  int max_int = 15;
};

// Values on the grid of `k`, so that quantization is lossless (checked by the caller) and every
// product and partial sum stays a small multiple of a power of two (premise checked separately).
// nvfp4: each row has amax 10.5 = 2688 * 2^-8 (S_dec = 2^-8) at column `amax_col`, alone in its
// block (block scale 448); other blocks have E2M1 x {0.5, 1, 2} x 2^-8 with one element at +-6.
// Others: integers times a power of two per 32-block (GridSpread), zero in columns 0..15 (they meet
// the other operand's nvfp4 amax block, inner value 2688).
inline std::vector<float> grid_values(const Kind& k, int64_t rows, int64_t cols, uint64_t seed,
                                      int64_t amax_col, GridSpread spread = {}) {
  std::mt19937_64 g(seed);
  std::vector<float> v(size_t(rows * cols), 0.0f);
  auto pick = [&](int n) { return int(g() % uint64_t(n)); };
  const bool nvfp4 = !k.bf16 && k.spec.format == Format::kNvfp4;
  for (int64_t r = 0; r < rows; ++r) {
    if (nvfp4) {
      const float e2m1[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
      const float scales[] = {0.5f, 1.0f, 2.0f};
      for (int64_t b = 0; b < cols / 16; ++b) {
        float* blk = v.data() + r * cols + b * 16;
        if (amax_col / 16 == b) {
          blk[amax_col % 16] = (pick(2) ? 1.0f : -1.0f) * 6.0f * 448.0f * 0x1p-8f;
          continue;
        }
        const float s = scales[pick(3)];
        for (int c = 0; c < 16; ++c)
          blk[c] = (pick(2) ? 1.0f : -1.0f) * e2m1[pick(8)] * s * 0x1p-8f;
        blk[pick(16)] = (pick(2) ? 1.0f : -1.0f) * 6.0f * s * 0x1p-8f;
      }
    } else {
      for (int64_t b = 0; b < (cols + 31) / 32; ++b) {
        const float p = std::ldexp(1.0f, pick(spread.exponents) - spread.exponents / 2);
        for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c)
          v[size_t(r * cols + c)] = float(pick(2 * spread.max_int + 1) - spread.max_int) * p;
      }
      for (int64_t c = 0; c < std::min<int64_t>(cols, 16); ++c) v[size_t(r * cols + c)] = 0.0f;
    }
  }
  return v;
}

}  // namespace lockstep::gemm_test
