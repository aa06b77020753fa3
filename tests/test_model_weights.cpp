// Tests of the model weights: the layout and its Hugging Face names, deterministic init and its
// portable normal generator, HF -> lockstep -> HF round trips (bit-exact; f32 and bf16; single
// file and shards; tied and untied; dense and MoE), and one test per refused input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "lockstep/model/weights.h"
#include "lockstep/numerics/gaussian.h"
#include "model_test_util.h"
#include "test_util.h"

namespace lockstep::model {
namespace {

namespace fs = std::filesystem;
using test::expect_throw_naming;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  auto b = t.contiguous().bytes();
  std::vector<uint8_t> out(b.size());
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

// Independent random HF tensors for config c: every element a random value of `dtype` drawn
// from the test seed (norms included), so a layout mix-up cannot hide behind equal values.
std::map<std::string, Tensor> random_hf(const ModelConfig& c, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : weights_to_hf(init_weights(c, 0), DType::kF32)) {
    std::vector<float> v(size_t(t.numel()));
    for (float& x : v) x = nd(rng);
    out.emplace(name, from_f32(v, t.shape(), dtype));
  }
  return out;
}

// The configurations the round trips cover: dense and MoE, tied and untied, a MoE model with
// dense layers (mlp_only_layers, decoder_sparse_step) and a shared expert.
std::vector<std::pair<std::string, ModelConfig>> layouts() {
  ModelConfig dense_untied = preset("tiny-dense");
  dense_untied.tie_word_embeddings = false;
  dense_untied.num_hidden_layers = 2;
  ModelConfig dense_tied = dense_untied;
  dense_tied.tie_word_embeddings = true;
  ModelConfig moe = preset("tiny-moe");
  moe.num_hidden_layers = 2;
  ModelConfig moe_tied = moe;
  moe_tied.tie_word_embeddings = true;
  ModelConfig mixed = preset("tiny-moe");
  mixed.num_hidden_layers = 4;
  mixed.decoder_sparse_step = 2;
  mixed.mlp_only_layers = {3};
  mixed.shared_expert_intermediate_size = 32;
  mixed.num_experts = 3;
  mixed.moe_intermediate_size = 16;
  return {{"dense_untied", dense_untied},
          {"dense_tied", dense_tied},
          {"moe_untied", moe},
          {"moe_tied", moe_tied},
          {"moe_mixed_shared", mixed}};
}

TEST(ModelWeights, ShapesOfTheLayout) {
  const ModelConfig c = preset("tiny-moe");
  const auto shapes = weight_shapes(c);
  std::map<std::string, std::vector<int64_t>> m(shapes.begin(), shapes.end());
  EXPECT_EQ(shapes.front().first, "embed");
  EXPECT_EQ(shapes.back().first, "lm_head");
  EXPECT_EQ(shapes.size(), 1 + 4 * 9 + 2u);
  EXPECT_EQ(m.at("layers.0.qkv"), (std::vector<int64_t>{(4 + 2 * 2) * 16, 64}));
  EXPECT_EQ(m.at("layers.3.o_proj"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(m.at("layers.1.router"), (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(m.at("layers.1.experts_fc1"), (std::vector<int64_t>{8 * 2 * 64, 64}));
  EXPECT_EQ(m.at("layers.1.experts_fc2"), (std::vector<int64_t>{8 * 64, 64}));
  EXPECT_EQ(m.at("layers.2.q_norm"), (std::vector<int64_t>{16}));
  const auto dense = weight_shapes(preset("tiny-dense"));
  std::map<std::string, std::vector<int64_t>> d(dense.begin(), dense.end());
  EXPECT_FALSE(d.contains("lm_head"));  // tied
  EXPECT_EQ(d.at("layers.0.gate_up"), (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(d.at("layers.0.down"), (std::vector<int64_t>{64, 128}));
  const auto mixed = layouts().back().second;
  std::map<std::string, std::vector<int64_t>> x;
  for (auto& [n, s] : weight_shapes(mixed)) x.emplace(n, s);
  EXPECT_TRUE(x.contains("layers.0.gate_up"));  // (0 + 1) % 2 != 0: dense
  EXPECT_TRUE(x.contains("layers.1.experts_fc1"));
  EXPECT_TRUE(x.contains("layers.3.gate_up"));  // listed in mlp_only_layers
  EXPECT_EQ(x.at("layers.1.shared_gate_up"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(x.at("layers.1.shared_down"), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(x.at("layers.1.shared_gate"), (std::vector<int64_t>{1, 64}));
}

// The fused tensors hold the HF tensors in the documented row blocks.
TEST(ModelWeights, FusedRowBlocks) {
  ModelConfig c = preset("tiny-moe");
  c.num_hidden_layers = 1;
  const auto hf = random_hf(c, DType::kF32, test::test_seed());
  const ModelWeights w = weights_from_hf(c, hf, "mem");
  auto rows = [](const Tensor& t, int64_t r0, int64_t n) {
    return bytes_of(t.slice_rows(r0, r0 + n));
  };
  const std::string hp = "model.layers.0.";
  const Tensor& qkv = w.at("layers.0.qkv");
  EXPECT_EQ(rows(qkv, 0, 64), bytes_of(hf.at(hp + "self_attn.q_proj.weight")));
  EXPECT_EQ(rows(qkv, 64, 32), bytes_of(hf.at(hp + "self_attn.k_proj.weight")));
  EXPECT_EQ(rows(qkv, 96, 32), bytes_of(hf.at(hp + "self_attn.v_proj.weight")));
  const Tensor& fc1 = w.at("layers.0.experts_fc1");
  const Tensor& fc2 = w.at("layers.0.experts_fc2");
  for (int e = 0; e < 8; ++e) {
    const std::string ep = hp + "mlp.experts." + std::to_string(e) + ".";
    EXPECT_EQ(rows(fc1, 128 * e, 64), bytes_of(hf.at(ep + "gate_proj.weight"))) << e;
    EXPECT_EQ(rows(fc1, 128 * e + 64, 64), bytes_of(hf.at(ep + "up_proj.weight"))) << e;
    EXPECT_EQ(rows(fc2, 64 * e, 64), bytes_of(hf.at(ep + "down_proj.weight"))) << e;
  }
  EXPECT_EQ(bytes_of(w.at("layers.0.router")), bytes_of(hf.at(hp + "mlp.gate.weight")));
  EXPECT_EQ(bytes_of(w.at("lm_head")), bytes_of(hf.at("lm_head.weight")));
}

TEST(ModelWeights, InMemoryRoundTripIsBitExact) {
  const uint64_t seed = test::test_seed();
  for (const auto& [label, c] : layouts()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const auto hf = random_hf(c, dt, seed);
      const auto back = weights_to_hf(weights_from_hf(c, hf, "mem"), dt);
      ASSERT_EQ(back.size(), hf.size()) << label;
      for (const auto& [name, t] : hf) {
        ASSERT_TRUE(back.contains(name)) << label << " " << name;
        EXPECT_EQ(back.at(name).dtype(), dt);
        EXPECT_EQ(back.at(name).shape(), t.shape()) << name;
        EXPECT_EQ(bytes_of(back.at(name)), bytes_of(t)) << label << " " << name;
      }
    }
  }
}

// HF tensors -> model directory (single file and shards) -> load -> HF tensors, bit for bit.
TEST(ModelWeights, DirectoryRoundTripIsBitExact) {
  const uint64_t seed = test::test_seed();
  for (const auto& [label, c] : layouts()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (size_t shard : {size_t(0), size_t(100000)}) {
        test::ScratchDir dir;
        const std::string context =
            label + (dt == DType::kF32 ? " f32" : " bf16") + (shard ? " sharded" : " single");
        const auto hf = random_hf(c, dt, seed);
        save_model_dir(weights_from_hf(c, hf, "mem"), dir.path().string(), dt, shard);
        EXPECT_EQ(fs::exists(dir.path() / kIndexFile), shard > 0) << context;
        EXPECT_EQ(fs::exists(dir.path() / kSingleWeightsFile), shard == 0) << context;
        const ModelWeights w = load_model_dir(dir.path().string());
        EXPECT_TRUE(w.config == c) << context;
        const auto back = weights_to_hf(w, dt);
        ASSERT_EQ(back.size(), hf.size()) << context;
        for (const auto& [name, t] : hf)
          EXPECT_EQ(bytes_of(back.at(name)), bytes_of(t)) << context << " " << name;
        if (shard) {  // every shard within the limit unless it holds one larger tensor
          const Json index = Json::parse(std::ifstream(dir.path() / kIndexFile));
          std::set<std::string> files;
          for (const auto& [t, f] : index.at("weight_map").items())
            files.insert(f.get<std::string>());
          EXPECT_GT(files.size(), 1u) << context;
          for (const auto& f : files) {
            const auto h = read_safetensors_header((dir.path() / f).string());
            EXPECT_TRUE(h.data_bytes <= shard || h.tensors.size() == 1) << context << " " << f;
            EXPECT_EQ(h.metadata.at("format"), "pt");
          }
        }
      }
    }
  }
}

TEST(ModelWeights, SavedFilesFollowTransformers) {
  test::ScratchDir dir;
  const ModelConfig c = preset("tiny-dense");  // tied
  save_model_dir(init_weights(c, 3), dir.path().string(), DType::kBF16, 0,
                 {{"lockstep.seed", "3"}});
  const auto h = read_safetensors_header(dir.str(kSingleWeightsFile));
  for (const auto& t : h.tensors) {
    EXPECT_NE(t.name, "lm_head.weight") << "a tied model stores no head";
    EXPECT_EQ(t.dtype, DType::kBF16);
  }
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("lockstep.seed"), "3");
  const Json cfg = Json::parse(std::ifstream(dir.path() / kConfigFile));
  EXPECT_EQ(cfg.at("torch_dtype"), "bfloat16");
  EXPECT_TRUE(config_from_json(cfg, "saved") == c);
}

// Re-saving in the other layout removes the first layout's files, so the directory stays
// unambiguous.
TEST(ModelWeights, ResaveSwitchesLayoutCleanly) {
  test::ScratchDir dir;
  const ModelWeights w = init_weights(preset("tiny-moe"), 1);
  const std::string d = dir.path().string();
  save_model_dir(w, d, DType::kF32, 100000);
  ASSERT_TRUE(fs::exists(dir.path() / kIndexFile));
  save_model_dir(w, d, DType::kF32, 0);
  EXPECT_FALSE(fs::exists(dir.path() / kIndexFile));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2u) << "config.json and model.safetensors only";
  save_model_dir(w, d, DType::kF32, 100000);
  EXPECT_FALSE(fs::exists(dir.path() / kSingleWeightsFile));
  EXPECT_NO_THROW(load_model_dir(d));
}

TEST(ModelWeights, InitIsDeterministicPerSeed) {
  const ModelConfig c = preset("tiny-moe");
  const ModelWeights a = init_weights(c, 42), b = init_weights(c, 42), other = init_weights(c, 43);
  ASSERT_EQ(a.tensors.size(), weight_shapes(c).size());
  for (const auto& [name, t] : a.tensors) {
    EXPECT_EQ(bytes_of(t), bytes_of(b.at(name))) << name;
    if (t.dim() == 2) {
      EXPECT_NE(bytes_of(t), bytes_of(other.at(name))) << name;
    }
  }
  for (const char* norm : {"layers.0.input_norm", "layers.2.q_norm", "final_norm"})
    for (float v : test::floats(a.at(norm))) ASSERT_EQ(v, 1.0f) << norm;
  // Pinned values: the first elements of the embedding for seed 42 (Philox stream 0).
  const auto emb = test::floats(a.at("embed"));
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(emb[size_t(k)], float(num::philox_normal_f64(42, 0, uint64_t(k)) * kInitStd));
  // Distinct tensors draw distinct streams.
  EXPECT_NE(test::floats(a.at("layers.0.qkv"))[0], test::floats(a.at("layers.1.qkv"))[0]);
}

// The statistics of init: mean 0 and standard deviation 0.02 within 6 standard errors over the
// 32768 + elements of the MoE experts.
TEST(ModelWeights, InitStatistics) {
  const ModelWeights w = init_weights(preset("tiny-moe"), test::test_seed());
  const auto v = test::floats(w.at("layers.0.experts_fc1"));
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += double(x) * x;
  }
  const double n = double(v.size()), mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_LT(std::abs(mean), 6 * 0.02 / std::sqrt(n));
  EXPECT_LT(std::abs(sd - 0.02), 6 * 0.02 / std::sqrt(2 * n));
}

// The portable log and sin/cos agree with the C library to a few float64 ulps, at the edges of
// their ranges and at random points; the normals are finite and bounded by sqrt(64 ln 2).
TEST(ModelWeights, PortableBoxMullerMatchesLibm) {
  std::mt19937_64 rng(test::test_seed());
  auto close = [](double a, double b, double tol) { return std::abs(a - b) <= tol; };
  for (double u : {1.0, 0.5, 0.70710678118654752, 2.3283064365386963e-10, 0.999999999}) {
    EXPECT_TRUE(
        close(num::ln_unit_f64(u), std::log(u), 4e-16 * std::max(1.0, std::abs(std::log(u)))))
        << u;
  }
  for (int i = 0; i < 20000; ++i) {
    const uint32_t w1 = uint32_t(rng()), w2 = uint32_t(rng());
    const double u1 = (double(w1) + 1.0) / 4294967296.0, t = double(w2) / 4294967296.0;
    const double l = num::ln_unit_f64(u1);
    ASSERT_TRUE(close(l, std::log(u1), 4e-16 * std::max(1.0, std::abs(l)))) << u1;
    double c, s;
    num::cos_sin_2pi_f64(t, c, s);
    const double a = 2.0 * 3.14159265358979323846 * t;
    ASSERT_TRUE(close(c, std::cos(a), 2e-15) && close(s, std::sin(a), 2e-15)) << t;
    double z0, z1;
    num::box_muller_f64(w1, w2, z0, z1);
    ASSERT_TRUE(std::isfinite(z0) && std::abs(z0) <= 6.67 && std::abs(z1) <= 6.67);
  }
  double c, s;
  num::cos_sin_2pi_f64(0.25, c, s);
  EXPECT_EQ(s, 1.0);
  EXPECT_LE(std::abs(c), 1e-16);
}

class WeightErrors : public ::testing::Test {
 protected:
  ModelConfig c = [] {
    ModelConfig m = preset("tiny-moe");
    m.num_hidden_layers = 2;
    return m;
  }();
  std::map<std::string, Tensor> hf = random_hf(c, DType::kBF16, 7);
};

TEST_F(WeightErrors, MissingTensor) {
  hf.erase("model.layers.1.mlp.experts.5.up_proj.weight");
  expect_throw_naming<WeightsError>(
      [&] { weights_from_hf(c, hf, "d/model.safetensors"); },
      {"d/model.safetensors", "missing", "model.layers.1.mlp.experts.5.up_proj.weight", "[64, 64]",
       "layers.1.experts_fc1"});
}

TEST_F(WeightErrors, ExtraTensor) {
  hf.emplace("model.layers.0.mlp.experts.8.up_proj.weight", Tensor(DType::kF32, {64, 64}));
  expect_throw_naming<WeightsError>([&] { weights_from_hf(c, hf, "d"); },
                                    {"unexpected", "model.layers.0.mlp.experts.8.up_proj.weight"});
}

TEST_F(WeightErrors, WrongShape) {
  hf["model.layers.0.self_attn.k_proj.weight"] = Tensor(DType::kBF16, {16, 64});
  expect_throw_naming<WeightsError>(
      [&] { weights_from_hf(c, hf, "d"); },
      {"model.layers.0.self_attn.k_proj.weight", "[16, 64]", "[32, 64]"});
}

TEST_F(WeightErrors, WrongDtype) {
  hf["model.norm.weight"] = Tensor(DType::kI32, {64});
  expect_throw_naming<WeightsError>([&] { weights_from_hf(c, hf, "d"); },
                                    {"model.norm.weight", "I32"});
}

TEST_F(WeightErrors, TiedHeadMustEqualTheEmbedding) {
  c.tie_word_embeddings = true;
  hf.emplace("model.rotary_emb.inv_freq", Tensor(DType::kF32, {8}));  // a buffer, accepted
  EXPECT_THROW(weights_from_hf(c, hf, "d"), WeightsError);            // lm_head.weight differs
  hf["lm_head.weight"] = hf.at("model.embed_tokens.weight").clone();
  EXPECT_NO_THROW(weights_from_hf(c, hf, "d"));
  hf.erase("lm_head.weight");
  EXPECT_NO_THROW(weights_from_hf(c, hf, "d"));
}

TEST_F(WeightErrors, ToHfChecksTheWeights) {
  ModelWeights w = weights_from_hf(c, hf, "d");
  w.tensors["layers.0.q_norm"] = Tensor(DType::kF32, {8});
  expect_throw_naming<WeightsError>([&] { weights_to_hf(w, DType::kF32); },
                                    {"layers.0.q_norm", "[16]"});
  w = weights_from_hf(c, hf, "d");
  w.tensors.erase("final_norm");
  expect_throw_naming<WeightsError>([&] { weights_to_hf(w, DType::kF32); }, {"final_norm"});
  w = weights_from_hf(c, hf, "d");
  w.tensors.emplace("bonus", Tensor(DType::kF32, {1}));
  expect_throw_naming<WeightsError>([&] { weights_to_hf(w, DType::kF32); }, {"bonus"});
}

// Broken sharded directories: each gives an error naming the index, the shard and the tensor.
class BrokenIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    save_model_dir(init_weights(c, 5), dir.path().string(), DType::kF32, 400000);
    index = Json::parse(std::ifstream(dir.path() / kIndexFile));
    for (const auto& [t, f] : index.at("weight_map").items()) shards.insert(f.get<std::string>());
    ASSERT_GE(shards.size(), 3u);
  }
  void write_index() const { std::ofstream(dir.path() / kIndexFile) << index.dump(2); }
  void expect_error(const std::vector<std::string>& parts) const {
    std::vector<std::string> all = parts;
    all.push_back(kIndexFile);
    expect_throw_naming<WeightsError>([&] { load_model_dir(dir.path().string()); }, all);
  }
  test::ScratchDir dir;
  ModelConfig c = preset("tiny-moe");
  Json index;
  std::set<std::string> shards;
};

TEST_F(BrokenIndex, MissingShard) {
  const std::string victim = *shards.begin();
  fs::remove(dir.path() / victim);
  expect_error({victim, "does not exist"});
}

TEST_F(BrokenIndex, TensorInTwoShards) {
  const std::string a = *shards.begin(), b = *std::next(shards.begin());
  SafetensorsFile fa = read_safetensors((dir.path() / a).string());
  SafetensorsFile fb = read_safetensors((dir.path() / b).string());
  fb.tensors.push_back(fa.tensors.front());
  write_safetensors((dir.path() / b).string(), fb);
  expect_error({fa.tensors.front().name, "two shards", a, b});
}

TEST_F(BrokenIndex, TensorMissingFromItsShard) {
  // The index points the final norm at a shard that does not hold it.
  const std::string holder = index["weight_map"]["model.norm.weight"];
  std::string other;
  for (const auto& s : shards)
    if (s != holder) other = s;
  index["weight_map"]["model.norm.weight"] = other;
  write_index();
  expect_error({"model.norm.weight", other, holder});
}

TEST_F(BrokenIndex, TensorListedButNowhere) {
  index["weight_map"]["model.layers.0.self_attn.extra.weight"] = *shards.begin();
  write_index();
  expect_error({"model.layers.0.self_attn.extra.weight", "does not hold it"});
}

TEST_F(BrokenIndex, TensorNotListed) {
  index["weight_map"].erase("model.norm.weight");
  write_index();
  expect_error({"model.norm.weight", "does not list"});
}

TEST_F(BrokenIndex, ShardNameOutsideTheDirectory) {
  index["weight_map"]["model.norm.weight"] = "../model.safetensors";
  write_index();
  expect_error({"model.norm.weight", "plain"});
}

TEST_F(BrokenIndex, MalformedIndex) {
  std::ofstream(dir.path() / kIndexFile) << "{\"weight_map\": [1, 2]}";
  expect_error({"weight_map"});
  std::ofstream(dir.path() / kIndexFile) << "{\"weight_map\": {\"a\": 3}}";
  expect_error({"'a'", "file name"});
  std::ofstream(dir.path() / kIndexFile) << "{\"weight_map\": ";
  expect_error({"not valid JSON"});
}

TEST_F(BrokenIndex, IndexTogetherWithSingleFileIsAmbiguous) {
  save_model_dir(init_weights(c, 5), (dir.path() / "other").string());
  fs::copy_file(dir.path() / "other" / kSingleWeightsFile, dir.path() / kSingleWeightsFile);
  expect_throw_naming<WeightsError>([&] { load_model_dir(dir.path().string()); },
                                    {"both", kSingleWeightsFile, kIndexFile});
}

TEST(ModelDir, MissingPieces) {
  test::ScratchDir dir;
  expect_throw_naming<WeightsError>([&] { load_model_dir(dir.str("nope")); }, {"nope"});
  expect_throw_naming<ConfigError>([&] { load_model_dir(dir.path().string()); }, {"config.json"});
  save_model_dir(init_weights(preset("tiny-dense"), 1), dir.path().string());
  fs::remove(dir.path() / kSingleWeightsFile);
  expect_throw_naming<WeightsError>([&] { load_model_dir(dir.path().string()); },
                                    {kSingleWeightsFile, kIndexFile});
  // A config that disagrees with the stored shapes names the tensor and the file.
  save_model_dir(init_weights(preset("tiny-dense"), 1), dir.path().string());
  Json cfg = Json::parse(std::ifstream(dir.path() / kConfigFile));
  cfg["intermediate_size"] = 96;
  std::ofstream(dir.path() / kConfigFile) << cfg.dump();
  expect_throw_naming<WeightsError>(
      [&] { load_model_dir(dir.path().string()); },
      {"model.layers.0.mlp.gate_proj.weight", "[128, 64]", "[96, 64]", kSingleWeightsFile});
}

}  // namespace
}  // namespace lockstep::model
