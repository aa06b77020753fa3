// Quantized GEMMs (docs/gemm.md): exactness on format-grid inputs for every operand pairing, the
// analytic error bound on random inputs, batch invariance, grouped == per-expert dense, the
// epilogue order and the errors that name shapes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "lockstep/gemm/qgemm.h"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/transcendental.h"
#include "lockstep/quant/quantize.h"
#include "gemm_operands.h"

using namespace lockstep;
namespace num = lockstep::num;

namespace {

using namespace lockstep::gemm_test;

uint64_t test_seed() {
  static const uint64_t s = [] {
    const uint64_t v = std::random_device{}();
    std::printf("test_gemm seed %llu\n", (unsigned long long)v);
    return v;
  }();
  return s;
}

// The premise of the exactness claim, from the decoded operands alone: every product, partial
// sum, chunk scale and scaled partial of the fp32 definition is an fp32 number (float64 emulation).
bool sums_are_exact(const DecodedOperand& a, const DecodedOperand& w) {
  auto f32 = [](double x) { return double(float(x)) == x; };
  const int64_t K = a.cols;
  const bool chunked = a.chunked || w.chunked;
  const int64_t chunk = chunked ? kGemmChunk : std::max<int64_t>(K, 1), chunks = chunked ? K / kGemmChunk : 1;
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < w.rows; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        double p = 0;
        for (int64_t k = c * chunk; k < std::min(K, (c + 1) * chunk); ++k) {
          p += double(a.inner[size_t(i * K + k)]) * double(w.inner[size_t(j * K + k)]);
          if (!f32(p)) return false;
        }
        const double s = (a.chunked ? a.chunk_scale[size_t(i * a.chunks + c)] : 1.0) *
                         (w.chunked ? w.chunk_scale[size_t(j * w.chunks + c)] : 1.0);
        if (!f32(s) || !f32(p * s)) return false;
        acc += p * s;
        if (!f32(acc)) return false;
      }
    }
  return true;
}

void expect_same_bits(const std::vector<float>& x, const std::vector<float>& y, const std::string& what) {
  ASSERT_EQ(x.size(), y.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (num::f32_bits(x[i]) != num::f32_bits(y[i]) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << ": " << x[i] << " vs " << y[i] << " (seed " << test_seed() << ")";
  EXPECT_EQ(bad, 0) << what;
}

struct Pairing {
  Kind a, w;
};

// Every pairing the recipes use (bf16, fp8 per-tensor / blocks, mxfp8, nvfp4 per-token / per-row,
// w4a16, w4a8) plus a few more to show that pairings compose.
std::vector<Pairing> pairings(bool pow2) {
  return {
      {bf16_kind(), bf16_kind()},
      {q_kind(Format::kFp8, Scaling::kPerTensor, pow2), q_kind(Format::kFp8, Scaling::kPerTensor, pow2)},
      {q_kind(Format::kFp8, Scaling::kPerRow, pow2), q_kind(Format::kFp8, Scaling::kPerRow, pow2)},
      {q_kind(Format::kFp8, Scaling::kBlock1x128, pow2), q_kind(Format::kFp8, Scaling::kBlock128x128, pow2)},
      {q_kind(Format::kFp8, Scaling::kBlock1x128, pow2), q_kind(Format::kFp8, Scaling::kBlock1x128, pow2)},
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kMxfp8, Scaling::kBlock1x32)},
      {q_kind(Format::kNvfp4, Scaling::kPerRow), q_kind(Format::kNvfp4, Scaling::kPerRow)},
      {q_kind(Format::kNvfp4, Scaling::kPerTensor), q_kind(Format::kNvfp4, Scaling::kPerTensor)},
      {bf16_kind(), q_kind(Format::kNvfp4, Scaling::kPerRow)},                     // w4a16
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kNvfp4, Scaling::kPerRow)},  // w4a8
      {q_kind(Format::kFp8, Scaling::kBlock1x128, pow2), q_kind(Format::kNvfp4, Scaling::kPerRow)},
      {q_kind(Format::kNvfp4, Scaling::kPerRow), bf16_kind()},
  };
}

}  // namespace

// ---- exactness --------------------------------------------------------------------------------

TEST(Gemm, GridInputsFastEqualsOracleEqualsExactSum) {
  const uint64_t seed = test_seed();
  const int64_t M = 7, N = 19, K = 256;
  for (const Pairing& p : pairings(/*pow2=*/true)) {
    const std::string what = p.a.label + " x " + p.w.label;
    Held a = make(p.a, grid_values(p.a, M, K, seed, /*amax_col=*/3), M, K);
    Held w = make(p.w, grid_values(p.w, N, K, seed + 1, /*amax_col=*/5), N, K);
    if (a.q) {
      ASSERT_EQ(dequantize(*a.q), a.x) << what << ": test input not lossless";
    }
    if (w.q) {
      ASSERT_EQ(dequantize(*w.q), w.x) << what << ": test input not lossless";
    }
    ASSERT_TRUE(sums_are_exact(decode_gemm_operand(a.op("a")), decode_gemm_operand(w.op("w")))) << what;
    const GemmResult fast = qgemm_cpu(a.op("a"), w.op("w"));
    const GemmResult oracle = qgemm_oracle_cpu(a.op("a"), w.op("w"));
    expect_same_bits(fast.d, oracle.d, what + " fast vs oracle");
    // Independent of the decoder: the exact sum of the original (lossless) inputs.
    std::vector<float> exact(size_t(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(a.x[size_t(i * K + k)]) * double(w.x[size_t(j * K + k)]);
        exact[size_t(i * N + j)] = float(s);
      }
    expect_same_bits(fast.d, exact, what + " fast vs exact sum of the inputs");
  }
}

TEST(Gemm, InnerTimesScalesIsTheQuantizersDequantize) {
  const uint64_t seed = test_seed();
  const int64_t R = 37, K = 256;
  for (const Pairing& p : pairings(/*pow2=*/false))
    for (const Kind& k : {p.a, p.w}) {
      if (k.bf16) continue;
      Held h = make(k, random_values(R * K, seed, 3.0f), R, K);
      const DecodedOperand d = decode_gemm_operand(h.op("x"));
      const std::vector<float> deq = dequantize(*h.q);
      std::vector<float> rebuilt(deq.size());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < K; ++c) {
          const float s = d.chunked ? d.chunk_scale[size_t(r * d.chunks + c / kGemmChunk)] : d.outer[size_t(r)];
          rebuilt[size_t(r * K + c)] = num::mul_rn(d.inner[size_t(r * K + c)], s);
        }
      expect_same_bits(rebuilt, deq, k.label);
    }
}

TEST(Gemm, RandomInputsWithinTheAnalyticBound) {
  const uint64_t seed = test_seed();
  const int64_t M = 9, N = 21, K = 512;
  for (const Pairing& p : pairings(/*pow2=*/false)) {
    const std::string what = p.a.label + " x " + p.w.label;
    Held a = make(p.a, random_values(M * K, seed, 2.0f), M, K);
    Held w = make(p.w, random_values(N * K, seed + 7, 0.05f), N, K);
    const GemmResult fast = qgemm_cpu(a.op("a"), w.op("w"));
    const GemmF64 ref = qgemm_f64_cpu(a.op("a"), w.op("w"));
    const double g = gemm_gamma(ref.gamma_n) * (1.0 + 0x1p-20);  // slack for float64's own rounding
    double worst = 0;
    for (size_t e = 0; e < fast.d.size(); ++e) {
      const double err = std::fabs(double(fast.d[e]) - ref.d64[e]);
      ASSERT_LE(err, g * ref.abs_terms[e]) << what << " element " << e << " seed " << seed;
      if (ref.abs_terms[e] > 0) worst = std::max(worst, err / ref.abs_terms[e]);
    }
    EXPECT_GT(worst, 0.0) << what << ": random inputs should round somewhere";
    const GemmResult oracle = qgemm_oracle_cpu(a.op("a"), w.op("w"));
    for (size_t e = 0; e < oracle.d.size(); ++e)
      EXPECT_LE(std::fabs(double(oracle.d[e]) - ref.d64[e]), 0x1p-24 * std::fabs(ref.d64[e]) * (1 + 0x1p-20)) << what;
  }
}

// ---- batch invariance ---------------------------------------------------------------------------

TEST(Gemm, RowBitsDoNotDependOnTheBatchOrThreads) {
  const uint64_t seed = test_seed();
  const int64_t M = 37, N = 23, K = 256;
  const std::vector<Pairing> row_local = {
      {bf16_kind(), bf16_kind()},
      {q_kind(Format::kNvfp4, Scaling::kPerRow), q_kind(Format::kNvfp4, Scaling::kPerRow)},
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kMxfp8, Scaling::kBlock1x32)},
      {q_kind(Format::kFp8, Scaling::kBlock1x128), q_kind(Format::kFp8, Scaling::kBlock128x128)},
      {q_kind(Format::kFp8, Scaling::kPerRow), q_kind(Format::kFp8, Scaling::kPerTensor)},
      {bf16_kind(), q_kind(Format::kNvfp4, Scaling::kPerRow)},
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kNvfp4, Scaling::kPerRow)},
  };
  const std::vector<float> xa = random_values(M * K, seed, 1.5f), xw = random_values(N * K, seed + 3, 0.1f);
  const int saved = omp_get_max_threads();
  for (const Pairing& p : row_local) {
    const std::string what = p.a.label + " x " + p.w.label;
    Held w = make(p.w, xw, N, K);
    GemmEpilogue ep;
    ep.row_amax = true;
    omp_set_num_threads(1);
    const GemmResult full = qgemm_cpu(make(p.a, xa, M, K).op("a"), w.op("w"), ep);
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      expect_same_bits(qgemm_cpu(make(p.a, xa, M, K).op("a"), w.op("w"), ep).d, full.d, what + " threads");
    }
    omp_set_num_threads(saved);
    // Each row alone.
    for (int64_t i : {int64_t(0), int64_t(5), M - 1}) {
      std::vector<float> row(xa.begin() + i * K, xa.begin() + (i + 1) * K);
      const GemmResult one = qgemm_cpu(make(p.a, row, 1, K).op("a"), w.op("w"), ep);
      expect_same_bits(one.d, std::vector<float>(full.d.begin() + i * N, full.d.begin() + (i + 1) * N),
                       what + " row " + std::to_string(i) + " alone");
      EXPECT_EQ(num::f32_bits(one.row_amax[0]), num::f32_bits(full.row_amax[size_t(i)]));
    }
    // A reversed-and-rotated batch.
    std::vector<int64_t> perm(static_cast<size_t>(M));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
    std::vector<float> xp(size_t(M * K));
    for (int64_t i = 0; i < M; ++i) std::copy_n(xa.begin() + perm[size_t(i)] * K, K, xp.begin() + i * K);
    const GemmResult permuted = qgemm_cpu(make(p.a, xp, M, K).op("a"), w.op("w"), ep);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        ASSERT_EQ(num::f32_bits(permuted.d[size_t(i * N + j)]), num::f32_bits(full.d[size_t(perm[size_t(i)] * N + j)]))
            << what << " permuted row " << i << " seed " << seed;
  }
}

// ---- grouped ------------------------------------------------------------------------------------

TEST(Gemm, GroupedEqualsPerExpertDense) {
  const uint64_t seed = test_seed();
  const int64_t K = 128, N = 24, E = 5;
  const std::vector<int64_t> offsets{0, 7, 7, 23, 24, 40};  // expert 1 has no tokens
  const int64_t T = offsets.back();
  const std::vector<float> xa = random_values(T * K, seed, 1.0f), xw = random_values(E * N * K, seed + 5, 0.1f);
  std::vector<float> bias = random_values(E * N, seed + 9, 0.5f), prob = random_values(T, seed + 11, 0.25f);
  for (auto& p : prob) p = std::fabs(p);
  std::vector<int64_t> woffs(size_t(E + 1));
  for (int64_t e = 0; e <= E; ++e) woffs[size_t(e)] = e * N;
  struct Case {
    Kind a, w;
  };
  for (const Case& c : std::vector<Case>{{q_kind(Format::kNvfp4, Scaling::kPerRow), q_kind(Format::kNvfp4, Scaling::kPerGroup)},
                                         {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kNvfp4, Scaling::kPerRow)},
                                         {bf16_kind(), q_kind(Format::kNvfp4, Scaling::kPerGroup)},
                                         {q_kind(Format::kFp8, Scaling::kBlock1x128), q_kind(Format::kFp8, Scaling::kPerGroup)}}) {
    const std::string what = c.a.label + " x " + c.w.label;
    Held a{xa, T, K, std::nullopt};
    if (!c.a.bf16) a.q = quantize_grouped(MatrixF32{a.x, T, K, num::kFltMax, "a"}, offsets, c.a.spec);
    Held w{xw, E * N, K, quantize_grouped(MatrixF32{xw, E * N, K, num::kFltMax, "w"}, woffs, c.w.spec)};
    for (bool fused : {false, true}) {
      GemmEpilogue ep;
      ep.bias = bias;
      ep.row_amax = true;
      ep.swiglu = fused;
      if (fused) ep.router_prob = prob;
      const GemmResult g = grouped_qgemm_cpu(a.op("a"), offsets, w.op("w"), ep);
      ASSERT_EQ(g.rows, T);
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = offsets[size_t(e)], rows = offsets[size_t(e + 1)] - r0;
        if (rows == 0) continue;
        std::vector<float> ae(xa.begin() + r0 * K, xa.begin() + (r0 + rows) * K);
        std::vector<float> we(xw.begin() + e * N * K, xw.begin() + (e + 1) * N * K);
        Kind wk = c.w;
        if (wk.spec.scaling == Scaling::kPerGroup) wk.spec.scaling = Scaling::kPerTensor;  // one expert alone
        GemmEpilogue de = ep;
        de.bias = std::span<const float>(bias).subspan(size_t(e * N), size_t(N));
        if (fused) de.router_prob = std::span<const float>(prob).subspan(size_t(r0), size_t(rows));
        const GemmResult d = qgemm_cpu(make(c.a, ae, rows, K).op("a"), make(wk, we, N, K).op("w"), de);
        expect_same_bits(d.d, std::vector<float>(g.d.begin() + r0 * g.cols, g.d.begin() + (r0 + rows) * g.cols),
                         what + " expert " + std::to_string(e) + (fused ? " swiglu" : ""));
        expect_same_bits(d.row_amax, std::vector<float>(g.row_amax.begin() + r0, g.row_amax.begin() + r0 + rows),
                         what + " row amax");
      }
    }
  }
}

TEST(Gemm, GroupedPaddingRowsGiveZero) {
  const uint64_t seed = test_seed();
  const int64_t K = 64, N = 8, E = 3;
  const std::vector<int64_t> offsets{0, 16, 16, 48}, used{5, 0, 17};
  std::vector<float> xa(size_t(48 * K), 0.0f);
  const std::vector<float> real = random_values(48 * K, seed);
  for (int64_t e = 0; e < E; ++e)
    std::copy_n(real.begin() + offsets[size_t(e)] * K, used[size_t(e)] * K, xa.begin() + offsets[size_t(e)] * K);
  QTensor qa = quantize_grouped(MatrixF32{xa, 48, K, num::kFltMax, "a"}, offsets, q_kind(Format::kNvfp4, Scaling::kPerRow).spec);
  const std::vector<float> xw = random_values(E * N * K, seed + 1);
  QTensor qw = quantize(MatrixF32{xw, E * N, K, num::kFltMax, "w"}, q_kind(Format::kNvfp4, Scaling::kPerRow).spec);
  const std::vector<float> bias(size_t(E * N), 1.5f);
  GemmEpilogue ep;
  ep.bias = bias;
  ep.row_amax = true;
  const GemmResult g = grouped_qgemm_cpu(GemmOperand::quantized(qa, "a"), offsets, GemmOperand::quantized(qw, "w"), ep, used);
  const GemmResult all = grouped_qgemm_cpu(GemmOperand::quantized(qa, "a"), offsets, GemmOperand::quantized(qw, "w"), ep);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets[size_t(e)]; r < offsets[size_t(e + 1)]; ++r) {
      const bool pad = r - offsets[size_t(e)] >= used[size_t(e)];
      for (int64_t j = 0; j < N; ++j) {
        const float v = g.d[size_t(r * N + j)];
        if (pad)
          ASSERT_EQ(num::f32_bits(v), 0u) << "padding row " << r;
        else
          ASSERT_EQ(num::f32_bits(v), num::f32_bits(all.d[size_t(r * N + j)])) << "row " << r;
      }
      if (pad) {
        EXPECT_EQ(g.row_amax[size_t(r)], 0.0f);
        // Without group_rows, a zero row gives the epilogue of acc = +0: here the bias.
        EXPECT_EQ(all.d[size_t(r * N)], 1.5f);
      }
    }
}

// ---- epilogue -----------------------------------------------------------------------------------

TEST(Gemm, EpilogueOrderAlphaBiasSwigluBf16Amax) {
  const uint64_t seed = test_seed();
  const int64_t M = 6, N = 64, K = 32;  // I = 32: the output can be NVFP4-quantized per row
  const std::vector<float> xa = random_values(M * K, seed), xw = random_values(N * K, seed + 1, 0.3f);
  const GemmOperand a = GemmOperand::bf16(xa, M, K, "a"), w = GemmOperand::bf16(xw, N, K, "w");
  const GemmResult raw = qgemm_cpu(a, w);
  const std::vector<float> bias = random_values(N, seed + 2);
  const std::vector<float> prob{0.5f, 0.25f, 1.0f, 0.125f, 0.3f, 0.0f};
  GemmEpilogue unit;
  unit.alpha = 1.0f;
  expect_same_bits(qgemm_cpu(a, w, unit).d, raw.d, "alpha = 1 is the identity");
  for (bool bf16 : {false, true})
    for (bool swiglu : {false, true}) {
      GemmEpilogue ep;
      ep.alpha = 0.7f;
      ep.bias = bias;
      ep.out_bf16 = bf16;
      ep.swiglu = swiglu;
      if (swiglu) ep.router_prob = prob;
      ep.row_amax = true;
      const GemmResult r = qgemm_cpu(a, w, ep);
      const int64_t oc = swiglu ? N / 2 : N;
      ASSERT_EQ(r.cols, oc);
      for (int64_t i = 0; i < M; ++i) {
        float amax = 0.0f;
        for (int64_t c = 0; c < oc; ++c) {
          auto v = [&](int64_t j) { return (0.7f * raw.d[size_t(i * N + j)]) + bias[size_t(j)]; };  // RN, RN
          float y = swiglu ? num::swiglu_weighted_f32(v(c), v(oc + c), prob[size_t(i)]) : v(c);
          if (bf16) {
            EXPECT_EQ(r.d_bf16[size_t(i * oc + c)], num::f32_to_bf16(y));
            y = num::bf16_to_f32(num::f32_to_bf16(y));
          }
          ASSERT_EQ(num::f32_bits(r.d[size_t(i * oc + c)]), num::f32_bits(y)) << i << "," << c;
          amax = std::max(amax, std::fabs(y));
        }
        EXPECT_EQ(r.row_amax[size_t(i)], amax);
      }
      if (swiglu && !bf16) {
        // FC2 handoff: the row amax is what per-row NVFP4 quantization of the output computes.
        QuantSpec s;
        s.format = Format::kNvfp4;
        s.scaling = Scaling::kPerRow;
        const QTensor q = quantize(MatrixF32{r.d, M, oc, num::kFltMax, "y"}, s);
        expect_same_bits(q.amax, r.row_amax, "row amax vs quantizer amax");
      }
    }
  // Order is alpha then bias: D = 1, alpha = 2, bias = 3 gives 5 (not 8).
  const std::vector<float> one(16, 0.0f);
  std::vector<float> e0 = one;
  e0[0] = 1.0f;
  const std::vector<float> three{3.0f};
  GemmEpilogue ob;
  ob.alpha = 2.0f;
  ob.bias = three;
  EXPECT_EQ(qgemm_cpu(GemmOperand::bf16(e0, 1, 16, "a"), GemmOperand::bf16(e0, 1, 16, "w"), ob).d[0], 5.0f);
}

// ---- errors ---------------------------------------------------------------------------------------

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const GemmError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Gemm, ErrorsNameTheShapesAndTheRule) {
  const std::vector<float> x(8 * 256, 1.0f);
  const GemmOperand a = GemmOperand::bf16(std::span(x).first(4 * 32), 4, 32, "a");
  const GemmOperand w = GemmOperand::bf16(std::span(x).first(8 * 64), 8, 64, "w");
  std::string m = error_of([&] { qgemm_cpu(a, w); });
  EXPECT_NE(m.find("K mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 32]"), std::string::npos) << m;
  EXPECT_NE(m.find("[8, 64]"), std::string::npos) << m;
  // fp8 1x128 blocks with K = 64: the quantizer accepts a ragged block, the GEMM needs K % 128.
  const QTensor q = quantize(MatrixF32{std::span(x).first(4 * 64), 4, 64, num::kFltMax, "a"},
                             q_kind(Format::kFp8, Scaling::kBlock1x128).spec);
  m = error_of([&] { qgemm_cpu(GemmOperand::quantized(q, "a"), w); });
  EXPECT_NE(m.find("K % 128"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 64]"), std::string::npos) << m;
  // Grouped: offsets that decrease, do not cover A, or W rows not experts x N.
  const GemmOperand ag = GemmOperand::bf16(std::span(x).first(6 * 64), 6, 64, "a");
  m = error_of([&] { grouped_qgemm_cpu(ag, std::vector<int64_t>{0, 4, 2, 6}, GemmOperand::bf16(std::span(x).first(9 * 64), 9, 64, "w")); });
  EXPECT_NE(m.find("decrease"), std::string::npos) << m;
  m = error_of([&] { grouped_qgemm_cpu(ag, std::vector<int64_t>{0, 5}, w); });
  EXPECT_NE(m.find("end at A's rows 6"), std::string::npos) << m;
  m = error_of([&] { grouped_qgemm_cpu(ag, std::vector<int64_t>{0, 2, 4, 6}, w); });
  EXPECT_NE(m.find("experts (3)"), std::string::npos) << m;
  m = error_of([&] { grouped_qgemm_cpu(ag, std::vector<int64_t>{0, 2, 6}, w, {}, std::vector<int64_t>{3, 1}); });
  EXPECT_NE(m.find("group_rows"), std::string::npos) << m;
  // Epilogue shapes.
  GemmEpilogue odd;
  odd.swiglu = true;
  const GemmOperand w7 = GemmOperand::bf16(std::span(x).first(7 * 32), 7, 32, "w");
  m = error_of([&] { qgemm_cpu(a, w7, odd); });
  EXPECT_NE(m.find("even N"), std::string::npos) << m;
  GemmEpilogue badbias;
  const std::vector<float> b3(3, 0.0f);
  badbias.bias = b3;
  m = error_of([&] { qgemm_cpu(a, w7, badbias); });
  EXPECT_NE(m.find("bias has 3 values, want 7"), std::string::npos) << m;
}

TEST(Gemm, EmptyShapesAndRepeatability) {
  const std::vector<float> x(4 * 32, 0.5f);
  const GemmResult e = qgemm_cpu(GemmOperand::bf16({}, 0, 32, "a"), GemmOperand::bf16(x, 4, 32, "w"));
  EXPECT_EQ(e.rows, 0);
  EXPECT_TRUE(e.d.empty());
  const GemmResult k0 = qgemm_cpu(GemmOperand::bf16({}, 3, 0, "a"), GemmOperand::bf16({}, 2, 0, "w"));
  ASSERT_EQ(k0.d.size(), 6u);
  for (float v : k0.d) EXPECT_EQ(num::f32_bits(v), 0u);  // acc = +0
  const std::vector<float> r = random_values(33 * 96, test_seed());
  const GemmOperand a = GemmOperand::bf16(r, 33, 96, "a");
  expect_same_bits(qgemm_cpu(a, a).d, qgemm_cpu(a, a).d, "run twice");
}
