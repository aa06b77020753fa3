// Golden test: a tiny MoE model (fixed Philox weights, recipe nvfp4_per_token, deterministic mode)
// must reproduce stored logits, gradients after one backward, and the losses of the first AdamW
// steps bit for bit. The reference lives in tests/data/model_golden.safetensors; regenerate it
// (after a deliberate numeric change, and say why in the commit) with
//   LOCKSTEP_WRITE_GOLDEN=1 build/tests/lockstep_tests --gtest_filter='ModelGolden.*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "lockstep/model/learner.h"
#include "lockstep/tensor/safetensors.h"
#include "test_util.h"
#include "tiny_model_util.h"

using namespace lockstep;
using namespace lockstep::model;
using namespace lockstep::test;

namespace {

constexpr uint64_t kGoldenSeed = 20261201;
const char* kGoldenFile = LOCKSTEP_SOURCE_DIR "/tests/data/model_golden.safetensors";

// logits, then "grad.NAME" for every parameter, then "losses" of 3 steps.
SafetensorsFile compute_golden() {
  TinyOptions o;
  o.moe = true;
  o.shared_expert = true;
  const ModelConfig c = tiny_config(o);
  LearnerConfig lc;
  lc.adamw.lr = 3e-3;
  lc.adamw.weight_decay = 0.01;
  lc.max_grad_norm = 1.0;
  Learner l(tiny_weights(c, kGoldenSeed),
            builtin_recipe_or_throw("nvfp4_per_token", "golden").recipe, lc);
  const std::vector<int32_t> seq = random_ids(21, c.vocab_size, kGoldenSeed, 7);
  const std::vector<int32_t> ids(seq.begin(), seq.end() - 1), tg(seq.begin() + 1, seq.end());
  const std::vector<int64_t> cu{0, 8, 13, 20};
  SafetensorsFile f;
  f.tensors.push_back({"logits", l.logits(ids_tensor(ids), cu)});
  std::vector<float> losses;
  for (int step = 0; step < 3; ++step) {
    const LearnerOutput out = l.forward(ids_tensor(ids), cu, ids_tensor(tg));
    const std::vector<float> lp = floats(out.logp);
    float loss = 0.0f;
    for (float v : lp) loss -= v;
    losses.push_back(loss);
    Tensor d(DType::kF32, {int64_t(ids.size())});
    for (int64_t i = 0; i < d.numel(); ++i) d.ptr<float>()[i] = -1.0f;
    l.backward(d, Tensor());
    if (step == 0)
      for (const auto& [name, g] : l.grads()) f.tensors.push_back({"grad." + name, g.clone()});
    l.step();
  }
  f.tensors.push_back({"losses", Tensor::from_vector<float>(losses, {3}, DType::kF32)});
  return f;
}

}  // namespace

TEST(ModelGolden, LogitsGradientsAndFirstLossesMatchTheStoredReference) {
  const SafetensorsFile now = compute_golden();
  if (std::getenv("LOCKSTEP_WRITE_GOLDEN")) {
    std::filesystem::create_directories(std::filesystem::path(kGoldenFile).parent_path());
    write_safetensors(kGoldenFile, now);
    GTEST_SKIP() << "wrote " << kGoldenFile;
  }
  const SafetensorsFile ref = read_safetensors(kGoldenFile);
  ASSERT_EQ(ref.tensors.size(), now.tensors.size());
  for (const NamedTensor& t : now.tensors) {
    const Tensor* r = ref.find(t.name);
    ASSERT_NE(r, nullptr) << t.name << " missing from " << kGoldenFile;
    const std::vector<float> a = floats(t.tensor), b = floats(*r);
    ASSERT_EQ(a.size(), b.size()) << t.name;
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(num::f32_bits(a[i]), num::f32_bits(b[i]))
          << t.name << " element " << i << ": " << a[i] << " vs stored " << b[i];
  }
}
