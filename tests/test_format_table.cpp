// The format table (quant/format.h) is the one judge of what a format allows: for every format x
// scaling x element codec x option, the recipe check, the quantizer, the GEMM operand check and
// the quantized-file reader give the table's verdict, and the K multiples of nn padding, the GEMM
// and the quantizer agree.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <numeric>

#include "gemm/operand.h"
#include "lockstep/nn/operand.h"
#include "lockstep/quant/qtensor_io.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/recipe.h"
#include "lockstep/tensor/safetensors.h"
#include "test_util.h"

using namespace lockstep;

namespace {

// Every QuantSpec over the registries: formats x scalings x element codecs x options.
std::vector<QuantSpec> every_spec() {
  std::vector<QuantSpec> out;
  for (size_t f = 0; f < size_t(Format::kCount); ++f)
    for (size_t s = 0; s < kScalingCount; ++s)
      for (size_t e = 0; e < size_t(ElemCodec::kCount); ++e)
        for (int opts = 0; opts < 32; ++opts) {
          QuantSpec q;
          q.format = Format(f);
          q.scaling = Scaling(s);
          q.elem = ElemCodec(e);
          q.block2d = opts & 1;
          q.hadamard = opts & 2;
          q.pow2 = opts & 4;
          q.eps = opts & 8 ? 1e-3f : 0.0f;
          q.stochastic = opts & 16;
          out.push_back(q);
        }
  return out;
}

std::string label(const QuantSpec& q) {
  return fmt::format("{} {} {}{}{}{}{}{}", format_name(q.format), scaling_name(q.scaling),
                     elem_codec_name(q.elem), q.block2d ? " block2d" : "",
                     q.hadamard ? " hadamard" : "", q.pow2 ? " pow2" : "",
                     q.eps != 0.0f ? " eps" : "", q.stochastic ? " stochastic" : "");
}

// The recipe's verdict on `op` as a gradient operand (dgrad's grad_output, where stochastic
// rounding is allowed); a Hadamard operand gets a Hadamard partner so the GEMM rule holds.
std::string recipe_verdict(const QuantSpec& op) {
  Recipe r;
  r.name = "t";
  r.linear[Gemm::kDgrad].a = op;
  if (op.hadamard) {
    QuantSpec partner = default_spec(Format::kNvfp4);
    partner.hadamard = true;
    r.linear[Gemm::kDgrad].b = partner;
  }
  return test::error_of<RecipeError>([&] { validate(r); });
}

// 256 x 256 in two groups of 128 rows: every block rule of every format holds, so only the
// table can refuse.
const std::vector<int64_t> kOffsets{0, 128, 256};

Tensor input(int64_t rows, int64_t cols) {
  std::vector<float> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int(i % 23) - 11) * 0.37f;
  return test::mat(v, rows, cols);
}

// The fields a QTensor records.
QuantSpec recorded(const QuantSpec& q) {
  QuantSpec r;
  r.format = q.format;
  r.scaling = q.scaling;
  r.elem = q.elem;
  r.block2d = q.block2d;
  r.hadamard = q.hadamard;
  return r;
}

}  // namespace

TEST(FormatTable, EveryPathGivesTheTablesVerdict) {
  const Tensor x = input(256, 256);
  int legal = 0, checked = 0;
  for (const QuantSpec& spec : every_spec()) {
    const std::string what = label(spec);
    const std::string why = quant_spec_violation(spec);
    const bool ok = why.empty();
    legal += ok;
    ++checked;
    // Recipes refuse exactly what the table refuses, with its reason.
    const std::string r = recipe_verdict(spec);
    EXPECT_EQ(r.empty(), ok) << what << ": recipe says '" << r << "', table '" << why << "'";
    if (!ok) {
      EXPECT_NE(r.find(why), std::string::npos) << what << ": " << r;
    }
    if (!is_quantized(spec.format)) {
      // Dense formats: the defaults only; the quantizer takes none of them.
      EXPECT_EQ(ok, spec == QuantSpec{spec.format}) << what;
      EXPECT_THROW(validate_quant_input("x", 256, 256, kOffsets, QuantConfig{spec}), QuantError);
      continue;
    }
    // The quantizer: the same verdict, the same reason.
    const std::string q = test::error_of<QuantError>(
        [&] { validate_quant_input("x", 256, 256, kOffsets, QuantConfig{spec}); });
    EXPECT_EQ(q.empty(), ok) << what << ": quantizer says '" << q << "', table '" << why << "'";
    if (!ok) {
      EXPECT_NE(q.find(why), std::string::npos) << what << ": " << q;
    }
    // The GEMM sees what a QTensor records. A legal record: the quantizer's output passes. An
    // illegal one (metadata relabelled on a legal tensor of the format): refused, for the
    // table's reason, before any size check.
    const QuantSpec rec = recorded(spec);
    const std::string rec_why = quant_spec_violation(rec);
    QTensor t;
    if (rec_why.empty()) {
      t = quantize_grouped(x, kOffsets, QuantConfig{rec}, "x");
    } else {
      t = quantize_grouped(x, kOffsets, QuantConfig{default_spec(spec.format)}, "x");
      t.scaling = rec.scaling, t.elem = rec.elem, t.block2d = rec.block2d;
      t.hadamard = rec.hadamard;
    }
    const std::string g =
        test::error_of<GemmError>([&] { gemm::check_operand(GemmArg(t), Copy::kRowwise, "x"); });
    EXPECT_EQ(g.empty(), rec_why.empty()) << what << ": GEMM says '" << g << "'";
    if (!rec_why.empty()) {
      EXPECT_NE(g.find(rec_why), std::string::npos) << what << ": " << g;
    }
  }
  // The table is not trivially permissive or strict: each quantized format takes its scalings.
  EXPECT_GT(legal, 0);
  EXPECT_LT(legal, checked);
  for (Format f : {Format::kNvfp4, Format::kMxfp8, Format::kFp8})
    for (size_t s = 0; s < kScalingCount; ++s)
      EXPECT_EQ(quant_spec_violation(QuantSpec{f, Scaling(s)}).empty(), format_takes(f, Scaling(s)))
          << format_name(f) << " " << scaling_name(Scaling(s));
}

TEST(FormatTable, Fp8TakesPerGroupEverywhere) {
  const QuantSpec fp8_group{Format::kFp8, Scaling::kPerGroup};
  EXPECT_EQ(quant_spec_violation(fp8_group), "");
  EXPECT_EQ(recipe_verdict(fp8_group), "");
  const QTensor q = quantize_grouped(input(256, 256), kOffsets, QuantConfig{fp8_group}, "x");
  EXPECT_NO_THROW(gemm::check_operand(GemmArg(q), Copy::kRowwise, "x"));
  // mxfp8 has one scaling; nvfp4 no block scalings.
  EXPECT_NE(quant_spec_violation({Format::kMxfp8, Scaling::kPerGroup}), "");
  EXPECT_NE(quant_spec_violation({Format::kNvfp4, Scaling::kBlock1x128}), "");
}

// For every legal (format, scaling): the GEMM reads K exactly when K % k_multiple == 0, the
// quantizer produces every such K, and nn pads K to the same multiple.
TEST(FormatTable, KMultiplesAgree) {
  for (Format f : {Format::kNvfp4, Format::kMxfp8, Format::kFp8})
    for (size_t si = 0; si < kScalingCount; ++si) {
      const Scaling s = Scaling(si);
      if (!format_takes(f, s)) continue;
      const QuantSpec spec{f, s};
      const int64_t km = k_multiple(f, s);
      const std::string what = fmt::format("{} {}", format_name(f), scaling_name(s));
      GemmSpec g;
      g.a = spec;
      EXPECT_EQ(nn::k_multiple(g), km) << what;
      g.b = default_spec(Format::kMxfp8);
      EXPECT_EQ(nn::k_multiple(g), std::lcm(km, int64_t(32))) << what;
      int gemm_accepts = 0;
      for (int64_t k = 1; k <= 2 * km + 1; ++k) {
        // 128 rows in one group: fp8 128x128 tiles stay inside it.
        const std::vector<int64_t> one{0, 128};
        const std::string qe = test::error_of<QuantError>(
            [&] { validate_quant_input("x", 128, k, one, QuantConfig{spec}); });
        if (k % km == 0) {
          EXPECT_EQ(qe, "") << what << " K " << k;
        }
        if (!qe.empty()) continue;
        const QTensor q = quantize_grouped(input(128, k), one, QuantConfig{spec}, "x");
        const std::string ge = test::error_of<GemmError>(
            [&] { gemm::check_operand(GemmArg(q), Copy::kRowwise, "x"); });
        EXPECT_EQ(ge.empty(), k % km == 0) << what << " K " << k << ": " << ge;
        gemm_accepts += ge.empty();
      }
      EXPECT_EQ(gemm_accepts, (2 * km + 1) / km) << what;  // every multiple of km in [1, 2 km + 1]
    }
}

// A quantized file whose metadata names a combination the table refuses is refused on read.
TEST(FormatTable, FileReaderRefusesWhatTheTableRefuses) {
  SafetensorsFile file;
  const QTensor q = quantize(input(32, 64), QuantConfig{default_spec(Format::kMxfp8)}, "w");
  add_qtensor(file, "w", q, DType::kF32);
  ASSERT_NO_THROW(read_qtensor(file, "w"));
  file.metadata["lockstep.w.scaling"] = "per_row";
  const std::vector<std::byte> bytes = serialize_safetensors(file);
  const std::string e = test::error_of<SafetensorsError>(
      [&] { read_qtensor(parse_safetensors(bytes, "q.safetensors"), "w"); });
  EXPECT_NE(e.find(quant_spec_violation({Format::kMxfp8, Scaling::kPerRow})), std::string::npos)
      << e;
}
