// Coverage rules applied per layer: scope, the bf16 tail fraction (20 -> 3, 48 -> 8 layers),
// first/last N, shared experts, exclusions, pattern overrides, code overrides, backward modes.
#include <gtest/gtest.h>

#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/registry.h"
#include "test_util.h"

namespace lockstep {
namespace {

using test::builtin;
using test::error_of;

Recipe with_coverage(const char* base, const char* coverage_json) {
  Json j = to_json(builtin(base));
  j["coverage"] = Json::parse(coverage_json);
  return recipe_from_json(j, "test");
}

const ModuleChoice& at(const ModelPlan& p, int layer, ModuleClass c) {
  return p.per_layer[size_t(layer)][size_t(c)];
}

int quantized_expert_layers(const ModelPlan& p) {
  int n = 0;
  for (int l = 0; l < p.layers; ++l) n += at(p, l, ModuleClass::kExpertsFc1).quantized;
  return n;
}

TEST(RecipeCoverage, Nvfp4TailIsCeilOfFifteenPercent) {
  for (const char* name : {"nvfp4_per_token", "nvfp4_per_token_bf16_bwd",
                           "nvfp4_per_token_dequant_bwd", "nvfp4_per_token_w_per_tensor",
                           "nvfp4_per_tensor", "nvfp4_block", "w4a16_nvfp4", "w4a8_nvfp4_mxfp8"}) {
    for (auto [layers, tail] :
         {std::pair{20, 3}, std::pair{48, 8}, std::pair{40, 6}, std::pair{2, 1}}) {
      const ModelPlan p = resolve_model(builtin(name), layers);
      EXPECT_EQ(quantized_expert_layers(p), layers - tail) << name << " " << layers;
      EXPECT_TRUE(at(p, layers - tail - 1, ModuleClass::kExpertsFc2).quantized) << name;
      EXPECT_FALSE(at(p, layers - tail, ModuleClass::kExpertsFc2).quantized) << name;
      EXPECT_EQ(at(p, layers - 1, ModuleClass::kExpertsFc1).gemm[0], Format::kBf16);
    }
  }
}

TEST(RecipeCoverage, ExpertsScopeLeavesEverythingElseBf16) {
  const ModelPlan p = resolve_model(builtin("nvfp4_per_token"), 20);
  for (ModuleClass c : {ModuleClass::kQkv, ModuleClass::kAttnOut, ModuleClass::kRouter,
                        ModuleClass::kSharedFc1, ModuleClass::kSharedFc2}) {
    EXPECT_FALSE(at(p, 0, c).quantized) << module_class_name(c);
    EXPECT_EQ(at(p, 0, c).gemm, (std::array{Format::kBf16, Format::kBf16, Format::kBf16}));
    EXPECT_EQ(at(p, 0, c).backward_mode, BackwardMode::kHighPrecision);
  }
  EXPECT_FALSE(p.lm_head.quantized);
  const ModuleChoice& e = at(p, 0, ModuleClass::kExpertsFc1);
  EXPECT_EQ(e.gemm, (std::array{Format::kNvfp4, Format::kMxfp8, Format::kMxfp8}));
  EXPECT_EQ(e.backward_mode, BackwardMode::kQuantized);
  EXPECT_EQ(e.path, "layers.0.experts_fc1");
}

TEST(RecipeCoverage, AllLinearCoversAttentionAndSharedButNotRouterOrHead) {
  const ModelPlan p = resolve_model(builtin("fp8_block"), 4);
  for (int l = 0; l < 4; ++l) {
    for (ModuleClass c :
         {ModuleClass::kQkv, ModuleClass::kAttnOut, ModuleClass::kExpertsFc1,
          ModuleClass::kExpertsFc2, ModuleClass::kSharedFc1, ModuleClass::kSharedFc2})
      EXPECT_EQ(at(p, l, c).gemm[0], Format::kFp8) << l << module_class_name(c);
    EXPECT_FALSE(at(p, l, ModuleClass::kRouter).quantized);
  }
  EXPECT_FALSE(p.lm_head.quantized);
  // shared_experts_bf16 matters once the scope includes shared experts.
  const ModelPlan q = resolve_model(with_coverage("fp8_block", R"({"scope": "all_linear",
      "shared_experts_bf16": true})"),
                                    4);
  EXPECT_FALSE(at(q, 0, ModuleClass::kSharedFc1).quantized);
  EXPECT_EQ(at(q, 0, ModuleClass::kSharedFc1).rule, "coverage.shared_experts_bf16");
  EXPECT_TRUE(at(q, 0, ModuleClass::kQkv).quantized);
}

TEST(RecipeCoverage, FirstLastNAndExclusions) {
  const Recipe r = with_coverage("mxfp8", R"({"scope": "experts", "first_n_bf16": 2,
      "last_n_bf16": 1, "exclude_layers": [5, 7]})");
  const ModelPlan p = resolve_model(r, 10);
  const bool expect[10] = {false, false, true, true, true, false, true, false, true, false};
  for (int l = 0; l < 10; ++l)
    EXPECT_EQ(at(p, l, ModuleClass::kExpertsFc1).quantized, expect[l]) << l;
  EXPECT_NE(at(p, 0, ModuleClass::kExpertsFc1).rule.find("first_n_bf16"), std::string::npos);
  EXPECT_NE(at(p, 9, ModuleClass::kExpertsFc1).rule.find("last_n_bf16"), std::string::npos);
  EXPECT_NE(at(p, 5, ModuleClass::kExpertsFc1).rule.find("exclude_layers"), std::string::npos);
  // Exclusions past the model's depth are harmless.
  EXPECT_NO_THROW(resolve_model(with_coverage("mxfp8", R"({"exclude_layers": [99]})"), 4));
}

TEST(RecipeCoverage, TailRulesCombineAsUnion) {
  const Recipe r = with_coverage("nvfp4_per_token", R"({"scope": "experts",
      "last_fraction_bf16": 0.15, "last_n_bf16": 5})");
  EXPECT_EQ(quantized_expert_layers(resolve_model(r, 20)), 15);  // max(3, 5) layers bf16
}

TEST(RecipeCoverage, PatternOverridesLastMatchWins) {
  const Recipe r =
      with_coverage("nvfp4_per_token", R"({"scope": "experts", "last_fraction_bf16": 0.15,
      "overrides": [
        {"pattern": "layers.*.qkv", "precision": "quantized"},
        {"pattern": "layers.3.*", "precision": "bf16"},
        {"pattern": "layers.1?.experts_fc2", "precision": "quantized",
         "fprop": {"activation": {"format": "mxfp8"}, "weight": {"format": "mxfp8"}}},
        {"pattern": "lm_head", "precision": "quantized", "backward_mode": "high_precision"}]})");
  const ModelPlan p = resolve_model(r, 20);
  EXPECT_TRUE(at(p, 0, ModuleClass::kQkv).quantized);
  EXPECT_EQ(at(p, 0, ModuleClass::kQkv).gemm[0], Format::kNvfp4);
  EXPECT_TRUE(at(p, 19, ModuleClass::kQkv).quantized);  // overrides come after the tail rule
  EXPECT_FALSE(at(p, 3, ModuleClass::kQkv).quantized);  // a later override wins
  EXPECT_FALSE(at(p, 3, ModuleClass::kExpertsFc1).quantized);
  EXPECT_EQ(at(p, 12, ModuleClass::kExpertsFc2).gemm[0], Format::kMxfp8);
  EXPECT_TRUE(at(p, 18, ModuleClass::kExpertsFc2).quantized);  // re-enabled inside the tail
  EXPECT_EQ(at(p, 12, ModuleClass::kExpertsFc1).gemm[0], Format::kNvfp4);
  EXPECT_EQ(at(p, 2, ModuleClass::kExpertsFc2).gemm[0], Format::kNvfp4);  // '?' is one char
  EXPECT_TRUE(p.lm_head.quantized);
  EXPECT_EQ(p.lm_head.gemm, (std::array{Format::kNvfp4, Format::kBf16, Format::kBf16}));
  EXPECT_EQ(p.lm_head.backward_mode, BackwardMode::kHighPrecision);
  EXPECT_NE(p.lm_head.rule.find("coverage.overrides[3]"), std::string::npos);
  // And the recipe with overrides still round-trips.
  EXPECT_EQ(recipe_from_json(Json::parse(to_json(r).dump()), "rt"), r);
}

TEST(RecipeCoverage, CodeOverridesBeatEverything) {
  const Recipe& r = builtin("nvfp4_per_token");
  LinearSpec mx = builtin("mxfp8").linear;
  const CodeOverride code[] = {{"layers.0.experts_fc1", std::nullopt}, {"layers.19.*", mx}};
  const ModelPlan p = resolve_model(r, 20, code);
  EXPECT_FALSE(at(p, 0, ModuleClass::kExpertsFc1).quantized);
  EXPECT_EQ(at(p, 0, ModuleClass::kExpertsFc1).rule, "code override 'layers.0.experts_fc1'");
  EXPECT_EQ(at(p, 19, ModuleClass::kRouter).gemm[0], Format::kMxfp8);
  EXPECT_TRUE(at(p, 1, ModuleClass::kExpertsFc1).quantized);
}

TEST(RecipeCoverage, BackwardModesShapeTheBackwardGemms) {
  const ModuleChoice hp =
      resolve_module(builtin("nvfp4_per_token_bf16_bwd"), 0, ModuleClass::kExpertsFc1, 20);
  EXPECT_EQ(hp.gemm, (std::array{Format::kNvfp4, Format::kBf16, Format::kBf16}));
  EXPECT_EQ(hp.backward_mode, BackwardMode::kHighPrecision);
  const ModuleChoice dq =
      resolve_module(builtin("nvfp4_per_token_dequant_bwd"), 0, ModuleClass::kExpertsFc2, 20);
  EXPECT_EQ(dq.gemm, (std::array{Format::kNvfp4, Format::kBf16, Format::kBf16}));
  EXPECT_EQ(dq.backward_mode, BackwardMode::kDequantized);
  const ModuleChoice nb = resolve_module(builtin("nvfp4_block"), 0, ModuleClass::kExpertsFc2, 20);
  EXPECT_EQ(nb.gemm, (std::array{Format::kNvfp4, Format::kNvfp4, Format::kNvfp4}));
  EXPECT_TRUE(nb.spec[Gemm::kWgrad].a.hadamard);
  const ModuleChoice w4 = resolve_module(builtin("w4a16_nvfp4"), 0, ModuleClass::kExpertsFc1, 20);
  EXPECT_EQ(w4.gemm, (std::array{Format::kNvfp4, Format::kBf16, Format::kBf16}));
  EXPECT_EQ(w4.backward_mode, BackwardMode::kDequantized);
}

TEST(RecipeCoverage, PerClassModulesSpec) {
  Json j = to_json(builtin("nvfp4_per_token"));
  j["modules"]["experts_fc2"] = Json::parse(R"({"fprop": {"activation": {"format": "mxfp8"}}})");
  const Recipe r = recipe_from_json(j, "t");
  EXPECT_EQ(resolve_module(r, 0, ModuleClass::kExpertsFc2, 20).gemm[0], Format::kNvfp4);  // w nvfp4
  EXPECT_EQ(r.spec_for(ModuleClass::kExpertsFc2)[Gemm::kFprop].a.format, Format::kMxfp8);
  EXPECT_EQ(r.spec_for(ModuleClass::kExpertsFc1)[Gemm::kFprop].a.format, Format::kNvfp4);
  EXPECT_EQ(recipe_from_json(Json::parse(to_json(r).dump()), "rt"), r);
}

TEST(RecipeCoverage, GlobAndPaths) {
  EXPECT_TRUE(glob_match("layers.*.experts_*", "layers.12.experts_fc1"));
  EXPECT_TRUE(glob_match("*", "lm_head"));
  EXPECT_FALSE(glob_match("layers.1", "layers.12"));
  EXPECT_TRUE(glob_match("layers.1*", "layers.12.qkv"));
  EXPECT_FALSE(glob_match("layers.?.qkv", "layers.12.qkv"));
  EXPECT_EQ(module_path(3, ModuleClass::kSharedFc2), "layers.3.shared_fc2");
  EXPECT_EQ(module_path(3, ModuleClass::kLmHead), "lm_head");
  EXPECT_THROW(resolve_module(builtin("bf16"), 5, ModuleClass::kQkv, 5), RecipeError);
  EXPECT_THROW(resolve_model(builtin("bf16"), 0), RecipeError);
}

TEST(RecipeCoverage, ModelDepthIsBounded) {
  // The bound keeps describe --layers 10^8 from allocating until bad_alloc; it is far above
  // real models.
  EXPECT_EQ(resolve_model(builtin("nvfp4_per_token"), kMaxModelLayers).per_layer.size(),
            size_t(kMaxModelLayers));
  try {
    resolve_model(builtin("nvfp4_per_token"), 100000000);
    ADD_FAILURE() << "10^8 layers accepted";
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("100000000 layers is deeper than the 1024"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(resolve_module(builtin("bf16"), 0, ModuleClass::kQkv, kMaxModelLayers + 1),
               RecipeError);
}

TEST(RecipeCoverage, PlanJsonHasTheDescribeSchema) {
  const Json j = plan_json(resolve_model(builtin("nvfp4_per_token"), 20));
  EXPECT_EQ(j["recipe"], "nvfp4_per_token");
  ASSERT_EQ(j["layers"].size(), 20u);
  EXPECT_EQ(j["layers"][0]["layer"], 0);
  const Json& m = j["layers"][0]["modules"];
  std::vector<std::string> keys;
  for (const auto& [k, v] : m.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"qkv", "attn_out", "router", "experts_fc1",
                                            "experts_fc2", "shared_fc1", "shared_fc2"}));
  EXPECT_EQ(m["experts_fc1"].dump(),
            R"({"fprop":"nvfp4","dgrad":"mxfp8","wgrad":"mxfp8","backward_mode":"quantized"})");
  EXPECT_EQ(j["lm_head"].dump(),
            R"({"fprop":"bf16","dgrad":"bf16","wgrad":"bf16","backward_mode":"high_precision"})");
}

}  // namespace
}  // namespace lockstep
