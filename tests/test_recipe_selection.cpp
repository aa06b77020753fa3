// Recipe selection precedence (code > file > flag > env > default), conflicts, recipe files with
// "extends", DISABLE_BACKWARD_QUANT, and the run_meta.json / --dry-run provenance writers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lockstep/diag/run_meta.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/recipe/selection.h"
#include "lockstep/tensor/file_io.h"
#include "test_util.h"

namespace lockstep {
namespace {

using test::builtin;
using test::error_of;

namespace fs = std::filesystem;

struct RecipeFileDir {
  fs::path path;
  RecipeFileDir() {
    path = fs::temp_directory_path() /
           ("lockstep_recipe_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~RecipeFileDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

TEST(RecipeSelection, PrecedenceCodeFileFlagEnvDefault) {
  RecipeFileDir t;
  const std::string file = t.write("mine.json", R"({"extends": "mxfp8"})");
  SelectionInputs in;
  EXPECT_EQ(select_recipe(in).recipe.name, "bf16");
  EXPECT_EQ(select_recipe(in).provenance.source, RecipeSource::kDefault);
  in.env_recipe = "";  // empty counts as unset
  EXPECT_EQ(select_recipe(in).provenance.source, RecipeSource::kDefault);
  in.env_recipe = "fp8_block";
  EXPECT_EQ(select_recipe(in).recipe.name, "fp8_block");
  EXPECT_EQ(select_recipe(in).provenance.source, RecipeSource::kEnv);
  in.recipe_name = "nvfp4_block";
  SelectedRecipe s = select_recipe(in);
  EXPECT_EQ(s.recipe.name, "nvfp4_block");
  EXPECT_EQ(s.provenance.source, RecipeSource::kFlag);
  ASSERT_EQ(s.provenance.shadowed.size(), 1u);
  EXPECT_NE(s.provenance.shadowed[0].find("LOCKSTEP_RECIPE=fp8_block ignored"), std::string::npos);
  in.recipe_name.reset();
  in.recipe_file = file;
  s = select_recipe(in);
  EXPECT_EQ(s.recipe.name, "mine");  // named after the file
  EXPECT_EQ(s.provenance.source, RecipeSource::kFile);
  EXPECT_EQ(s.provenance.extends, "mxfp8");
  in.code_recipe = builtin_recipe_or_throw("w4a16_nvfp4", "t").recipe;
  s = select_recipe(in);
  EXPECT_EQ(s.recipe.name, "w4a16_nvfp4");
  EXPECT_EQ(s.provenance.source, RecipeSource::kCode);
  EXPECT_EQ(s.provenance.shadowed.size(), 2u);  // file and env
}

TEST(RecipeSelection, FlagAndFileTogetherIsAnError) {
  RecipeFileDir t;
  SelectionInputs in;
  in.recipe_name = "mxfp8";
  in.recipe_file = t.write("r.json", R"({"name": "x"})");
  const std::string e = error_of<RecipeError>([&] { select_recipe(in); });
  EXPECT_NE(e.find("--recipe mxfp8 and --recipe-file"), std::string::npos) << e;
  EXPECT_NE(e.find("\"extends\""), std::string::npos) << e;
}

TEST(RecipeSelection, UnknownNamesFromFlagEnvAndExtendsListClosest) {
  SelectionInputs in;
  in.recipe_name = "nvfp4_per_tokn";
  std::string e = error_of<RecipeError>([&] { select_recipe(in); });
  EXPECT_NE(e.find("unknown recipe 'nvfp4_per_tokn' (--recipe); closest: nvfp4_per_token"),
            std::string::npos)
      << e;
  in.recipe_name.reset();
  in.env_recipe = "fp8_blocks";
  e = error_of<RecipeError>([&] { select_recipe(in); });
  EXPECT_NE(e.find("LOCKSTEP_RECIPE=fp8_blocks"), std::string::npos) << e;
  EXPECT_NE(e.find("closest: fp8_block"), std::string::npos) << e;
  RecipeFileDir t;
  in.recipe_file = t.write("bad.json", R"({"extends": "mxfp9"})");
  e = error_of<RecipeError>([&] { select_recipe(in); });
  EXPECT_NE(e.find("closest: mxfp8"), std::string::npos) << e;
}

TEST(RecipeSelection, FileErrorsNameTheFile) {
  RecipeFileDir t;
  EXPECT_NE(error_of<RecipeError>([&] {
              load_recipe_file((t.path / "missing.json").string());
            }).find("cannot read recipe file"),
            std::string::npos);
  const std::string bad = t.write("bad.json", "{not json");
  EXPECT_NE(
      error_of<RecipeError>([&] { load_recipe_file(bad); }).find("bad.json' is not valid JSON"),
      std::string::npos);
  const std::string arr = t.write("arr.json", "[1]");
  EXPECT_NE(error_of<RecipeError>([&] { load_recipe_file(arr); }).find("must be a JSON object"),
            std::string::npos);
  const std::string typo =
      t.write("typo.json", R"({"extends": "bf16", "coverage": {"scop": "experts"}})");
  const std::string e = error_of<RecipeError>([&] { load_recipe_file(typo); });
  EXPECT_NE(e.find("typo.json.coverage: unknown key 'scop'"), std::string::npos) << e;
}

TEST(RecipeSelection, EveryBuiltinRoundTripsThroughAFile) {
  RecipeFileDir t;
  for (const RecipeInfo& info : builtin_recipes()) {
    const std::string f = t.write(info.name + ".json", to_json(info.recipe).dump(2));
    SelectionInputs in;
    in.recipe_file = f;
    EXPECT_EQ(select_recipe(in).recipe, info.recipe) << info.name;
  }
}

TEST(RecipeSelection, FileExtendsMergesAndReplacesOperandsWithANewFormat) {
  RecipeFileDir t;
  const std::string f = t.write("x.json", R"({"extends": "fp8_block", "name": "fp8_block_experts",
      "fprop": {"activation": {"format": "mxfp8"}, "weight": {"pow2": false}},
      "coverage": {"scope": "experts", "last_n_bf16": 2}})");
  RecipeProvenance p;
  const Recipe r = load_recipe_file(f, &p);
  const Recipe& base = builtin_recipe_or_throw("fp8_block", "t").recipe;
  EXPECT_EQ(r.name, "fp8_block_experts");
  EXPECT_EQ(r.linear[Gemm::kFprop].a,
            (QuantSpec{.format = Format::kMxfp8, .scaling = Scaling::kBlock1x32}));
  EXPECT_EQ(r.linear[Gemm::kFprop].b.scaling, Scaling::kBlock128x128);  // merged, not replaced
  EXPECT_FALSE(r.linear[Gemm::kFprop].b.pow2);
  EXPECT_EQ(r.linear[Gemm::kDgrad], base.linear[Gemm::kDgrad]);
  EXPECT_EQ(r.coverage.scope, CoverageScope::kExperts);
  EXPECT_EQ(r.coverage.last_n_bf16, 2);
  EXPECT_EQ(p.fields_from_file, (std::vector<std::string>{"extends", "name", "fprop", "coverage"}));
}

TEST(RecipeSelection, DisableBackwardQuantIsAnAliasOfHighPrecision) {
  SelectionInputs in;
  in.recipe_name = "nvfp4_per_token";
  in.env_disable_backward_quant = "1";
  const SelectedRecipe s = select_recipe(in);
  EXPECT_EQ(s.recipe.linear.backward_mode, BackwardMode::kHighPrecision);
  EXPECT_NE(s.provenance.backward_mode_source.find("DISABLE_BACKWARD_QUANT=1"), std::string::npos);
  EXPECT_NE(s.provenance.backward_mode_source.find("high_precision"), std::string::npos);
  in.env_disable_backward_quant = "0";
  EXPECT_EQ(select_recipe(in).recipe.linear.backward_mode, BackwardMode::kQuantized);
  EXPECT_EQ(select_recipe(in).provenance.backward_mode_source, "recipe");
  in.env_disable_backward_quant = "yes";
  EXPECT_NE(error_of<RecipeError>([&] {
              select_recipe(in);
            }).find("DISABLE_BACKWARD_QUANT=yes: expected 0 or 1"),
            std::string::npos);
}

TEST(RecipeRunMeta, WritesAtomicallyWithProvenance) {
  RecipeFileDir t;
  SelectionInputs in;
  in.recipe_name = "nvfp4_per_token";
  const SelectedRecipe s = select_recipe(in);
  RunMetaExtras x;
  x.command = "train";
  x.argv = {"lockstep", "train", "--recipe", "nvfp4_per_token"};
  x.layers = 20;
  x.seeds = {{"init", 1}, {"sampling", 2}};
  x.layouts = {{"scale_layout", "compact"}};
  const fs::path out = t.path / "run_meta.json";
  write_run_meta(out, s, x);
  std::ifstream f(out);
  const Json j = Json::parse(f);
  EXPECT_EQ(j["recipe"]["name"], "nvfp4_per_token");
  EXPECT_EQ(j["recipe"]["provenance"]["source"], "flag");
  EXPECT_EQ(j["recipe"]["backward_mode"], "quantized");
  EXPECT_EQ(recipe_from_json(j["recipe"]["content"], "meta"), s.recipe);
  EXPECT_EQ(j["coverage"]["per_class"]["experts_fc1"][0]["layers"], "0-16");
  EXPECT_EQ(j["coverage"]["per_class"]["experts_fc1"][1]["layers"], "17-19");
  EXPECT_EQ(j["seeds"]["sampling"], 2);
  EXPECT_EQ(j["layouts"]["scale_layout"], "compact");
  EXPECT_TRUE(j["build"].contains("source_revision"));
  EXPECT_TRUE(j["build"].contains("build_type"));
  EXPECT_TRUE(j["device"].contains("used"));
  EXPECT_TRUE(j["environment"].contains("DISABLE_BACKWARD_QUANT"));
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(t.path)) ++files;
  EXPECT_EQ(files, 1u);  // no temporary left behind
  EXPECT_THROW(write_run_meta(t.path / "no_such_dir" / "run_meta.json", s, x), OutputPathError);
}

TEST(RecipeRunMeta, DryRunTextNamesCommandRecipeAndEnvironment) {
  SelectionInputs in;
  in.env_recipe = "mxfp8";
  const std::string txt = dry_run_text(select_recipe(in), {"lockstep", "train", "--out", "a b"});
  EXPECT_NE(txt.find("command: lockstep train --out 'a b'"), std::string::npos) << txt;
  EXPECT_NE(txt.find("recipe: mxfp8 (from env: LOCKSTEP_RECIPE=mxfp8)"), std::string::npos) << txt;
  EXPECT_NE(txt.find("DISABLE_BACKWARD_QUANT="), std::string::npos) << txt;
  EXPECT_NE(txt.find("\"name\": \"mxfp8\""), std::string::npos) << txt;
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
}

}  // namespace
}  // namespace lockstep
