// lockstep's model reader against directories written by transformers' own save_pretrained
// (tests/data/hf, made by make_fixtures.py there): the configuration transformers meant, and every
// stored tensor recovered bit for bit through lockstep's fused layout.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "lockstep/model/weights.h"
#include "model_test_util.h"

namespace lockstep::model {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(LOCKSTEP_SOURCE_DIR) / "tests" / "data" / "hf";

// Every tensor of every safetensors file in `dir`, as transformers stored it.
std::map<std::string, Tensor> stored_tensors(const fs::path& dir) {
  std::map<std::string, Tensor> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    for (auto& nt : read_safetensors(e.path().string()).tensors) {
      const std::string name = nt.name;
      EXPECT_TRUE(out.emplace(name, std::move(nt.tensor)).second) << name;
    }
  }
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().bytes().data(), b.contiguous().bytes().data(), a.nbytes()) == 0;
}

void expect_exact_recovery(const fs::path& dir, DType dtype) {
  const ModelWeights w = load_model_dir(dir.string());
  const auto stored = stored_tensors(dir);
  const auto back = weights_to_hf(w, dtype);
  ASSERT_EQ(back.size(), stored.size());
  for (const auto& [name, t] : stored) {
    ASSERT_TRUE(back.contains(name)) << name;
    EXPECT_TRUE(same_bytes(back.at(name), t)) << name;
  }
}

TEST(ModelHfFiles, ShardedBf16MoeFromTransformers) {
  const fs::path dir = kData / "qwen3_moe_bf16_sharded";
  const ModelConfig c = load_config((dir / kConfigFile).string());
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.num_experts, 2);  // written as num_local_experts
  EXPECT_EQ(c.num_experts_per_tok, 1);
  EXPECT_EQ(c.moe_intermediate_size, 8);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope_theta, 5e5);  // written under rope_parameters
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.layer_is_moe(0));
  EXPECT_FALSE(c.layer_is_moe(1));  // mlp_only_layers [1]
  EXPECT_TRUE(fs::exists(dir / kIndexFile));
  expect_exact_recovery(dir, DType::kBF16);
}

TEST(ModelHfFiles, TiedF32DenseFromTransformers) {
  const fs::path dir = kData / "qwen3_f32_tied";
  const ModelWeights w = load_model_dir(dir.string());
  EXPECT_EQ(w.config.model_type, "qwen3");
  EXPECT_EQ(w.config.head_dim, 128);  // Qwen3Config's default, with hidden 16 and 2 heads
  EXPECT_TRUE(w.config.tie_word_embeddings);
  EXPECT_FALSE(w.tensors.contains("lm_head"));
  EXPECT_EQ(w.at("layers.0.qkv").shape(), (std::vector<int64_t>{(2 + 2 * 2) * 128, 16}));
  expect_exact_recovery(dir, DType::kF32);
}

// Re-saved by lockstep with transformers' shard limit, the directory lists the same tensors.
TEST(ModelHfFiles, ResavedIndexListsTheSameTensors) {
  const fs::path dir = kData / "qwen3_moe_bf16_sharded";
  test::ScratchDir out;
  save_model_dir(load_model_dir(dir.string()), out.path().string(), DType::kBF16, 1000);
  const auto theirs = Json::parse(std::ifstream(dir / kIndexFile)).at("weight_map");
  const auto mine = Json::parse(std::ifstream(out.path() / kIndexFile)).at("weight_map");
  std::set<std::string> a, b;
  for (const auto& [k, v] : theirs.items()) a.insert(k);
  for (const auto& [k, v] : mine.items()) b.insert(k);
  EXPECT_EQ(a, b);
  const auto stored = stored_tensors(dir);
  for (const auto& [name, t] : stored_tensors(out.path()))
    EXPECT_TRUE(same_bytes(t, stored.at(name))) << name;
}

}  // namespace
}  // namespace lockstep::model
