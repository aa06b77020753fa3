// Recipe registry, schema and validation: every built-in is present, valid and round-trips
// exactly through its JSON; each validation rule refuses what it should, naming the field.
#include <gtest/gtest.h>

#include <string>

#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/recipe.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/recipe/selection.h"
#include "test_util.h"

namespace lockstep {
namespace {

using test::builtin;
using test::error_of;

TEST(RecipeRegistry, HasEveryNamedRecipeInOrder) {
  const char* names[] = {"bf16",
                         "fp8_per_tensor",
                         "fp8_block",
                         "mxfp8",
                         "nvfp4_per_token",
                         "nvfp4_per_token_bf16_bwd",
                         "nvfp4_per_token_dequant_bwd",
                         "nvfp4_per_token_w_per_tensor",
                         "nvfp4_per_tensor",
                         "nvfp4_block",
                         "w4a16_nvfp4",
                         "w4a8_nvfp4_mxfp8"};
  ASSERT_EQ(builtin_recipes().size(), std::size(names));
  for (size_t i = 0; i < std::size(names); ++i) {
    EXPECT_EQ(builtin_recipes()[i].name, names[i]);
    EXPECT_EQ(builtin_recipes()[i].recipe.name, names[i]);
    EXPECT_FALSE(builtin_recipes()[i].purpose.empty()) << names[i];
    EXPECT_EQ(builtin_recipes()[i].purpose.find('\n'), std::string::npos) << "one line";
  }
}

TEST(RecipeRegistry, EveryBuiltinRoundTripsThroughJsonExactly) {
  for (const RecipeInfo& info : builtin_recipes()) {
    const Json j = to_json(info.recipe);
    const Recipe back = recipe_from_json(Json::parse(j.dump()), "roundtrip");
    EXPECT_EQ(back, info.recipe) << info.name;
    EXPECT_EQ(to_json(back).dump(), j.dump()) << info.name;
  }
}

TEST(RecipeRegistry, Nvfp4PerTokenIsWhatTheIssueSays) {
  const Recipe& r = builtin("nvfp4_per_token");
  const GemmSpec& f = r.linear[Gemm::kFprop];
  EXPECT_EQ(f.a.format, Format::kNvfp4);
  EXPECT_EQ(f.a.scaling, Scaling::kPerRow);  // per token
  EXPECT_EQ(f.b.format, Format::kNvfp4);
  EXPECT_EQ(f.b.scaling, Scaling::kPerRow);
  for (Gemm g : {Gemm::kDgrad, Gemm::kWgrad}) {
    EXPECT_EQ(r.linear[g].a.format, Format::kMxfp8);
    EXPECT_EQ(r.linear[g].b.format, Format::kMxfp8);
  }
  EXPECT_EQ(r.linear.backward_mode, BackwardMode::kQuantized);
  EXPECT_EQ(r.coverage.scope, CoverageScope::kExperts);
  EXPECT_EQ(r.coverage.last_fraction_bf16, 0.15);
  EXPECT_TRUE(r.coverage.shared_experts_bf16);
}

TEST(RecipeRegistry, DerivedRecipesDifferOnlyWhereTheySay) {
  const Recipe& base = builtin("nvfp4_per_token");
  Recipe bf16_bwd = builtin("nvfp4_per_token_bf16_bwd");
  EXPECT_EQ(bf16_bwd.linear.backward_mode, BackwardMode::kHighPrecision);
  bf16_bwd.linear.backward_mode = base.linear.backward_mode;
  bf16_bwd.name = base.name;
  bf16_bwd.purpose = base.purpose;
  EXPECT_EQ(bf16_bwd, base);
  EXPECT_EQ(builtin("nvfp4_per_token_dequant_bwd").linear.backward_mode,
            BackwardMode::kDequantized);
  const Recipe& wpt = builtin("nvfp4_per_token_w_per_tensor");
  EXPECT_EQ(wpt.linear[Gemm::kFprop].b.scaling, Scaling::kPerGroup);  // one amax per expert
  EXPECT_EQ(wpt.linear[Gemm::kFprop].a.scaling, Scaling::kPerRow);
  const Recipe& pt = builtin("nvfp4_per_tensor");
  EXPECT_EQ(pt.linear[Gemm::kFprop].a.scaling, Scaling::kPerTensor);
}

TEST(RecipeRegistry, OtherRecipesMatchTheirDescriptions) {
  const Recipe& fb = builtin("fp8_block");
  EXPECT_EQ(fb.linear[Gemm::kFprop].a.scaling, Scaling::kBlock1x128);
  EXPECT_EQ(fb.linear[Gemm::kFprop].b.scaling, Scaling::kBlock128x128);
  EXPECT_EQ(fb.linear[Gemm::kFprop].a.format, Format::kFp8);
  const Recipe& nb = builtin("nvfp4_block");
  EXPECT_TRUE(nb.linear[Gemm::kFprop].b.block2d);
  EXPECT_TRUE(nb.linear[Gemm::kDgrad].a.stochastic);
  EXPECT_TRUE(nb.linear[Gemm::kWgrad].a.stochastic);
  EXPECT_TRUE(nb.linear[Gemm::kWgrad].a.hadamard);
  EXPECT_TRUE(nb.linear[Gemm::kWgrad].b.hadamard);
  EXPECT_FALSE(nb.linear[Gemm::kFprop].a.hadamard);
  EXPECT_EQ(gemm_format(nb.linear[Gemm::kDgrad]), Format::kNvfp4);
  const Recipe& w4a16 = builtin("w4a16_nvfp4");
  EXPECT_EQ(w4a16.linear[Gemm::kFprop].a.format, Format::kBf16);
  EXPECT_EQ(w4a16.linear[Gemm::kFprop].b.format, Format::kNvfp4);
  EXPECT_EQ(gemm_format(w4a16.linear[Gemm::kFprop]), Format::kNvfp4);
  const Recipe& w4a8 = builtin("w4a8_nvfp4_mxfp8");
  EXPECT_EQ(w4a8.linear[Gemm::kFprop].a.format, Format::kMxfp8);
  EXPECT_EQ(w4a8.linear[Gemm::kFprop].b.format, Format::kNvfp4);
  for (const char* n : {"nvfp4_per_token", "nvfp4_per_tensor", "nvfp4_block", "w4a16_nvfp4",
                        "w4a8_nvfp4_mxfp8", "nvfp4_per_token_bf16_bwd"}) {
    EXPECT_EQ(builtin(n).coverage.last_fraction_bf16, 0.15) << n;
    EXPECT_TRUE(builtin(n).coverage.shared_experts_bf16) << n;
  }
  const Recipe& b = builtin("bf16");
  for (const GemmSpec& g : b.linear.gemm) EXPECT_EQ(gemm_format(g), Format::kBf16);
}

TEST(RecipeRegistry, UnknownNameListsClosest) {
  const std::string e =
      error_of<RecipeError>([] { builtin_recipe_or_throw("nvfp4_per_tokn", "--recipe"); });
  EXPECT_NE(e.find("unknown recipe 'nvfp4_per_tokn'"), std::string::npos) << e;
  EXPECT_NE(e.find("closest: nvfp4_per_token"), std::string::npos) << e;
  EXPECT_EQ(closest_recipe_names("mxfp9", 1), std::vector<std::string>{"mxfp8"});
  EXPECT_EQ(closest_recipe_names("fp8_blok", 1), std::vector<std::string>{"fp8_block"});
}

TEST(RecipeBf16Tail, ExactCeilOnAwkwardFractions) {
  // 0.15 * 20 is 3.0000000000000004 in binary; a naive ceil gives 4.
  EXPECT_EQ(bf16_tail_layers(0.15, 20), 3);
  EXPECT_EQ(bf16_tail_layers(0.15, 48), 8);  // 7.2 -> 8
  EXPECT_EQ(bf16_tail_layers(0.15, 40), 6);
  EXPECT_EQ(bf16_tail_layers(0.1, 30), 3);  // 0.1 * 30 = 3.0000000000000004 too
  EXPECT_EQ(bf16_tail_layers(0.0, 48), 0);
  EXPECT_EQ(bf16_tail_layers(1.0, 7), 7);
  EXPECT_EQ(bf16_tail_layers(0.15, 1), 1);
  EXPECT_EQ(bf16_tail_layers(0.000001, 1000000), 1);
  EXPECT_THROW(bf16_tail_layers(1.5, 10), RecipeError);
  EXPECT_THROW(bf16_tail_layers(-0.1, 10), RecipeError);
  EXPECT_THROW(bf16_tail_layers(0.1234567, 10), RecipeError);  // more than 6 decimals
}

Json minimal(const char* extra_fprop_activation) {
  Json j = Json::parse(R"({"name": "t", "fprop": {"weight": {"format": "nvfp4"}}})");
  j["fprop"]["activation"] = Json::parse(extra_fprop_activation);
  return j;
}

TEST(RecipeValidation, EachOperandRuleNamesTheField) {
  struct Case {
    const char* activation;
    const char* expect;
  } cases[] = {
      {R"({"format": "nvfp4", "scaling": "block_1x128"})", "fprop.activation: nvfp4 takes scaling"},
      {R"({"format": "mxfp8", "scaling": "per_row"})",
       "mxfp8 takes scaling block_1x32, not per_row"},
      {R"({"format": "fp8", "scaling": "block_1x32"})", "fp8 takes scaling"},
      {R"({"format": "mxfp8", "pow2": true})", "pow2 (power-of-two scales) applies to fp8 only"},
      {R"({"format": "mxfp8", "eps": 0.5})", "eps (an amax floor) applies to fp8 only"},
      {R"({"format": "fp8", "eps": -1})", "fprop.activation.eps: expected a finite amax floor"},
      {R"({"format": "fp8", "eps": 1e-50})", "rounds to 0 in fp32"},
      {R"({"format": "fp8", "block2d": true})", "block2d (16x16 blocks) applies to nvfp4 only"},
      {R"({"format": "nvfp4", "stochastic": true})",
       "stochastic rounding is for gradient operands"},
      {R"({"format": "nvfp4", "elem": "e5m2"})", "elem applies to fp8 and mxfp8 only"},
      {R"({"format": "bf16", "scaling": "per_row"})", "bf16 is not quantized"},
      {R"({"format": "int4"})", "unknown format 'int4'"},
      {R"({"format": "fp8", "scaling": "per_block"})", "unknown scaling 'per_block'"},
      {R"({"format": "fp8", "elem": "e3m4"})", "unknown element codec"},
      {R"({"format": "fp8", "stochastik": true})", "unknown key 'stochastik'"},
      {R"({"format": "fp8", "pow2": "yes"})", "fprop.activation.pow2: expected true or false"},
      {R"({"format": "nvfp4", "hadamard": true})", "hadamard must be set on both operands"},
  };
  for (const auto& c : cases) {
    const std::string e =
        error_of<RecipeError>([&] { recipe_from_json(minimal(c.activation), "f.json"); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.activation << " -> " << e;
  }
  // And the valid neighbours pass.
  EXPECT_NO_THROW(recipe_from_json(
      minimal(R"({"format": "fp8", "scaling": "block_1x128", "pow2": true})"), "ok"));
  EXPECT_NO_THROW(recipe_from_json(minimal(R"({"format": "mxfp8", "elem": "e5m2"})"), "ok"));
  EXPECT_NO_THROW(recipe_from_json(minimal(R"({"format": "fp8", "scaling": "per_group"})"), "ok"));
  const Recipe eps = recipe_from_json(minimal(R"({"format": "fp8", "eps": 0.25})"), "ok");
  EXPECT_EQ(eps.linear[Gemm::kFprop].a.eps, 0.25f);
  EXPECT_EQ(recipe_from_json(to_json(eps), "round trip"), eps);
}

TEST(RecipeValidation, CoverageFieldsAreChecked) {
  auto with_cov = [](const char* cov) {
    Json j = Json::parse(R"({"name": "t"})");
    j["coverage"] = Json::parse(cov);
    return recipe_from_json(j, "f.json");
  };
  EXPECT_NE(error_of<RecipeError>([&] {
              with_cov(R"({"scope": "attention"})");
            }).find("unknown scope 'attention'"),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([&] { with_cov(R"({"last_fraction_bf16": 2})"); }).find("[0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([&] { with_cov(R"({"first_n_bf16": -1})"); }).find(">= 0"),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([&] {
              with_cov(R"({"first_n_bf16": 1.5})");
            }).find("expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([&] {
              with_cov(R"({"exclude_layers": [-2]})");
            }).find("exclude_layers"),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([&] {
              with_cov(R"({"overrides": [{"pattern": "x", "precision": "fp4"}]})");
            }).find("expected \"bf16\" or \"quantized\""),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([&] {
              with_cov(R"({"overrides": [{"precision": "bf16"}]})");
            }).find("missing 'pattern'"),
            std::string::npos);
  EXPECT_NE(
      error_of<RecipeError>([&] {
        with_cov(
            R"({"overrides": [{"pattern": "x", "precision": "bf16", "backward_mode": "quantized"}]})");
      }).find("a bf16 override takes no"),
      std::string::npos);
  EXPECT_NE(error_of<RecipeError>([&] {
              with_cov(R"({"scopes": "experts"})");
            }).find("unknown key 'scopes'"),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([] {
              recipe_from_json(Json::parse(R"({"name": "t", "backward_mode": "fp32"})"), "f");
            }).find("unknown backward mode 'fp32'"),
            std::string::npos);
  EXPECT_NE(error_of<RecipeError>([] {
              recipe_from_json(Json::parse(R"({"purpose": "no name"})"), "f");
            }).find("missing 'name'"),
            std::string::npos);
}

TEST(RecipeValidation, FpropMustBeSaid) {
  // A recipe with no forward formats would run everything in bf16 without a word.
  const std::string e =
      error_of<RecipeError>([] { recipe_from_json(Json::parse(R"({"name": "t"})"), "f.json"); });
  EXPECT_NE(e.find("f.json: missing 'fprop'"), std::string::npos) << e;
  EXPECT_NE(error_of<RecipeError>([] {
              resolve_recipe_json(Json::parse(R"({"backward_mode": "quantized"})"), "g.json", "g");
            }).find("g.json: missing 'fprop'"),
            std::string::npos);
  // "extends" supplies it; a bf16 recipe says so.
  EXPECT_NO_THROW(resolve_recipe_json(Json::parse(R"({"extends": "mxfp8"})"), "h.json", "h"));
  EXPECT_NO_THROW(recipe_from_json(
      Json::parse(
          R"({"name": "b", "fprop": {"activation": {"format": "bf16"}, "weight": {"format": "bf16"}}})"),
      "b.json"));
  EXPECT_EQ(to_json(builtin("bf16"))["fprop"]["weight"]["format"], "bf16");
}

TEST(RecipeValidation, Block2dWithPerRowIsRefusedAsQuantizeRefusesIt) {
  const std::string e = error_of<RecipeError>([] {
    Json j = minimal(R"({"format": "nvfp4"})");
    j["fprop"]["weight"] =
        Json::parse(R"({"format": "nvfp4", "scaling": "per_row", "block2d": true})");
    recipe_from_json(j, "f.json");
  });
  EXPECT_NE(e.find("fprop.weight: block2d"), std::string::npos) << e;
  EXPECT_NE(e.find("per_row"), std::string::npos) << e;
  // Every scaling quantize accepts with 2-D blocks passes.
  for (const char* sc : {"per_tensor", "per_group"}) {
    Json j = minimal(R"({"format": "nvfp4"})");
    j["fprop"]["weight"] = Json::parse(
        std::string(R"({"format": "nvfp4", "block2d": true, "scaling": ")") + sc + "\"}");
    EXPECT_NO_THROW(recipe_from_json(j, "ok")) << sc;
  }
}

TEST(RecipeValidation, LayerCountsOutsideIntAreRefusedNotWrapped) {
  for (const char* v : {"4294967297", "2147483648", "-2147483649", "18446744073709551615"}) {
    Json j = minimal(R"({"format": "nvfp4"})");
    j["coverage"] = Json::parse(std::string(R"({"first_n_bf16": )") + v + "}");
    const std::string e = error_of<RecipeError>([&] { recipe_from_json(j, "f.json"); });
    EXPECT_NE(e.find("first_n_bf16: " + std::string(v) + " is outside the range"),
              std::string::npos)
        << e;
  }
}

TEST(RecipeFile, DeepNestingIsRefused) {
  const std::string deep = R"({"fprop": )" + std::string(100, '[') + std::string(100, ']') + "}";
  const std::string e =
      error_of<RecipeError>([&] { parse_recipe_text(deep, "deep.json", "deep"); });
  EXPECT_NE(e.find("nests JSON deeper than 64 levels"), std::string::npos) << e;
  EXPECT_NO_THROW(parse_recipe_text(R"({"extends": "nvfp4_block"})", "ok.json", "ok"));
}

TEST(RecipeFile, NumberTooLargeForADoubleIsAJsonError) {
  // fuzz_recipe's finding: the JSON library reports 1e999 as out_of_range, not parse_error; it
  // is a bad recipe file (RecipeError, exit 2) like any other JSON error, not an internal failure.
  const std::string e = error_of<RecipeError>([] {
    parse_recipe_text(R"({"fprop": {}, "coverage": {"first_n_bf16": 1e999}})", "big.json", "big");
  });
  EXPECT_NE(e.find("recipe file 'big.json' is not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;
}

TEST(RecipeQuantSpec, OperandsAreQuantizerSpecs) {
  EXPECT_EQ(QuantSpec{}.format, Format::kBf16);  // an operand left at its defaults is not quantized
  const Recipe& nb = builtin("nvfp4_block");
  const QuantSpec& w = nb.linear[Gemm::kFprop].b;
  EXPECT_EQ(w.format, Format::kNvfp4);
  EXPECT_EQ(w.scaling, Scaling::kPerGroup);
  EXPECT_TRUE(w.block2d);
  EXPECT_FALSE(w.stochastic);
  // A quantize call takes the operand as it is, adding only the call's options.
  const QuantConfig c{w};
  EXPECT_EQ(static_cast<const QuantSpec&>(c), w);
  EXPECT_TRUE(c.rowwise);
  EXPECT_FALSE(c.colwise);
  const QuantSpec& dy = nb.linear[Gemm::kWgrad].a;
  EXPECT_TRUE(dy.stochastic);
  EXPECT_TRUE(dy.hadamard);
  const QuantSpec& fp8 = builtin("fp8_per_tensor").linear[Gemm::kDgrad].a;
  EXPECT_EQ(fp8.format, Format::kFp8);
  EXPECT_EQ(fp8.elem, ElemCodec::kE5M2);
  const QuantSpec& blk = builtin("fp8_block").linear[Gemm::kFprop].b;
  EXPECT_EQ(blk.scaling, Scaling::kBlock128x128);
  EXPECT_TRUE(blk.pow2);
  const QuantSpec& mx = builtin("mxfp8").linear[Gemm::kFprop].a;
  EXPECT_EQ(mx.format, Format::kMxfp8);
  EXPECT_EQ(mx.scaling, Scaling::kBlock1x32);
}

TEST(RecipeRequirements, DerivedFromContent) {
  auto has = [](const std::vector<std::string>& v, const char* s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  const auto nb = recipe_requirements(builtin("nvfp4_block"));
  EXPECT_TRUE(has(nb, "round:stochastic"));
  EXPECT_TRUE(has(nb, "transform:hadamard16"));
  EXPECT_TRUE(has(nb, "quantize:nvfp4/per_group/2d"));
  EXPECT_TRUE(has(nb, "gemm:nvfp4xnvfp4"));
  const auto pt = recipe_requirements(builtin("nvfp4_per_token"));
  EXPECT_TRUE(has(pt, "gemm:mxfp8xmxfp8"));
  EXPECT_FALSE(has(pt, "round:stochastic"));
  const auto hp = recipe_requirements(builtin("nvfp4_per_token_bf16_bwd"));
  EXPECT_FALSE(has(hp, "gemm:mxfp8xmxfp8"));  // backward runs in bf16
  EXPECT_TRUE(has(recipe_requirements(builtin("w4a16_nvfp4")), "gemm:bf16xnvfp4"));
}

}  // namespace
}  // namespace lockstep
