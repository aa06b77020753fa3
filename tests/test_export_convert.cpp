// The converter and the export plan: a supplied amax gives the bytes of reading the weight for
// it (every path that takes one), q / k / v as separate domains, versions that only move forward,
// a checksum that covers the recipe's content and the config, gate / up sharing one outer scale,
// and the recipes each export format refuses (naming the layer and why).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "lockstep/convert/export.h"
#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/quant/given_amax.h"
#include "test_util.h"
#include "tiny_model_util.h"

using namespace lockstep;
using namespace lockstep::model;
using namespace lockstep::test;

namespace {

const Recipe& conv_recipe(const char* name) { return builtin_recipe_or_throw(name, "test").recipe; }

// A recipe that quantizes every linear module (qkv too) with NVFP4 weights of `scaling`.
Recipe nvfp4_all_linear(Scaling scaling, bool block2d = false) {
  Recipe r = conv_recipe("w4a16_nvfp4");
  r.name = "test_nvfp4_all_linear";
  r.linear[Gemm::kFprop].b.scaling = scaling;
  r.linear[Gemm::kFprop].b.block2d = block2d;
  r.coverage.scope = CoverageScope::kAllLinear;
  r.coverage.last_fraction_bf16 = 0.0;
  r.coverage.shared_experts_bf16 = false;
  return r;
}

std::vector<uint8_t> host_bytes(const Tensor& t) {
  if (!t.defined()) return {};
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw());
  return {p, p + c.nbytes()};
}

void expect_same_qtensor(const QTensor& a, const QTensor& b, const std::string& what) {
  EXPECT_EQ(a.scaling, b.scaling) << what;
  EXPECT_EQ(a.group_offsets, b.group_offsets) << what;
  for (const auto& [pa, pb] : {std::pair{&a.rowwise.data, &b.rowwise.data},
                               std::pair{&a.rowwise.block_scale, &b.rowwise.block_scale},
                               std::pair{&a.rowwise.amax, &b.rowwise.amax}})
    EXPECT_EQ(host_bytes(*pa), host_bytes(*pb)) << what;
}

float amax_rows(const Tensor& w, int64_t r0, int64_t r1) {
  const std::vector<float> v = to_f32(w.slice_rows(r0, r1).contiguous());
  float a = 0.0f;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}

Tensor f32_values(std::vector<float> v) {
  const int64_t n = int64_t(v.size());
  return Tensor::from_vector<float>(v, {n}, DType::kF32);
}

}  // namespace

TEST(QuantizeWithAmax, EqualsReadingTheAmaxAndJointForALargerOne) {
  TinyOptions o;
  const model::ModelWeights w = tiny_weights(tiny_config(o), test_seed() + 11);
  const Tensor x = w.at("layers.0.qkv");  // [64, 32] F32
  for (bool block2d : {false, true})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const Tensor xs = cast(x, dt);
      QuantConfig cfg;
      cfg.format = Format::kNvfp4;
      cfg.block2d = block2d;
      const std::string what = fmt::format("block2d {} {}", block2d, dtype_name(dt));
      const QTensor ref = quantize(xs, cfg, "x");
      const QTensor given =
          quantize_with_amax(xs, {}, f32_values({amax_rows(xs, 0, xs.rows())}), cfg, "x");
      expect_same_qtensor(given, ref, what);
      // A larger amax is a joint quantization's (the other tensor holding the larger value).
      const Tensor three =
          cast(Tensor::from_vector<float>(std::vector<float>(size_t(16 * xs.cols()), 3.0f),
                                          {16, xs.cols()}, DType::kF32),
               dt);
      const std::vector<Tensor> pair{xs, three};
      const std::vector<QTensor> joint = quantize_joint(pair, cfg);
      const QTensor with3 = quantize_with_amax(xs, {}, f32_values({3.0f}), cfg, "x");
      expect_same_qtensor(with3, joint[0], what + " joint");
    }
  // Grouped per_group: one amax per group.
  const Tensor e = w.at("layers.0.gate_up");           // [128, 32]
  const std::vector<int64_t> off{0, 32, 32, 96, 128};  // an empty group too
  QuantConfig g;
  g.format = Format::kNvfp4;
  g.scaling = Scaling::kPerGroup;
  const QTensor ref = quantize_grouped(e, off, g, "e");
  const QTensor given = quantize_with_amax(
      e, off, f32_values({amax_rows(e, 0, 32), 0.0f, amax_rows(e, 32, 96), amax_rows(e, 96, 128)}),
      g, "e");
  expect_same_qtensor(given, ref, "per_group");
}

TEST(QuantizeWithAmax, RefusesWhatAnAmaxCannotStandFor) {
  const Tensor x(DType::kF32, {16, 32});
  QuantConfig c;
  c.format = Format::kNvfp4;
  c.scaling = Scaling::kPerRow;
  EXPECT_THROW(quantize_with_amax(x, {}, f32_values({1.0f}), c, "x"), QuantError);
  QuantConfig m;
  m.format = Format::kMxfp8;
  m.scaling = Scaling::kBlock1x32;
  EXPECT_THROW(quantize_with_amax(x, {}, f32_values({1.0f}), m, "x"), QuantError);
  QuantConfig col;
  col.format = Format::kNvfp4;
  col.colwise = true;
  EXPECT_THROW(quantize_with_amax(x, {}, f32_values({1.0f}), col, "x"), QuantError);
  QuantConfig ok;
  ok.format = Format::kNvfp4;
  EXPECT_THROW(quantize_with_amax(x, {}, f32_values({1.0f, 2.0f}), ok, "x"), QuantError);
  EXPECT_THROW(quantize_with_amax(x, {}, f32_values({-1.0f}), ok, "x"), QuantError);
}

TEST(Converter, SuppliedAmaxGivesTheSameBytesAndChecksum) {
  TinyOptions o;
  o.moe = true;
  o.shared_expert = true;
  const ModelConfig c = tiny_config(o);
  const ModelWeights w = tiny_weights(c, test_seed() + 12);
  for (const Recipe& r :
       {nvfp4_all_linear(Scaling::kPerGroup), nvfp4_all_linear(Scaling::kPerTensor),
        nvfp4_all_linear(Scaling::kPerGroup, /*block2d=*/true)}) {
    for (bool fuse : {true, false}) {
      ExportOptions opt;
      opt.fuse_scales = fuse;
      const PolicyVersion ref = export_policy(w, r, 5, opt);
      const ModelPlan plan = resolve_model(r, int(c.num_hidden_layers));
      WeightAmax amax;
      int64_t supplied = 0;
      for (const LinearSite& s : linear_sites(c)) {
        const auto dom = weight_amax_domains(c, plan, s, opt);
        if (!dom) continue;
        std::vector<float> a;
        for (size_t d = 0; d + 1 < dom->size(); ++d)
          a.push_back(amax_rows(w.at(s.name), (*dom)[d], (*dom)[d + 1]));
        amax[s.name] = f32_values(a);
        ++supplied;
      }
      ASSERT_GT(supplied, 0);
      const PolicyVersion given = export_policy(w, r, 5, opt, &amax);
      EXPECT_EQ(given.checksum, ref.checksum) << r.name << " fuse " << fuse;
      for (const auto& [k, op] : ref.operands)
        if (op.quantized()) expect_same_qtensor(given.operands.at(k).q, op.q, k);
      // A wrong amax changes the bytes (the supplied value is used, not re-read).
      WeightAmax wrong = amax;
      wrong.begin()->second =
          f32_values(std::vector<float>(size_t(wrong.begin()->second.numel()), 7.0f));
      EXPECT_NE(export_policy(w, r, 5, opt, &wrong).checksum, ref.checksum);
    }
  }
}

TEST(Converter, FusedScalesShareOneDomainSeparateGiveEachProjectionItsOwn) {
  const ModelConfig c = tiny_config();
  const ModelWeights w = tiny_weights(c, test_seed() + 13);
  const Recipe r = nvfp4_all_linear(Scaling::kPerTensor);
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const Tensor qkv = w.at("layers.1.qkv");
  const PolicyVersion fused = export_policy(w, r, 0);
  EXPECT_EQ(fused.operands.at("layers.1.qkv").q.rowwise.amax.numel(), 1);
  EXPECT_EQ(fused.operands.at("layers.1.qkv").q.rowwise.amax.ptr<float>()[0],
            amax_rows(qkv, 0, qkv.rows()));
  ExportOptions sep;
  sep.fuse_scales = false;
  const PolicyVersion split = export_policy(w, r, 0, sep);
  const QTensor& sq = split.operands.at("layers.1.qkv").q;
  ASSERT_EQ(sq.rowwise.amax.numel(), 3);
  const int64_t bounds[4] = {0, q, q + kv, q + 2 * kv};
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(sq.rowwise.amax.ptr<float>()[d], amax_rows(qkv, bounds[d], bounds[d + 1]));
    // Each projection's rows are its own per-tensor quantization.
    const QTensor alone = quantize(qkv.slice_rows(bounds[d], bounds[d + 1]).contiguous(),
                                   QuantConfig(default_spec(Format::kNvfp4)), "alone");
    const auto all = host_bytes(sq.rowwise.data);
    const auto own = host_bytes(alone.rowwise.data);
    EXPECT_TRUE(std::equal(own.begin(), own.end(), all.begin() + bounds[d] * qkv.cols() / 2))
        << "projection " << d;
  }
  EXPECT_NE(split.checksum, fused.checksum);
  // The sampler runs the separate domains.
  Sampler s;
  s.load_policy(split, 0, r.name);
  const std::vector<float> lp = s.score(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{4, 5});
  for (float v : lp) EXPECT_TRUE(std::isfinite(v));
}

TEST(Converter, GateAndUpShareOneOuterScalePerExpert) {
  TinyOptions o;
  o.moe = true;
  o.layers = 4;  // layer 3 is the recipe's bf16 tail
  const ModelConfig c = tiny_config(o);
  const ModelWeights w = tiny_weights(c, test_seed() + 14);
  const PolicyVersion p = export_policy(w, conv_recipe("nvfp4_per_token_w_per_tensor"), 0);
  const QTensor& fc1 = p.operands.at("layers.1.experts_fc1").q;
  // per_group: one amax per expert over its gate and up rows together.
  ASSERT_EQ(fc1.rowwise.amax.numel(), c.num_experts);
  const Tensor m = w.at("layers.1.experts_fc1");
  const int64_t rows = 2 * c.moe_intermediate_size;
  for (int64_t e = 0; e < c.num_experts; ++e)
    EXPECT_EQ(fc1.rowwise.amax.ptr<float>()[e], amax_rows(m, e * rows, (e + 1) * rows));
}

TEST(Converter, VersionsOnlyMoveForward) {
  const ModelConfig c = tiny_config();
  const ModelWeights w = tiny_weights(c, test_seed() + 15);
  PolicyConverter conv(conv_recipe("nvfp4_per_token"));
  EXPECT_FALSE(conv.last_version());
  EXPECT_NO_THROW(conv.convert(w, 3));
  EXPECT_THROW(conv.convert(w, 3), PolicyError);
  EXPECT_THROW(conv.convert(w, 2), PolicyError);
  EXPECT_EQ(*conv.last_version(), 3);
  EXPECT_EQ(conv.convert(w, 4).version, 4);
}

TEST(Converter, ChecksumCoversRecipeContentConfigAndShapes) {
  const ModelConfig c = tiny_config();
  const ModelWeights w = tiny_weights(c, test_seed() + 16);
  const Recipe r = conv_recipe("nvfp4_per_token");
  const PolicyVersion p = export_policy(w, r, 1);
  // The same name with other content (a bf16 layer more, which changes no quantized byte of the
  // first layers but is another policy).
  Recipe other = r;
  other.purpose = "another purpose";
  EXPECT_NE(export_policy(w, other, 1).checksum, p.checksum);
  // Another config that keeps every tensor's bytes.
  PolicyVersion q = p;
  q.config.rms_norm_eps = 1e-5;
  EXPECT_NE(policy_checksum(q), p.checksum);
  // The same bytes under another shape.
  PolicyVersion s = p;
  s.dense.at("final_norm") = s.dense.at("final_norm").view({2, c.hidden_size / 2});
  EXPECT_NE(policy_checksum(s), p.checksum);
}

TEST(ExportPlan, RefusesWhatAFormatCannotExpressNamingTheLayer) {
  TinyOptions o;
  o.moe = true;
  o.layers = 4;
  ModelConfig c = tiny_config(o);
  auto message = [&](const Recipe& r, convert::HfFormat f, bool weights_only = false) {
    convert::HfExportOptions opt;
    opt.format = f;
    opt.weights_only = weights_only;
    try {
      convert::plan_export(c, r, opt);
    } catch (const convert::ExportError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  using convert::HfFormat;
  std::string m = message(conv_recipe("nvfp4_per_token"), HfFormat::kModeloptNvfp4, true);
  EXPECT_NE(m.find("layers.0.experts_fc1"), std::string::npos) << m;  // layer 0's dense MLP
  EXPECT_NE(m.find("per-row"), std::string::npos) << m;
  m = message(conv_recipe("mxfp8"), HfFormat::kMxfp8);  // expert K = 16
  EXPECT_NE(m.find("layers.1.experts_fc2"), std::string::npos) << m;
  EXPECT_NE(m.find("not a multiple of the 32-element block"), std::string::npos) << m;
  m = message(conv_recipe("mxfp8"), HfFormat::kCompressedTensorsNvfp4);
  EXPECT_NE(m.find("layers.0.qkv"), std::string::npos) << m;
  EXPECT_NE(m.find("mxfp8"), std::string::npos) << m;
  m = message(conv_recipe("fp8_per_tensor"), HfFormat::kFp8Block);
  EXPECT_NE(m.find("per_tensor"), std::string::npos) << m;
  m = message(conv_recipe("nvfp4_per_token_w_per_tensor"), HfFormat::kModeloptNvfp4);
  EXPECT_NE(m.find("--input-amax"), std::string::npos) << m;
  m = message(conv_recipe("bf16"), HfFormat::kMxfp8);
  EXPECT_NE(m.find("quantizes no linear layer"), std::string::npos) << m;
  EXPECT_EQ(message(conv_recipe("nvfp4_per_token_w_per_tensor"), HfFormat::kModeloptNvfp4, true),
            "");
  c.moe_intermediate_size = 32;
  EXPECT_EQ(message(conv_recipe("mxfp8"), HfFormat::kMxfp8), "");
  EXPECT_EQ(message(conv_recipe("fp8_block"), HfFormat::kFp8Block), "");
  EXPECT_THROW(convert::hf_format_or_throw("nvfp4"), convert::ExportError);
  // A tied head the recipe quantizes has no place in the formats.
  TinyOptions t;
  t.tied = true;
  Recipe head = nvfp4_all_linear(Scaling::kPerTensor);
  head.coverage.overrides.push_back({"lm_head", false, {}});
  convert::HfExportOptions opt;
  opt.weights_only = true;
  try {
    convert::plan_export(tiny_config(t), head, opt);
    ADD_FAILURE() << "a quantized tied head was accepted";
  } catch (const convert::ExportError& e) {
    EXPECT_NE(std::string(e.what()).find("tie"), std::string::npos) << e.what();
  }
}

TEST(ExportPlan, ModuleNamesAndExcludedLayers) {
  TinyOptions o;
  o.moe = true;
  o.layers = 4;  // layer 0 dense, layers 1-3 MoE, layer 3 the bf16 tail
  const ModelConfig c = tiny_config(o);
  convert::HfExportOptions opt;
  opt.weights_only = true;
  const convert::ExportPlan p =
      convert::plan_export(c, conv_recipe("nvfp4_per_token_w_per_tensor"), opt);
  std::set<std::string> names;
  for (const auto& u : p.units)
    for (const auto& s : u.specs) names.insert(s.name);
  for (const char* n :
       {"model.layers.1.mlp.experts.3.gate_proj.weight",
        "model.layers.1.mlp.experts.3.up_proj.weight_scale",
        "model.layers.1.mlp.experts.0.down_proj.weight_scale_2",
        "model.layers.1.self_attn.q_proj.weight", "model.embed_tokens.weight", "lm_head.weight"})
    EXPECT_TRUE(names.contains(n)) << n;
  const std::set<std::string> ignore(p.ignore.begin(), p.ignore.end());
  EXPECT_TRUE(ignore.contains("model.layers.1.self_attn.q_proj"));
  EXPECT_TRUE(ignore.contains("model.layers.1.mlp.gate"));
  EXPECT_TRUE(ignore.contains("lm_head"));
  EXPECT_TRUE(ignore.contains("model.layers.3.mlp.experts"));
  EXPECT_TRUE(ignore.contains("model.layers.3.mlp.experts.0.gate_proj"));
  EXPECT_FALSE(ignore.contains("model.layers.0.mlp.gate_proj"));  // a dense MLP counts as experts
  EXPECT_FALSE(ignore.contains("model.layers.1.mlp.experts.0.gate_proj"));
}
