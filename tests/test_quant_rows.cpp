// The vectorised CPU row quantizers (src/quant/quantize_rows_cpu.h) against the CPU reference
// quantizer, byte for byte: every instruction set this CPU supports, F32 / BF16 / F16 inputs,
// every rowwise configuration they serve, random values, random bit patterns (NaN payloads,
// infinities, subnormals) and edge rows, row tails shorter than a vector chunk, and 1-3 threads.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lockstep/quant/quantize.h"
#include "quant/quantize_cpu.h"
#include "quant/quantize_rows_cpu.h"
#include "test_util.h"

namespace lockstep {
namespace {

using cpu::rows::Isa;
using test::same_bytes;

// The instruction sets to check: each one up to the best this CPU runs.
std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (int i = 0; i <= int(cpu::rows::best_isa()); ++i) v.push_back(Isa(i));
  return v;
}

// Restores the detected instruction set and thread count when a test ends.
struct IsaGuard {
  int threads = omp_get_max_threads();
  ~IsaGuard() {
    cpu::rows::set_isa(cpu::rows::best_isa());
    omp_set_num_threads(threads);
  }
};

// Values of one test input, by kind: 0 scaled normals, 1 random fp32 bit patterns, 2 normals with
// specials sprinkled in (NaN of both signs and several payloads, +-inf, +-0, subnormals, FLT_MAX),
// 3 rows that are all NaN or all zero alternating with normal rows, 4 tiny (subnormal-range)
// values.
std::vector<float> values(std::mt19937_64& rng, int kind, int64_t rows, int64_t cols) {
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<uint32_t> bits;
  const float scale = std::ldexp(1.0f, int(rng() % 40) - 20);
  const float specials[] = {NAN,
                            -NAN,
                            num::f32_from_bits(0x7F800001u),
                            num::f32_from_bits(0xFFC12345u),
                            INFINITY,
                            -INFINITY,
                            0.0f,
                            -0.0f,
                            1e-40f,
                            -3e-45f,
                            3.4028235e38f,
                            -3.4028235e38f,
                            448.0f,
                            6.0f,
                            5.0f};
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& x = v[size_t(r * cols + c)];
      switch (kind) {
        case 0:
          x = nd(rng) * scale;
          break;
        case 1:
          x = num::f32_from_bits(bits(rng));
          break;
        case 2:
          x = rng() % 8 == 0 ? specials[rng() % std::size(specials)] : nd(rng) * scale;
          break;
        case 3:
          x = r % 3 == 0 ? NAN : r % 3 == 1 ? 0.0f : nd(rng);
          break;
        default:
          x = nd(rng) * 1e-39f;
          break;
      }
    }
  return v;
}

// A host tensor of v in dtype dt (BF16 / F16 by bit truncation of random patterns for kind 1, so
// that their NaN payloads and subnormals reach the quantizer too).
Tensor input(const std::vector<float>& v, int64_t rows, int64_t cols, DType dt,
             std::mt19937_64& rng, int kind) {
  if (dt == DType::kF32) return test::mat(v, rows, cols);
  if (kind == 1) {
    std::vector<uint16_t> h(v.size());
    for (uint16_t& x : h) x = uint16_t(rng());
    Tensor t = Tensor::empty(dt, {rows, cols});
    std::copy(h.begin(), h.end(), t.ptr<uint16_t>());
    return t;
  }
  return cast(test::mat(v, rows, cols), dt);
}

QTensor reference(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                  int64_t& nonfinite) {
  std::vector<float> storage;
  const cpu::MatrixF32 m = cpu::as_matrix(x, storage, "x");
  nonfinite = 0;
  for (float f : m.values) nonfinite += std::isfinite(f) ? 0 : 1;
  return cpu::quantize(m, offsets, cfg);
}

struct Case {
  std::string label;
  QuantConfig cfg;
};

std::vector<Case> configs() {
  std::vector<Case> v;
  for (ScaleLayout layout : {ScaleLayout::kCompact, ScaleLayout::kSwizzled}) {
    const std::string l = layout == ScaleLayout::kSwizzled ? " swizzled" : "";
    for (Scaling s : {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kPerGroup})
      for (bool b2 : {false, true}) {
        QuantConfig c;
        c.format = Format::kNvfp4, c.scaling = s, c.block2d = b2, c.scale_layout = layout;
        v.push_back({fmt::format("nvfp4 {}{}{}", scaling_name(s), b2 ? " 2d" : "", l), c});
      }
    for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2}) {
      QuantConfig c;
      c.format = Format::kMxfp8, c.scaling = Scaling::kBlock1x32, c.elem = e,
      c.scale_layout = layout;
      v.push_back({fmt::format("mxfp8 {}{}", e == ElemCodec::kE5M2 ? "e5m2" : "e4m3", l), c});
    }
  }
  for (Scaling s :
       {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kPerGroup, Scaling::kBlock1x128})
    for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2})
      for (int opt = 0; opt < 3; ++opt) {
        QuantConfig c;
        c.format = Format::kFp8, c.scaling = s, c.elem = e;
        c.pow2 = opt == 1;
        c.eps = opt == 2 ? 1e-3f : 0.0f;
        v.push_back(
            {fmt::format("fp8 {} {}{}{}", scaling_name(s), e == ElemCodec::kE5M2 ? "e5m2" : "e4m3",
                         c.pow2 ? " pow2" : "", c.eps > 0 ? " eps" : ""),
             c});
      }
  return v;
}

// Compares one input under every config the row path takes; returns the number of comparisons.
int check_all(const Tensor& x, std::span<const int64_t> offsets, const std::string& what) {
  int compared = 0;
  for (const Case& c : configs()) {
    try {
      validate_quant_input("x", x.rows(), x.cols(), offsets, c.cfg);
    } catch (const QuantError&) {
      continue;  // a shape this config refuses
    }
    EXPECT_TRUE(cpu::rows_path_applies(x, c.cfg)) << c.label;
    int64_t nf_ref = 0, nf = -1;
    const QTensor want = reference(x, offsets, c.cfg, nf_ref);
    const QTensor got = cpu::quantize_rows(x, offsets, c.cfg, nf);
    EXPECT_TRUE(same_bytes(got, want)) << what << " " << c.label;
    EXPECT_EQ(nf, nf_ref) << what << " " << c.label;
    ++compared;
  }
  return compared;
}

TEST(QuantRows, SameBytesAsReferenceOnEveryIsa) {
  IsaGuard guard;
  std::mt19937_64 rng(test::test_seed());
  const int64_t shapes[][2] = {{1, 32},   {16, 256},  {3, 160}, {32, 544},
                               {16, 800}, {48, 1024}, {2, 2080}};
  int compared = 0;
  for (Isa isa : isas()) {
    cpu::rows::set_isa(isa);
    for (const auto& sh : shapes)
      for (int kind = 0; kind < 5; ++kind)
        for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
          const int64_t rows = sh[0], cols = sh[1];
          const Tensor x = input(values(rng, kind, rows, cols), rows, cols, dt, rng, kind);
          const std::string what = fmt::format("isa {} {}x{} {} kind {}", cpu::rows::isa_name(isa),
                                               rows, cols, dtype_name(dt), kind);
          compared += check_all(x, {}, what);
          std::vector<int64_t> offsets = {0, rows};
          if (rows % 16 == 0 && rows >= 32) offsets = {0, 16, 16, rows};  // an empty group
          compared += check_all(x, offsets, what + " grouped");
        }
  }
  EXPECT_GT(compared, 1000);
}

TEST(QuantRows, FP8ColumnsNotAMultipleOfSixteen) {
  IsaGuard guard;
  std::mt19937_64 rng(test::test_seed() + 1);
  for (Isa isa : isas()) {
    cpu::rows::set_isa(isa);
    for (int64_t cols : {1, 7, 129, 300})
      for (int kind = 0; kind < 5; ++kind) {
        const Tensor x = input(values(rng, kind, 5, cols), 5, cols, DType::kBF16, rng, kind);
        EXPECT_GT(
            check_all(x, {},
                      fmt::format("isa {} 5x{} kind {}", cpu::rows::isa_name(isa), cols, kind)),
            0);
      }
  }
}

TEST(QuantRows, AllNaNAndEmptyTensors) {
  IsaGuard guard;
  for (Isa isa : isas()) {
    cpu::rows::set_isa(isa);
    std::vector<float> nan(32 * 64, num::f32_from_bits(0xFFC01234u));
    nan[5] =
        num::f32_from_bits(0x7FA00001u);  // another payload: which one NVFP4 stores is the rule
    check_all(test::mat(nan, 32, 64), {}, fmt::format("all NaN, isa {}", cpu::rows::isa_name(isa)));
    check_all(Tensor::empty(DType::kBF16, {0, 64}), {}, "no rows");
  }
}

TEST(QuantRows, BytesIndependentOfThreadCount) {
  IsaGuard guard;
  std::mt19937_64 rng(test::test_seed() + 2);
  const Tensor x = input(values(rng, 2, 67, 512), 67, 512, DType::kBF16, rng, 2);
  for (const Case& c : configs()) {
    if (c.cfg.scaling == Scaling::kPerGroup || (c.cfg.block2d)) continue;
    int64_t nf = 0;
    omp_set_num_threads(1);
    const QTensor one = cpu::quantize_rows(x, {}, c.cfg, nf);
    for (int t : {2, 3}) {
      omp_set_num_threads(t);
      EXPECT_TRUE(same_bytes(cpu::quantize_rows(x, {}, c.cfg, nf), one))
          << c.label << " threads " << t;
    }
  }
}

TEST(QuantRows, PublicQuantizeTakesTheRowPathAndReportsNonFinite) {
  std::vector<float> v(16 * 64, 1.0f);
  v[3] = NAN, v[70] = -INFINITY;
  const Tensor x = cast(test::mat(v, 16, 64), DType::kBF16);
  QuantConfig c;
  c.format = Format::kNvfp4;
  c.scaling = Scaling::kPerRow;
  ASSERT_TRUE(cpu::rows_path_applies(x, c));
  QuantStats st;
  const QTensor q = quantize(x, c, "x", &st);
  EXPECT_EQ(st.nonfinite, 2);
  int64_t nf = 0;
  EXPECT_TRUE(same_bytes(q, reference(x, {}, c, nf)));
  c.stochastic = true;
  EXPECT_FALSE(cpu::rows_path_applies(x, c));  // stochastic rounding stays with the reference
}

TEST(QuantRows, SetIsaRefusesWhatTheCpuLacks) {
  IsaGuard guard;
  if (cpu::rows::best_isa() == Isa::kAvx512) GTEST_SKIP() << "this CPU runs every variant";
  EXPECT_THROW(cpu::rows::set_isa(Isa::kAvx512), std::invalid_argument);
}

}  // namespace
}  // namespace lockstep
