// Columnwise copies (CONTRACT.md section 12) on the CPU: bytes equal to quantizing the transpose
// (NVFP4 1-D, FP8 1x128 and per_row) or to the transpose of the rowwise copy (NVFP4 2-D, FP8
// per_tensor and 128x128), per group for grouped buffers; their files; and the backward GEMM
// layouts dX = dY W and dW = dY^T X computed from them against explicitly transposed and quantized
// operands.
#include <gtest/gtest.h>

#include <random>

#include "lockstep/gemm/qgemm.h"
#include "lockstep/quant/qtensor_io.h"
#include "lockstep/quant/quantize.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep::test;

namespace {

std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::student_t_distribution<float> d(3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = num::bf16_to_f32(num::f32_to_bf16(d(g) * scale));
  return v;
}

std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return t;
}

QuantConfig cfg_of(Format f, Scaling s) {
  QuantConfig c;
  c.format = f;
  c.scaling = s;
  return c;
}

std::string label(const QuantConfig& c) {
  std::string s = std::string(format_name(c.format)) + " " + std::string(scaling_name(c.scaling));
  if (c.block2d) s += " 2d";
  if (c.hadamard) s += " hadamard";
  if (c.stochastic) s += " sr";
  if (c.scale_layout == ScaleLayout::kSwizzled) s += " swizzled";
  return s + " seed " + std::to_string(test_seed());
}

// Codes of a copy transposed: [m, k] -> [k, m] (packed FP4 or bytes).
std::vector<uint8_t> transpose_codes(const std::vector<uint8_t>& d, int64_t m, int64_t k,
                                     bool fp4) {
  std::vector<uint8_t> t(d.size(), 0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) {
      if (fp4) {
        const uint8_t code = nibble(d, k, r, c);
        const int64_t o = c * m + r;
        t[size_t(o / 2)] = uint8_t(t[size_t(o / 2)] | (o % 2 == 0 ? code : code << 4));
      } else {
        t[size_t(c * m + r)] = d[size_t(r * k + c)];
      }
    }
  return t;
}

// The configs whose columnwise copy is the quantization of X^T.
std::vector<QuantConfig> transposed_quantization_configs() {
  std::vector<QuantConfig> v;
  for (Scaling s : {Scaling::kPerTensor, Scaling::kPerRow}) {
    v.push_back(cfg_of(Format::kNvfp4, s));
    QuantConfig sr = cfg_of(Format::kNvfp4, s);
    sr.stochastic = true, sr.seed = 77, sr.rng_stream = 3;
    v.push_back(sr);
    QuantConfig sw = cfg_of(Format::kNvfp4, s);
    sw.scale_layout = ScaleLayout::kSwizzled;
    v.push_back(sw);
  }
  QuantConfig h = cfg_of(Format::kNvfp4, Scaling::kPerTensor);
  h.hadamard = true;
  v.push_back(h);
  for (Scaling s : {Scaling::kBlock1x128, Scaling::kPerRow}) {
    v.push_back(cfg_of(Format::kFp8, s));
    QuantConfig p = cfg_of(Format::kFp8, s);
    p.pow2 = true, p.elem = ElemCodec::kE5M2;
    v.push_back(p);
    QuantConfig sr = cfg_of(Format::kFp8, s);
    sr.stochastic = true, sr.seed = 5;
    v.push_back(sr);
  }
  return v;
}

// The configs whose columnwise copy is the transpose of the rowwise copy.
std::vector<QuantConfig> transposed_rowwise_configs() {
  std::vector<QuantConfig> v;
  QuantConfig b2 = cfg_of(Format::kNvfp4, Scaling::kPerTensor);
  b2.block2d = true;
  v.push_back(b2);
  b2.stochastic = true, b2.seed = 9;
  v.push_back(b2);
  for (Scaling s : {Scaling::kPerTensor, Scaling::kBlock128x128}) {
    v.push_back(cfg_of(Format::kFp8, s));
    QuantConfig sr = cfg_of(Format::kFp8, s);
    sr.stochastic = true, sr.seed = 11;
    v.push_back(sr);
  }
  return v;
}

struct Shape {
  int64_t rows, cols;
};
// Awkward shapes; NVFP4 needs rows and cols % 16 for a columnwise copy.
std::vector<Shape> shapes_for(const QuantConfig& c) {
  if (c.format == Format::kNvfp4) return {{16, 16}, {48, 32}, {160, 96}, {0, 16}, {16, 0}};
  return {{1, 1}, {7, 300}, {200, 130}, {129, 257}, {0, 5}};
}

}  // namespace

TEST(Colwise, EqualsTheQuantizationOfTheTranspose) {
  for (QuantConfig c : transposed_quantization_configs())
    for (const Shape& sh : shapes_for(c)) {
      const std::vector<float> x = randn(sh.rows * sh.cols, test_seed() + uint64_t(sh.rows), 3.0f);
      c.colwise = true;
      const QTensor q = quantize(mat(x, sh.rows, sh.cols), c, "x");
      QuantConfig t = c;
      t.colwise = false;
      const QTensor qt = quantize(mat(transposed(x, sh.rows, sh.cols), sh.cols, sh.rows), t, "xt");
      const std::string what =
          label(c) + " [" + std::to_string(sh.rows) + ", " + std::to_string(sh.cols) + "]";
      EXPECT_TRUE(colwise(q) == rowwise(qt)) << what;
      EXPECT_EQ(q.colwise.data.shape(), qt.rowwise.data.shape()) << what;
      EXPECT_EQ(q.colwise.scale_rows, qt.rowwise.scale_rows) << what;
      EXPECT_EQ(q.colwise.scale_cols, qt.rowwise.scale_cols) << what;
      // The rowwise copy is unchanged by asking for the columnwise one.
      c.colwise = false;
      EXPECT_TRUE(rowwise(q) == rowwise(quantize(mat(x, sh.rows, sh.cols), c, "x"))) << what;
    }
}

TEST(Colwise, IsTheTransposeOfTheRowwiseCopyWhereTheContractSaysSo) {
  for (QuantConfig c : transposed_rowwise_configs())
    for (const Shape& sh : std::vector<Shape>{{16, 32}, {128, 48}, {256, 160}, {130, 300}}) {
      if (c.format == Format::kNvfp4 && (sh.rows % 16 || sh.cols % 16)) continue;
      const std::vector<float> x = randn(sh.rows * sh.cols, test_seed() + 5, 2.0f);
      c.colwise = true;
      const QTensor q = quantize(mat(x, sh.rows, sh.cols), c, "x");
      const std::string what =
          label(c) + " [" + std::to_string(sh.rows) + ", " + std::to_string(sh.cols) + "]";
      const CopyBytes r = rowwise(q), col = colwise(q);
      const bool fp4 = c.format == Format::kNvfp4;
      EXPECT_EQ(col.data, transpose_codes(r.data, sh.rows, sh.cols, fp4)) << what;
      if (fp4) {
        // Tile (i/16, j/16) of X scales block (j, i/16) of X^T.
        ASSERT_EQ(col.block_scale.size(), size_t(sh.cols * sh.rows / 16)) << what;
        for (int64_t j = 0; j < sh.cols; ++j)
          for (int64_t b = 0; b < sh.rows / 16; ++b)
            ASSERT_EQ(col.block_scale[size_t(j * (sh.rows / 16) + b)],
                      r.block_scale[size_t(b * 16 * (sh.cols / 16) + j / 16)])
                << what;
        EXPECT_EQ(col.amax, r.amax) << what;
      } else if (c.scaling == Scaling::kBlock128x128) {
        EXPECT_EQ(col.scale_rows, r.scale_cols);
        EXPECT_EQ(col.scale_cols, r.scale_rows);
        for (int64_t i = 0; i < r.scale_rows; ++i)
          for (int64_t j = 0; j < r.scale_cols; ++j)
            EXPECT_EQ(col.scale_inv[size_t(j * r.scale_rows + i)],
                      r.scale_inv[size_t(i * r.scale_cols + j)])
                << what;
      } else {
        EXPECT_EQ(col.scale_inv, r.scale_inv) << what;
      }
      // Without stochastic rounding this is also the quantization of X^T (same blocks, same amax).
      if (!c.stochastic) {
        QuantConfig t = c;
        t.colwise = false;
        const QTensor qt =
            quantize(mat(transposed(x, sh.rows, sh.cols), sh.cols, sh.rows), t, "xt");
        EXPECT_EQ(col.data, rowwise(qt).data) << what;
      }
    }
}

TEST(Colwise, GroupedCopiesArePerGroup) {
  const std::vector<int64_t> offsets{0, 32, 32, 64, 96};  // an empty group
  const int64_t rows = 96, cols = 64;
  const std::vector<float> x = randn(rows * cols, test_seed() + 17, 4.0f);
  std::vector<QuantConfig> cfgs;
  for (Scaling s : {Scaling::kPerGroup, Scaling::kPerRow, Scaling::kPerTensor})
    cfgs.push_back(cfg_of(Format::kNvfp4, s));
  QuantConfig b2 = cfg_of(Format::kNvfp4, Scaling::kPerGroup);
  b2.block2d = true;
  cfgs.push_back(b2);
  for (Scaling s :
       {Scaling::kPerGroup, Scaling::kPerRow, Scaling::kBlock1x128, Scaling::kPerTensor})
    cfgs.push_back(cfg_of(Format::kFp8, s));
  cfgs.push_back(cfg_of(Format::kMxfp8, Scaling::kBlock1x32));
  for (QuantConfig c : cfgs) {
    c.colwise = true;
    const QTensor q = quantize_grouped(mat(x, rows, cols), offsets, c, "x");
    const QTensor whole = quantize(
        mat(x, rows, cols),
        [&] {
          QuantConfig w = c;
          if (w.scaling == Scaling::kPerGroup) w.scaling = Scaling::kPerTensor;
          return w;
        }(),
        "x");
    for (int64_t g = 0; g + 1 < int64_t(offsets.size()); ++g) {
      const int64_t r0 = offsets[size_t(g)], rg = offsets[size_t(g + 1)] - r0;
      const std::vector<float> part(x.begin() + r0 * cols, x.begin() + (r0 + rg) * cols);
      QuantConfig alone = c;
      if (alone.scaling == Scaling::kPerGroup) alone.scaling = Scaling::kPerTensor;
      const QTensor qa = quantize(mat(part, rg, cols), alone, "part");
      const QTensor v = group_view(q, g);
      const std::string what = label(c) + " group " + std::to_string(g);
      if (c.scaling == Scaling::kPerTensor && c.format == Format::kNvfp4) {
        // One A for the whole buffer: the group's copy uses the tensor's amax.
        EXPECT_EQ(colwise(v).amax, colwise(whole).amax) << what;
        continue;
      }
      if (c.scaling == Scaling::kPerTensor) {
        EXPECT_EQ(colwise(v).scale_inv, rowwise(whole).scale_inv) << what;
        continue;
      }
      EXPECT_TRUE(colwise(v) == colwise(qa)) << what;
      EXPECT_TRUE(rowwise(v) == rowwise(qa)) << what;
    }
  }
}

TEST(Colwise, JointCopiesShareTheColumnwiseAmax) {
  const std::vector<float> a = randn(32 * 48, test_seed() + 21, 10.0f),
                           b = randn(32 * 48, test_seed() + 22, 0.1f);
  for (bool hadamard : {false, true}) {
    QuantConfig c = cfg_of(Format::kNvfp4, Scaling::kPerTensor);
    c.colwise = true;
    c.hadamard = hadamard;
    const std::vector<Tensor> xs{mat(a, 32, 48), mat(b, 32, 48)};
    const std::vector<QTensor> j = quantize_joint(xs, c);
    const QTensor qa = quantize(xs[0], c), qb = quantize(xs[1], c);
    const float col = std::max(colwise(qa).amax[0], colwise(qb).amax[0]);
    EXPECT_EQ(colwise(j[0]).amax[0], col);
    EXPECT_EQ(colwise(j[1]).amax[0], col);
    EXPECT_EQ(rowwise(j[1]).amax[0], std::max(rowwise(qa).amax[0], rowwise(qb).amax[0]));
  }
}

TEST(Colwise, DequantizeRebuildsXFromEitherCopy) {
  const int64_t rows = 64, cols = 96;
  const std::vector<float> x = randn(rows * cols, test_seed() + 31);
  for (QuantConfig c :
       {cfg_of(Format::kNvfp4, Scaling::kPerRow), cfg_of(Format::kFp8, Scaling::kBlock1x128),
        cfg_of(Format::kMxfp8, Scaling::kBlock1x32),
        cfg_of(Format::kFp8, Scaling::kBlock128x128)}) {
    c.colwise = true;
    const QTensor q = quantize(mat(x, rows, cols), c);
    DequantConfig d;
    d.copy = Copy::kColwise;
    const std::vector<float> from_col = floats(dequantize(q, d));
    // Independent route: the rowwise dequantization of the copy quantized from X^T (or, for MXFP8,
    // the same blocks), transposed back.
    QuantConfig t = c;
    t.colwise = false;
    std::vector<float> want;
    if (c.format == Format::kMxfp8) {
      want = transposed(floats(dequantize(quantize(mat(transposed(x, rows, cols), cols, rows), t))),
                        cols, rows);
    } else {
      want = transposed(floats(dequantize(quantize(mat(transposed(x, rows, cols), cols, rows), t))),
                        cols, rows);
    }
    EXPECT_EQ(from_col, want) << label(c);
  }
}

TEST(Colwise, FilesRoundTripBothCopies) {
  const int64_t rows = 64, cols = 128;
  const std::vector<float> x = randn(rows * cols, test_seed() + 41);
  std::vector<QuantConfig> cfgs = transposed_quantization_configs();
  for (const QuantConfig& c : transposed_rowwise_configs()) cfgs.push_back(c);
  cfgs.push_back(cfg_of(Format::kMxfp8, Scaling::kBlock1x32));
  for (QuantConfig c : cfgs) {
    c.colwise = true;
    const QTensor q = quantize(mat(x, rows, cols), c);
    SafetensorsFile f;
    add_qtensor(f, "w", q, DType::kF32);
    const SafetensorsFile back = parse_safetensors(serialize_safetensors(f), "memory");
    const QTensor r = read_qtensor(back, "w");
    EXPECT_TRUE(same_bytes(q, r)) << label(c);
    EXPECT_EQ(back.metadata.at("lockstep.w.colwise"),
              c.format == Format::kMxfp8 ? "blocks_down_columns" : "transposed");
  }
}

// ---- backward layouts
// ------------------------------------------------------------------------------

namespace {

struct Pair {
  QuantConfig dy, w;  // the dgrad operand formats (dY along N, W along N)
};

std::vector<Pair> backward_pairs() {
  QuantConfig b2 = cfg_of(Format::kNvfp4, Scaling::kPerTensor);
  b2.block2d = true;
  return {
      {cfg_of(Format::kMxfp8, Scaling::kBlock1x32), cfg_of(Format::kMxfp8, Scaling::kBlock1x32)},
      {cfg_of(Format::kNvfp4, Scaling::kPerRow), cfg_of(Format::kNvfp4, Scaling::kPerRow)},
      {cfg_of(Format::kNvfp4, Scaling::kPerTensor), b2},
      {cfg_of(Format::kFp8, Scaling::kBlock1x128), cfg_of(Format::kFp8, Scaling::kBlock128x128)},
      {cfg_of(Format::kFp8, Scaling::kPerTensor), cfg_of(Format::kFp8, Scaling::kPerTensor)},
      {cfg_of(Format::kFp8, Scaling::kPerRow), cfg_of(Format::kFp8, Scaling::kPerRow)},
  };
}

QTensor quantize_t(const std::vector<float>& v, int64_t rows, int64_t cols, QuantConfig c) {
  c.colwise = false;
  return quantize(mat(transposed(v, rows, cols), cols, rows), c, "t");
}

}  // namespace

TEST(Backward, DgradAndWgradFromColumnwiseCopiesEqualExplicitTransposes) {
  const int64_t M = 256, N = 128, K = 384;  // tokens, out features, in features
  const std::vector<float> dy = randn(M * N, test_seed() + 51),
                           w = randn(N * K, test_seed() + 52, 0.05f),
                           x = randn(M * K, test_seed() + 53);
  for (const Pair& p : backward_pairs()) {
    QuantConfig cdy = p.dy, cw = p.w, cx = p.dy;
    cdy.colwise = cw.colwise = cx.colwise = true;
    if (cx.scaling == Scaling::kBlock1x128) cx.scaling = Scaling::kBlock1x128;
    const QTensor qdy = quantize(mat(dy, M, N), cdy, "dy"), qw = quantize(mat(w, N, K), cw, "w"),
                  qx = quantize(mat(x, M, K), cx, "x");
    const std::string what = label(cdy) + " x " + label(cw);
    // dgrad: dX [M, K] = dY [M, N] W [N, K]: the W operand is W^T [K, N], its columnwise copy.
    GemmConfig dg;
    dg.w_copy = Copy::kColwise;
    const GemmResult dx = qgemm(qdy, qw, dg);
    const QTensor wt = quantize_t(w, N, K, cw);
    if (cw.stochastic || cw.block2d || cw.scaling == Scaling::kPerTensor ||
        cw.scaling == Scaling::kBlock128x128) {
      // Transposed-rowwise kinds: the same values as quantizing W^T (no stochastic rounding here).
    }
    expect_bits(dx.d, qgemm(qdy, wt).d, what + " dgrad");
    // wgrad: dW [N, K] = dY^T [N, M] X [M, K]: operands dY^T and X^T, both columnwise copies.
    GemmConfig wg;
    wg.a_copy = wg.w_copy = Copy::kColwise;
    const GemmResult dw = qgemm(qdy, qx, wg);
    expect_bits(dw.d, qgemm(quantize_t(dy, M, N, cdy), quantize_t(x, M, K, cx)).d, what + " wgrad");
  }
  // Dense operands: the columnwise copy is the transpose view.
  const Tensor tdy = from_f32(dy, {M, N}, DType::kBF16), tw = from_f32(w, {N, K}, DType::kBF16);
  GemmConfig dg;
  dg.w_copy = Copy::kColwise;
  expect_bits(qgemm(tdy, tw, dg).d, qgemm(tdy, tw.transpose().contiguous()).d, "bf16 dgrad");
}

TEST(Backward, GroupedDgradAndWgradArePerExpert) {
  const std::vector<int64_t> offsets{0, 32, 32, 96, 128};  // an expert with no tokens
  const int64_t E = 4, T = 128, N = 64, K = 96;
  const std::vector<float> dy = randn(T * N, test_seed() + 61),
                           w = randn(E * N * K, test_seed() + 62, 0.05f),
                           x = randn(T * K, test_seed() + 63);
  std::vector<int64_t> woff(size_t(E + 1));
  for (int64_t e = 0; e <= E; ++e) woff[size_t(e)] = e * N;
  const Tensor off = Tensor::from_vector<int64_t>(offsets, {E + 1}, DType::kI64);
  for (const Pair& p : std::vector<Pair>{
           {cfg_of(Format::kMxfp8, Scaling::kBlock1x32),
            cfg_of(Format::kMxfp8, Scaling::kBlock1x32)},
           {cfg_of(Format::kNvfp4, Scaling::kPerRow), cfg_of(Format::kNvfp4, Scaling::kPerGroup)},
           {cfg_of(Format::kFp8, Scaling::kPerRow), cfg_of(Format::kFp8, Scaling::kPerRow)}}) {
    QuantConfig cdy = p.dy, cw = p.w;
    cdy.colwise = cw.colwise = true;
    const QTensor qdy = quantize_grouped(mat(dy, T, N), offsets, cdy, "dy");
    const QTensor qx = quantize_grouped(mat(x, T, K), offsets, cdy, "x");
    const QTensor qw = quantize_grouped(mat(w, E * N, K), woff, cw, "w");
    const std::string what = label(cdy) + " x " + label(cw);
    GemmConfig dg;
    dg.w_copy = Copy::kColwise;
    const std::vector<float> dx = floats(grouped_qgemm(qdy, off, qw, dg).d);
    GemmConfig wg;
    wg.a_copy = wg.w_copy = Copy::kColwise;
    const std::vector<float> dw = floats(grouped_qgemm(qdy, off, qx, wg).d);
    ASSERT_EQ(dw.size(), size_t(E * N * K));
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[size_t(e)], rg = offsets[size_t(e + 1)] - r0;
      QuantConfig alone_w = cw;
      if (alone_w.scaling == Scaling::kPerGroup) alone_w.scaling = Scaling::kPerTensor;
      const std::vector<float> we(w.begin() + e * N * K, w.begin() + (e + 1) * N * K);
      const std::vector<float> dye(dy.begin() + r0 * N, dy.begin() + (r0 + rg) * N),
          xe(x.begin() + r0 * K, x.begin() + (r0 + rg) * K);
      if (rg > 0) {
        const std::vector<float> want = floats(qgemm(quantize(mat(dye, rg, N),
                                                              [&] {
                                                                QuantConfig c = cdy;
                                                                c.colwise = false;
                                                                return c;
                                                              }()),
                                                     quantize_t(we, N, K, alone_w))
                                                   .d);
        EXPECT_EQ(std::vector<float>(dx.begin() + r0 * K, dx.begin() + (r0 + rg) * K), want)
            << what << " dgrad " << e;
      }
      const std::vector<float> dwe(dw.begin() + e * N * K, dw.begin() + (e + 1) * N * K);
      if (rg == 0) {
        for (float v : dwe) ASSERT_EQ(num::f32_bits(v), 0u) << what << " empty expert";
        continue;
      }
      const std::vector<float> want =
          floats(qgemm(quantize_t(dye, rg, N, cdy), quantize_t(xe, rg, K, cdy)).d);
      EXPECT_EQ(dwe, want) << what << " wgrad " << e;
    }
  }
}

TEST(Backward, Float64PathIsAPlainDoubleGemm) {
  const int64_t M = 5, N = 7, K = 9;
  std::vector<double> a(M * K), w(N * K);
  std::mt19937_64 g(test_seed());
  std::normal_distribution<double> d;
  for (auto& v : a) v = d(g);
  for (auto& v : w) v = d(g);
  const Tensor ta = Tensor::from_vector<double>(a, {M, K}, DType::kF64),
               tw = Tensor::from_vector<double>(w, {N, K}, DType::kF64);
  GemmConfig c;
  c.epilogue.alpha = 0.5f;
  const Tensor r = qgemm(ta, tw, c).d;
  ASSERT_EQ(r.dtype(), DType::kF64);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[size_t(i * K + k)] * w[size_t(j * K + k)];
      EXPECT_EQ(r.data<double>()[size_t(i * N + j)], 0.5 * s);
    }
  // dgrad layout on F64: dX = dY W with W's transpose view.
  GemmConfig dg;
  dg.w_copy = Copy::kColwise;
  const Tensor dy =
      Tensor::from_vector<double>(std::vector<double>(M * N, 1.0), {M, N}, DType::kF64);
  const Tensor dx = qgemm(dy, tw, dg).d;
  for (int64_t k = 0; k < K; ++k) {
    double s = 0;
    for (int64_t j = 0; j < N; ++j) s += w[size_t(j * K + k)];
    EXPECT_EQ(dx.data<double>()[size_t(k)], s);
  }
}
