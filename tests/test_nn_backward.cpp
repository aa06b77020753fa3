// The backward modes of a quantized Linear and GroupedLinear against explicit compositions of
// quantize / dequantize / qgemm (bit for bit), and the straight-through estimator against the
// float64 GEMM of dequantized operands (within the fp32 accumulation bound).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "lockstep/gemm/qgemm.h"
#include "lockstep/nn/grouped_linear.h"
#include "lockstep/nn/linear.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/ops/layout.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/registry.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep::test;

namespace {

Tensor randf(int64_t rows, int64_t cols, uint32_t stream, float scale) {
  Tensor t(DType::kF32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint32_t r = num::philox_element_word(test_seed(), stream, uint64_t(i));
    t.ptr<float>()[i] = scale * (float(r >> 8) * (1.0f / 8388608.0f) - 1.0f);
  }
  return t;
}

// The operand a spec makes of x, built from the quantizer entries directly.
struct Op {
  Tensor t;
  QTensor q;
  GemmArg arg() const { return q.has_rowwise() || q.has_colwise() ? GemmArg(q) : GemmArg(t); }
};
Op make(const Tensor& x, const QuantSpec& s, bool rowwise, bool colwise) {
  Op o;
  if (is_quantized(s.format)) {
    QuantConfig qc{s};
    qc.rowwise = rowwise;
    qc.colwise = colwise;
    o.q = quantize(x, qc, "x");
  } else {
    o.t = cast(x, DType::kBF16);
  }
  return o;
}

GemmConfig cfg(Copy a, Copy w) {
  GemmConfig c;
  c.a_copy = a;
  c.w_copy = w;
  return c;
}

struct Case {
  const char* recipe;
  ModuleClass cls;
};

}  // namespace

// An inference forward of a module with a bf16 fprop activation operand lets the producer write
// its input as bf16 (producer_dtype), and that input gives the F32 input's bits; a training
// forward, or a quantized operand, keeps F32 and refuses a BF16 input.
TEST(NnForward, Bf16ProducerInputGivesTheF32InputsBits) {
  const int64_t T = 7, K = 64, N = 40;
  const Tensor w = randf(N, K, 1, 0.2f), x = randf(T, K, 2, 2.0f);
  const Tensor xb = cast(x, DType::kBF16);
  const auto spec = [](const char* recipe, ModuleClass cls) {
    return resolve_module(builtin_recipe_or_throw(recipe, "test").recipe, 0, cls, 8).spec;
  };
  nn::Linear bf("lin", w, Tensor(), spec("bf16", ModuleClass::kQkv));
  EXPECT_EQ(bf.producer_dtype(false), std::optional<DType>(DType::kBF16));
  EXPECT_EQ(bf.producer_dtype(true), std::nullopt);
  expect_bits(bf.forward(xb, false), bf.forward(x, false), "bf16 linear");
  const std::vector<int64_t> off{0, 3, 3, T};
  const Tensor offsets = Tensor::from_vector<int64_t>(off, {4}, DType::kI64);
  nn::GroupedLinear gbf("glin", randf(3 * N, K, 4, 0.2f), Tensor(), 3,
                        spec("bf16", ModuleClass::kExpertsFc1));
  EXPECT_EQ(gbf.producer_dtype(false), std::optional<DType>(DType::kBF16));
  expect_bits(gbf.forward(xb, offsets, false), gbf.forward(x, offsets, false), "bf16 grouped");
  nn::Linear q("lin", w, Tensor(), spec("nvfp4_per_token", ModuleClass::kExpertsFc1));
  EXPECT_EQ(q.producer_dtype(false), std::nullopt);
  EXPECT_THROW(q.forward(xb, false), std::invalid_argument);
}

TEST(NnBackward, LinearModesEqualExplicitCompositions) {
  const int64_t T = 40, K = 64, N = 48;  // T, N off the block multiples; fp8 blocks pad K too
  for (const Case& c :
       {Case{"mxfp8", ModuleClass::kQkv}, Case{"fp8_block", ModuleClass::kQkv},
        Case{"fp8_per_tensor", ModuleClass::kQkv},
        Case{"nvfp4_per_token", ModuleClass::kExpertsFc1},
        Case{"nvfp4_per_token_bf16_bwd", ModuleClass::kExpertsFc1},
        Case{"nvfp4_per_token_dequant_bwd", ModuleClass::kExpertsFc1},
        Case{"w4a16_nvfp4", ModuleClass::kExpertsFc1}, Case{"bf16", ModuleClass::kQkv}}) {
    const ModuleChoice mc =
        resolve_module(builtin_recipe_or_throw(c.recipe, "test").recipe, 0, c.cls, 8);
    const LinearSpec& s = mc.spec;
    const std::string what =
        std::string(c.recipe) + " (" + std::string(backward_mode_name(s.backward_mode)) + ")";
    const Tensor w = randf(N, K, 1, 0.2f), x = randf(T, K, 2, 2.0f), dy = randf(T, N, 3, 0.5f);
    Tensor g(DType::kF32, {N, K});
    nn::Linear lin("lin", w, g, s);
    const Tensor y = lin.forward(x, true);
    EXPECT_GT(lin.saved_bytes(), 0u) << what;
    const Tensor dx = lin.backward(dy);
    // Padded shapes as docs/model.md states them.
    const nn::LinearDims d = nn::LinearDims::of(N, K, s);
    const int64_t Tp = nn::round_up(T, nn::k_multiple(s[Gemm::kWgrad]));
    const Tensor xp = ops::pad2d(x, Tp, d.in_padded), wp = ops::pad2d(w, d.out_padded, d.in_padded),
                 dyp = ops::pad2d(dy, Tp, d.out_padded);
    const Op xf = make(xp, s[Gemm::kFprop].a, true, false),
             wf = make(wp, s[Gemm::kFprop].b, true, false);
    expect_bits(y, ops::crop2d(qgemm(xf.arg(), wf.arg()).d, T, N), what + " y");
    Tensor dx_want, dw_want;
    const Op dyd = make(dyp, s[Gemm::kDgrad].a, true, false);
    const Op dyw = make(dyp, s[Gemm::kWgrad].a, false, true);
    switch (s.backward_mode) {
      case BackwardMode::kQuantized: {
        const Op wd = make(wp, s[Gemm::kDgrad].b, false, true);
        const Op xw = make(xp, s[Gemm::kWgrad].b, false, true);
        dx_want = qgemm(dyd.arg(), wd.arg(), cfg(Copy::kRowwise, Copy::kColwise)).d;
        dw_want = qgemm(dyw.arg(), xw.arg(), cfg(Copy::kColwise, Copy::kColwise)).d;
        break;
      }
      case BackwardMode::kHighPrecision: {
        const Tensor wb = cast(wp, DType::kBF16), xb = cast(xp, DType::kBF16);
        dx_want = qgemm(dyd.arg(), wb, cfg(Copy::kRowwise, Copy::kColwise)).d;
        dw_want = qgemm(dyw.arg(), xb, cfg(Copy::kColwise, Copy::kColwise)).d;
        break;
      }
      case BackwardMode::kDequantized: {
        DequantConfig bf;
        bf.dtype = DType::kBF16;
        const Tensor wdq = wf.q.has_rowwise() ? dequantize(wf.q, bf) : wf.t;
        const Tensor xdq = xf.q.has_rowwise() ? dequantize(xf.q, bf) : xf.t;
        dx_want = qgemm(dyd.arg(), wdq, cfg(Copy::kRowwise, Copy::kColwise)).d;
        dw_want = qgemm(dyw.arg(), xdq, cfg(Copy::kColwise, Copy::kColwise)).d;
        break;
      }
      default:
        FAIL();
    }
    expect_bits(dx, ops::crop2d(dx_want, T, K), what + " dX");
    expect_bits(g, ops::crop2d(dw_want, N, K), what + " dW");
  }
}

TEST(NnBackward, StraightThroughGradientIsTheGemmOfDequantizedOperands) {
  // nvfp4_per_token: dX = Q_mxfp8(dY) Q_mxfp8(W) read as exact values, accumulated in fp32.
  const int64_t T = 32, K = 64, N = 32;
  const LinearSpec s = resolve_module(builtin_recipe_or_throw("nvfp4_per_token", "test").recipe, 0,
                                      ModuleClass::kExpertsFc1, 8)
                           .spec;
  const Tensor w = randf(N, K, 4, 0.2f), x = randf(T, K, 5, 1.0f), dy = randf(T, N, 6, 0.5f);
  Tensor g(DType::kF32, {N, K});
  nn::Linear lin("lin", w, g, s);
  lin.forward(x, true);
  const std::vector<float> dx = floats(lin.backward(dy));
  // Reference: dequantize each operand (exact for MXFP8) and multiply in float64.
  QuantConfig qd{s[Gemm::kDgrad].a}, qw{s[Gemm::kDgrad].b};
  const std::vector<float> dyq = floats(dequantize(quantize(dy, qd)));
  qw.colwise = true;
  qw.rowwise = false;
  DequantConfig col;
  col.copy = Copy::kColwise;
  const std::vector<float> wq = floats(dequantize(quantize(w, qw), col));  // [N, K]
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < K; ++j) {
      double ref = 0, mag = 0;
      for (int64_t n = 0; n < N; ++n) {
        ref += double(dyq[size_t(i * N + n)]) * double(wq[size_t(n * K + j)]);
        mag += std::fabs(double(dyq[size_t(i * N + n)]) * double(wq[size_t(n * K + j)]));
      }
      // fp32 sequential sum of N exact products: |error| <= (N + 1) u sum |a b|, u = 2^-24.
      const double bound = double(N + 1) * std::ldexp(1.0, -24) * mag;
      ASSERT_LE(std::fabs(double(dx[size_t(i * K + j)]) - ref), bound)
          << "dX[" << i << ", " << j << "] seed " << test_seed();
    }
}

TEST(NnBackward, GroupedModesEqualPerExpertCompositions) {
  const int64_t E = 3, N = 32, K = 64;
  auto expert_spec = [](const char* recipe) {
    return resolve_module(builtin_recipe_or_throw(recipe, "test").recipe, 0,
                          ModuleClass::kExpertsFc1, 8)
        .spec;
  };
  std::vector<std::pair<std::string, LinearSpec>> cases;
  for (const char* recipe :
       {"mxfp8", "nvfp4_per_token", "nvfp4_per_token_bf16_bwd", "nvfp4_per_token_dequant_bwd"})
    cases.emplace_back(recipe, expert_spec(recipe));
  // FP8 with one scale per expert on every operand (the format table allows fp8 per_group).
  LinearSpec fp8_group = expert_spec("fp8_per_tensor");
  for (GemmSpec& gs : fp8_group.gemm)
    for (QuantSpec* op : {&gs.a, &gs.b}) op->scaling = Scaling::kPerGroup;
  cases.emplace_back("fp8 per_group", fp8_group);
  for (const auto& [recipe, s] : cases) {
    const int64_t P = nn::group_row_multiple(s);
    const std::vector<int64_t> off{0, 2 * P, 2 * P, 3 * P};  // an empty expert
    const int64_t R = off.back();
    const Tensor w = randf(E * N, K, 7, 0.2f), x = randf(R, K, 8, 1.0f), dy = randf(R, N, 9, 0.5f);
    Tensor g(DType::kF32, {E * N, K});
    nn::GroupedLinear gl("experts", w, g, E, s);
    const Tensor y = gl.forward(x, i64_tensor(off), true);
    const Tensor dx = gl.backward(dy);
    const std::string what = recipe;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = off[size_t(e)], r1 = off[size_t(e + 1)];
      const Tensor we = w.slice_rows(e * N, (e + 1) * N).contiguous();
      // Expert e alone through a dense Linear of the same spec: the same bits (per_group weight
      // amax is per expert, i.e. the dense module's one group).
      Tensor ge(DType::kF32, {N, K});
      nn::Linear lin("expert", we, ge, s);
      const Tensor gw = g.slice_rows(e * N, (e + 1) * N).contiguous();
      if (r1 == r0) {
        for (float v : floats(gw)) ASSERT_EQ(v, 0.0f) << what << " empty expert dW";
        continue;
      }
      const Tensor xe = x.slice_rows(r0, r1).contiguous(), dye = dy.slice_rows(r0, r1).contiguous();
      expect_bits(y.slice_rows(r0, r1).contiguous(), lin.forward(xe, true), what + " y");
      expect_bits(dx.slice_rows(r0, r1).contiguous(), lin.backward(dye), what + " dX");
      expect_bits(gw, ge, what + " dW");
    }
  }
}
