// Quantized GEMMs (docs/gemm.md): exactness on format-grid inputs for every operand pairing, the
// analytic error bound on random inputs, batch invariance, grouped == per-expert dense, the
// epilogue order and the errors that name shapes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "../src/gemm/operand.h"
#include "gemm_operands.h"
#include "lockstep/gemm/oracle.h"
#include "lockstep/gemm/qgemm.h"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/transcendental.h"
#include "lockstep/quant/quantize.h"
#include "test_util.h"

using namespace lockstep;
namespace num = lockstep::num;

namespace {

using namespace lockstep::gemm_test;
using gemm::DecodedOperand;
using lockstep::test::error_of;
using lockstep::test::floats;
using lockstep::test::test_seed;

constexpr int64_t kGemmChunk = gemm::kChunk;

DecodedOperand decode_gemm_operand(const GemmArg& op) {
  return gemm::decode_operand(op, Copy::kRowwise, 0, op.rows(Copy::kRowwise), "x");
}

GemmConfig with(const GemmEpilogue& ep) {
  GemmConfig c;
  c.epilogue = ep;
  return c;
}

Tensor vec_tensor(const std::vector<float>& v) {
  return Tensor::from_vector<float>(v, {int64_t(v.size())}, DType::kF32);
}
Tensor offsets_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}, DType::kI64);
}
std::vector<float> dequant(const QTensor& q) { return floats(dequantize(q)); }

// The premise of the exactness claim, from the decoded operands alone: every product, partial
// sum, chunk scale and scaled partial of the fp32 definition is an fp32 number (float64 emulation).
bool sums_are_exact(const DecodedOperand& a, const DecodedOperand& w) {
  auto f32 = [](double x) { return double(float(x)) == x; };
  const int64_t K = a.cols;
  const bool chunked = a.chunked || w.chunked;
  const int64_t chunk = chunked ? kGemmChunk : std::max<int64_t>(K, 1),
                chunks = chunked ? K / kGemmChunk : 1;
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

void expect_same_bits(const std::vector<float>& x, const std::vector<float>& y,
                      const std::string& what);
void expect_same_bits(const Tensor& x, const Tensor& y, const std::string& what) {
  expect_same_bits(floats(x), floats(y), what);
}
void expect_same_bits(const Tensor& x, const std::vector<float>& y, const std::string& what) {
  expect_same_bits(floats(x), y, what);
}
void expect_same_bits(const std::vector<float>& x, const std::vector<float>& y,
                      const std::string& what) {
  ASSERT_EQ(x.size(), y.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (num::f32_bits(x[i]) != num::f32_bits(y[i]) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << ": " << x[i] << " vs " << y[i] << " (seed "
                    << test_seed() << ")";
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
      {q_kind(Format::kFp8, Scaling::kPerTensor, pow2),
       q_kind(Format::kFp8, Scaling::kPerTensor, pow2)},
      {q_kind(Format::kFp8, Scaling::kPerRow, pow2), q_kind(Format::kFp8, Scaling::kPerRow, pow2)},
      {q_kind(Format::kFp8, Scaling::kBlock1x128, pow2),
       q_kind(Format::kFp8, Scaling::kBlock128x128, pow2)},
      {q_kind(Format::kFp8, Scaling::kBlock1x128, pow2),
       q_kind(Format::kFp8, Scaling::kBlock1x128, pow2)},
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kMxfp8, Scaling::kBlock1x32)},
      {q_kind(Format::kNvfp4, Scaling::kPerRow), q_kind(Format::kNvfp4, Scaling::kPerRow)},
      {q_kind(Format::kNvfp4, Scaling::kPerTensor), q_kind(Format::kNvfp4, Scaling::kPerTensor)},
      {bf16_kind(), q_kind(Format::kNvfp4, Scaling::kPerRow)},  // w4a16
      {q_kind(Format::kMxfp8, Scaling::kBlock1x32),
       q_kind(Format::kNvfp4, Scaling::kPerRow)},  // w4a8
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
      ASSERT_EQ(dequant(*a.q), a.x) << what << ": test input not lossless";
    }
    if (w.q) {
      ASSERT_EQ(dequant(*w.q), w.x) << what << ": test input not lossless";
    }
    ASSERT_TRUE(sums_are_exact(decode_gemm_operand(a.op("a")), decode_gemm_operand(w.op("w"))))
        << what;
    const GemmResult fast = qgemm(a.op("a"), w.op("w"));
    const GemmResult oracle = qgemm_oracle(a.op("a"), w.op("w"));
    expect_same_bits(fast.d, oracle.d, what + " fast vs oracle");
    // Independent of the decoder: the exact sum of the original (lossless) inputs.
    std::vector<float> exact(size_t(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += double(a.x[size_t(i * K + k)]) * double(w.x[size_t(j * K + k)]);
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
      const std::vector<float> deq = dequant(*h.q);
      std::vector<float> rebuilt(deq.size());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < K; ++c) {
          const float s =
              d.chunked ? d.chunk_scale[size_t(r * d.chunks + c / kGemmChunk)] : d.outer[size_t(r)];
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
    const std::vector<float> fast = floats(qgemm(a.op("a"), w.op("w")).d);
    const GemmF64 ref = qgemm_f64(a.op("a"), w.op("w"));
    const double g = gemm_gamma(ref.gamma_n) * (1.0 + 0x1p-20);  // slack for float64's own rounding
    double worst = 0;
    for (size_t e = 0; e < fast.size(); ++e) {
      const double err = std::fabs(double(fast[e]) - ref.d64[e]);
      ASSERT_LE(err, g * ref.abs_terms[e]) << what << " element " << e << " seed " << seed;
      if (ref.abs_terms[e] > 0) worst = std::max(worst, err / ref.abs_terms[e]);
    }
    EXPECT_GT(worst, 0.0) << what << ": random inputs should round somewhere";
    const std::vector<float> oracle = floats(qgemm_oracle(a.op("a"), w.op("w")).d);
    for (size_t e = 0; e < oracle.size(); ++e)
      EXPECT_LE(std::fabs(double(oracle[e]) - ref.d64[e]),
                0x1p-24 * std::fabs(ref.d64[e]) * (1 + 0x1p-20))
          << what;
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
  const std::vector<float> xa = random_values(M * K, seed, 1.5f),
                           xw = random_values(N * K, seed + 3, 0.1f);
  const int saved = omp_get_max_threads();
  for (const Pairing& p : row_local) {
    const std::string what = p.a.label + " x " + p.w.label;
    Held w = make(p.w, xw, N, K);
    GemmEpilogue ep;
    ep.row_amax = true;
    omp_set_num_threads(1);
    const Held a_full = make(p.a, xa, M, K);
    const GemmResult full_r = qgemm(a_full.op("a"), w.op("w"), with(ep));
    const std::vector<float> full = floats(full_r.d), full_amax = floats(full_r.row_amax);
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      expect_same_bits(qgemm(a_full.op("a"), w.op("w"), with(ep)).d, full, what + " threads");
    }
    omp_set_num_threads(saved);
    // Each row alone.
    for (int64_t i : {int64_t(0), int64_t(5), M - 1}) {
      std::vector<float> row(xa.begin() + i * K, xa.begin() + (i + 1) * K);
      const Held a_one = make(p.a, row, 1, K);
      const GemmResult one = qgemm(a_one.op("a"), w.op("w"), with(ep));
      expect_same_bits(one.d, std::vector<float>(full.begin() + i * N, full.begin() + (i + 1) * N),
                       what + " row " + std::to_string(i) + " alone");
      EXPECT_EQ(num::f32_bits(floats(one.row_amax)[0]), num::f32_bits(full_amax[size_t(i)]));
    }
    // A reversed-and-rotated batch.
    std::vector<int64_t> perm(static_cast<size_t>(M));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
    std::vector<float> xp(size_t(M * K));
    for (int64_t i = 0; i < M; ++i)
      std::copy_n(xa.begin() + perm[size_t(i)] * K, K, xp.begin() + i * K);
    const Held a_perm = make(p.a, xp, M, K);
    const std::vector<float> permuted = floats(qgemm(a_perm.op("a"), w.op("w"), with(ep)).d);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        ASSERT_EQ(num::f32_bits(permuted[size_t(i * N + j)]),
                  num::f32_bits(full[size_t(perm[size_t(i)] * N + j)]))
            << what << " permuted row " << i << " seed " << seed;
  }
}

// ---- grouped ------------------------------------------------------------------------------------

TEST(Gemm, GroupedEqualsPerExpertDense) {
  const uint64_t seed = test_seed();
  const int64_t K = 128, N = 24, E = 5;
  const std::vector<int64_t> offsets{0, 7, 7, 23, 24, 40};  // expert 1 has no tokens
  const int64_t T = offsets.back();
  const std::vector<float> xa = random_values(T * K, seed, 1.0f),
                           xw = random_values(E * N * K, seed + 5, 0.1f);
  std::vector<float> bias = random_values(E * N, seed + 9, 0.5f),
                     prob = random_values(T, seed + 11, 0.25f);
  for (auto& p : prob) p = std::fabs(p);
  std::vector<int64_t> woffs(size_t(E + 1));
  for (int64_t e = 0; e <= E; ++e) woffs[size_t(e)] = e * N;
  struct Case {
    Kind a, w;
  };
  for (const Case& c : std::vector<Case>{
           {q_kind(Format::kNvfp4, Scaling::kPerRow), q_kind(Format::kNvfp4, Scaling::kPerGroup)},
           {q_kind(Format::kMxfp8, Scaling::kBlock1x32), q_kind(Format::kNvfp4, Scaling::kPerRow)},
           {bf16_kind(), q_kind(Format::kNvfp4, Scaling::kPerGroup)},
           {q_kind(Format::kFp8, Scaling::kBlock1x128),
            q_kind(Format::kFp8, Scaling::kPerGroup)}}) {
    const std::string what = c.a.label + " x " + c.w.label;
    const Held a = make(c.a, xa, T, K, offsets);
    const Held w = make(c.w, xw, E * N, K, woffs);
    for (bool fused : {false, true}) {
      GemmEpilogue ep;
      ep.bias = vec_tensor(bias);
      ep.row_amax = true;
      ep.swiglu = fused;
      if (fused) ep.router_prob = vec_tensor(prob);
      const GemmResult gr = grouped_qgemm(a.op("a"), offsets_tensor(offsets), w.op("w"), with(ep));
      ASSERT_EQ(gr.d.rows(), T);
      const std::vector<float> gd = floats(gr.d), gamax = floats(gr.row_amax);
      const int64_t gcols = gr.d.cols();
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = offsets[size_t(e)], rows = offsets[size_t(e + 1)] - r0;
        if (rows == 0) continue;
        std::vector<float> ae(xa.begin() + r0 * K, xa.begin() + (r0 + rows) * K);
        std::vector<float> we(xw.begin() + e * N * K, xw.begin() + (e + 1) * N * K);
        Kind wk = c.w;
        if (wk.spec.scaling == Scaling::kPerGroup)
          wk.spec.scaling = Scaling::kPerTensor;  // one expert alone
        GemmEpilogue de = ep;
        de.bias = vec_tensor(std::vector<float>(bias.begin() + e * N, bias.begin() + (e + 1) * N));
        if (fused)
          de.router_prob =
              vec_tensor(std::vector<float>(prob.begin() + r0, prob.begin() + r0 + rows));
        const Held ah = make(c.a, ae, rows, K), wh = make(wk, we, N, K);
        const GemmResult d = qgemm(ah.op("a"), wh.op("w"), with(de));
        expect_same_bits(
            d.d, std::vector<float>(gd.begin() + r0 * gcols, gd.begin() + (r0 + rows) * gcols),
            what + " expert " + std::to_string(e) + (fused ? " swiglu" : ""));
        expect_same_bits(d.row_amax,
                         std::vector<float>(gamax.begin() + r0, gamax.begin() + r0 + rows),
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
    std::copy_n(real.begin() + offsets[size_t(e)] * K, used[size_t(e)] * K,
                xa.begin() + offsets[size_t(e)] * K);
  QTensor qa = quantize_grouped(f32_tensor(xa, 48, K), offsets,
                                q_kind(Format::kNvfp4, Scaling::kPerRow).spec, "a");
  const std::vector<float> xw = random_values(E * N * K, seed + 1);
  QTensor qw =
      quantize(f32_tensor(xw, E * N, K), q_kind(Format::kNvfp4, Scaling::kPerRow).spec, "w");
  const std::vector<float> bias(size_t(E * N), 1.5f);
  GemmEpilogue ep;
  ep.bias = vec_tensor(bias);
  ep.row_amax = true;
  GemmConfig cfg = with(ep);
  cfg.group_rows = offsets_tensor(used);
  const GemmResult gr = grouped_qgemm(qa, offsets_tensor(offsets), qw, cfg);
  const GemmResult allr = grouped_qgemm(qa, offsets_tensor(offsets), qw, with(ep));
  const std::vector<float> gd = floats(gr.d), ad = floats(allr.d), gamax = floats(gr.row_amax);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets[size_t(e)]; r < offsets[size_t(e + 1)]; ++r) {
      const bool pad = r - offsets[size_t(e)] >= used[size_t(e)];
      for (int64_t j = 0; j < N; ++j) {
        const float v = gd[size_t(r * N + j)];
        if (pad)
          ASSERT_EQ(num::f32_bits(v), 0u) << "padding row " << r;
        else
          ASSERT_EQ(num::f32_bits(v), num::f32_bits(ad[size_t(r * N + j)])) << "row " << r;
      }
      if (pad) {
        EXPECT_EQ(gamax[size_t(r)], 0.0f);
        // Without group_rows, a zero row gives the epilogue of acc = +0: here the bias.
        EXPECT_EQ(ad[size_t(r * N)], 1.5f);
      }
    }
}

// ---- epilogue -----------------------------------------------------------------------------------

TEST(Gemm, EpilogueOrderAlphaBiasSwigluBf16Amax) {
  const uint64_t seed = test_seed();
  const int64_t M = 6, N = 64, K = 32;  // I = 32: the output can be NVFP4-quantized per row
  const std::vector<float> xa = random_values(M * K, seed),
                           xw = random_values(N * K, seed + 1, 0.3f);
  const Tensor a = from_f32(xa, {M, K}, DType::kBF16), w = from_f32(xw, {N, K}, DType::kBF16);
  const std::vector<float> raw = floats(qgemm(a, w).d);
  const std::vector<float> bias = random_values(N, seed + 2);
  const std::vector<float> prob{0.5f, 0.25f, 1.0f, 0.125f, 0.3f, 0.0f};
  GemmEpilogue unit;
  unit.alpha = 1.0f;
  expect_same_bits(qgemm(a, w, with(unit)).d, raw, "alpha = 1 is the identity");
  for (bool bf16 : {false, true})
    for (bool swiglu : {false, true}) {
      GemmEpilogue ep;
      ep.alpha = 0.7f;
      ep.bias = vec_tensor(bias);
      ep.swiglu = swiglu;
      if (swiglu) ep.router_prob = vec_tensor(prob);
      ep.row_amax = true;
      GemmConfig cfg = with(ep);
      cfg.out_dtype = bf16 ? DType::kBF16 : DType::kF32;
      const GemmResult rr = qgemm(a, w, cfg);
      const int64_t oc = swiglu ? N / 2 : N;
      ASSERT_EQ(rr.d.cols(), oc);
      ASSERT_EQ(rr.d.dtype(), cfg.out_dtype);
      const std::vector<float> rd = floats(cast(rr.d, DType::kF32)), ramax = floats(rr.row_amax);
      for (int64_t i = 0; i < M; ++i) {
        float amax = 0.0f;
        for (int64_t c = 0; c < oc; ++c) {
          auto v = [&](int64_t j) {
            return (0.7f * raw[size_t(i * N + j)]) + bias[size_t(j)];
          };  // RN, RN
          float y = swiglu ? num::swiglu_weighted_f32(v(c), v(oc + c), prob[size_t(i)]) : v(c);
          if (bf16) y = num::bf16_to_f32(num::f32_to_bf16(y));
          ASSERT_EQ(num::f32_bits(rd[size_t(i * oc + c)]), num::f32_bits(y)) << i << "," << c;
          amax = std::max(amax, std::fabs(y));
        }
        EXPECT_EQ(ramax[size_t(i)], amax);
      }
      if (swiglu && !bf16) {
        // FC2 handoff: the row amax is what per-row NVFP4 quantization of the output computes.
        QuantConfig s;
        s.format = Format::kNvfp4;
        s.scaling = Scaling::kPerRow;
        const QTensor q = quantize(rr.d, s, "y");
        expect_same_bits(q.rowwise.amax, rr.row_amax, "row amax vs quantizer amax");
      }
    }
  // Order is alpha then bias: D = 1, alpha = 2, bias = 3 gives 5 (not 8).
  const std::vector<float> one(16, 0.0f);
  std::vector<float> e0 = one;
  e0[0] = 1.0f;
  GemmEpilogue ob;
  ob.alpha = 2.0f;
  ob.bias = vec_tensor({3.0f});
  const Tensor e0t = from_f32(e0, {1, 16}, DType::kBF16);
  EXPECT_EQ(floats(qgemm(e0t, e0t, with(ob)).d)[0], 5.0f);
}

// ---- errors
// ---------------------------------------------------------------------------------------

TEST(Gemm, ErrorsNameTheShapesAndTheRule) {
  const std::vector<float> x(8 * 256, 1.0f);
  auto dense = [&](int64_t r, int64_t c) {
    return from_f32(std::span(x).first(size_t(r * c)), {r, c}, DType::kBF16);
  };
  const Tensor a = dense(4, 32), w = dense(8, 64);
  std::string m = error_of<GemmError>([&] { qgemm(a, w); });
  EXPECT_NE(m.find("K mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 32]"), std::string::npos) << m;
  EXPECT_NE(m.find("[8, 64]"), std::string::npos) << m;
  // fp8 1x128 blocks with K = 64: the quantizer accepts a ragged block, the GEMM needs K % 128.
  const QTensor q = quantize(f32_tensor(std::vector<float>(x.begin(), x.begin() + 4 * 64), 4, 64),
                             q_kind(Format::kFp8, Scaling::kBlock1x128).spec, "a");
  m = error_of<GemmError>([&] { qgemm(q, w); });
  EXPECT_NE(m.find("K % 128"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 64]"), std::string::npos) << m;
  // A columnwise copy that was not made.
  m = error_of<GemmError>([&] {
    GemmConfig c;
    c.a_copy = Copy::kColwise;
    qgemm(q, dense(8, 4), c);
  });
  EXPECT_NE(m.find("no columnwise copy"), std::string::npos) << m;
  // Grouped: offsets that decrease, do not cover A, or W rows not groups x N.
  const Tensor ag = dense(6, 64);
  m = error_of<GemmError>([&] { grouped_qgemm(ag, offsets_tensor({0, 4, 2, 6}), dense(9, 64)); });
  EXPECT_NE(m.find("decrease"), std::string::npos) << m;
  m = error_of<GemmError>([&] { grouped_qgemm(ag, offsets_tensor({0, 5}), w); });
  EXPECT_NE(m.find("end at the 6 grouped rows"), std::string::npos) << m;
  m = error_of<GemmError>([&] { grouped_qgemm(ag, offsets_tensor({0, 2, 4, 6}), w); });
  EXPECT_NE(m.find("groups (3)"), std::string::npos) << m;
  m = error_of<GemmError>([&] {
    GemmConfig c;
    c.group_rows = offsets_tensor({3, 1});
    grouped_qgemm(ag, offsets_tensor({0, 2, 6}), w, c);
  });
  EXPECT_NE(m.find("group_rows"), std::string::npos) << m;
  // Epilogue shapes.
  GemmEpilogue odd;
  odd.swiglu = true;
  const Tensor w7 = dense(7, 32);
  m = error_of<GemmError>([&] { qgemm(a, w7, with(odd)); });
  EXPECT_NE(m.find("even N"), std::string::npos) << m;
  GemmEpilogue badbias;
  badbias.bias = vec_tensor(std::vector<float>(3, 0.0f));
  m = error_of<GemmError>([&] { qgemm(a, w7, with(badbias)); });
  EXPECT_NE(m.find("bias has 3 values, want 7"), std::string::npos) << m;
}

TEST(Gemm, EmptyShapesAndRepeatability) {
  const Tensor w = from_f32(std::vector<float>(4 * 32, 0.5f), {4, 32}, DType::kBF16);
  const GemmResult e = qgemm(Tensor(DType::kBF16, {0, 32}), w);
  EXPECT_EQ(e.d.rows(), 0);
  EXPECT_EQ(e.d.numel(), 0);
  const std::vector<float> k0 =
      floats(qgemm(Tensor(DType::kBF16, {3, 0}), Tensor(DType::kBF16, {2, 0})).d);
  ASSERT_EQ(k0.size(), 6u);
  for (float v : k0) EXPECT_EQ(num::f32_bits(v), 0u);  // acc = +0
  const Tensor a = from_f32(random_values(33 * 96, test_seed()), {33, 96}, DType::kBF16);
  expect_same_bits(qgemm(a, a).d, qgemm(a, a).d, "run twice");
}
