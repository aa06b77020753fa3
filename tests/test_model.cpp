// The decoder, learner, converter and sampler on tiny dense and MoE configs: float64 gradient check
// of the whole model, learner log-probs equal to the sampler's in deterministic mode (alone and in
// batches of mixed lengths, for the recipes that promise it), batch and thread-count invariance,
// sampler seeds, policy refusal, checkpoint continuation, and bad input.
#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>

#include "lockstep/model/learner.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/sampler.h"
#include "lockstep/tensor/graph.h"
#include "test_util.h"
#include "tiny_model_util.h"

using namespace lockstep;
using namespace lockstep::model;
using namespace lockstep::test;

namespace {

struct Batch {
  std::vector<int32_t> ids, targets;
  std::vector<int64_t> cu{0};
};

// Sequences of the given lengths; targets are the next token (the last one wraps to the first).
Batch make_batch(const std::vector<int64_t>& lens, int64_t vocab, uint32_t stream) {
  Batch b;
  for (size_t s = 0; s < lens.size(); ++s) {
    const std::vector<int32_t> seq =
        random_ids(lens[s] + 1, vocab, test_seed(), stream + uint32_t(s));
    b.ids.insert(b.ids.end(), seq.begin(), seq.end() - 1);
    b.targets.insert(b.targets.end(), seq.begin() + 1, seq.end());
    b.cu.push_back(b.cu.back() + lens[s]);
  }
  return b;
}

std::vector<float> f32s(const Tensor& t) { return floats(t); }

void expect_same_model_bits(const std::vector<float>& a, const std::vector<float>& b,
                            const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(num::f32_bits(a[i]), num::f32_bits(b[i]))
        << what << " element " << i << ": " << a[i] << " vs " << b[i] << " (seed " << test_seed()
        << ")";
}

const Recipe& recipe(const char* name) { return builtin_recipe_or_throw(name, "test").recipe; }

}  // namespace

TEST(ModelGradcheck, WholeModelFloat64DenseAndMoe) {
  // Tolerance as in test_nn_gradcheck.cpp: |fd - analytic| <= 1e-6 (1 + |analytic|), eps = 1e-6.
  for (bool moe : {false, true}) {
    TinyOptions o;
    o.moe = moe;
    o.shared_expert = moe;
    o.tied = moe;
    const ModelConfig c = tiny_config(o);
    LearnerConfig lc;
    lc.dtype = DType::kF64;
    lc.code_overrides = f32_overrides();
    lc.temperature = 0.8;
    Learner l(tiny_weights(c, test_seed(), 0.4f), f32_recipe(), lc);
    const Batch b = make_batch({5, 3}, c.vocab_size, 40);
    const Tensor ids = ids_tensor(b.ids), tg = ids_tensor(b.targets);
    const int64_t n = int64_t(b.ids.size());
    Tensor wl(DType::kF64, {n}), we(DType::kF64, {n});
    for (int64_t i = 0; i < n; ++i) {
      wl.ptr<double>()[i] = 1.0 + 0.1 * double(i);
      we.ptr<double>()[i] = 0.5 - 0.05 * double(i);
    }
    auto loss = [&] {
      const LearnerOutput out = l.forward(ids, b.cu, tg);
      double s = 0;
      for (int64_t i = 0; i < n; ++i)
        s += wl.ptr<double>()[i] * out.logp.ptr<double>()[i] +
             we.ptr<double>()[i] * out.entropy.ptr<double>()[i];
      return s;
    };
    loss();
    l.backward(wl, we);
    const std::map<std::string, Tensor> grads = [&] {
      std::map<std::string, Tensor> g;
      for (const auto& [k, t] : l.grads()) g[k] = t.clone();
      return g;
    }();
    l.zero_grad();
    // Probe a few elements of every tensor through the masters (the decoder reads them in place).
    for (const auto& [name, param] : l.weights().tensors) {
      Tensor p = param;
      const Tensor& an = grads.at(name);
      const int64_t step = std::max<int64_t>(1, p.numel() / 6);
      for (int64_t i = int64_t(test_seed() % uint64_t(step)); i < p.numel(); i += step) {
        double* v = p.ptr<double>() + i;
        const double keep = *v;
        // The decoder's weight operands are views of the masters for f32 specs, or padded copies
        // (K to kLinearKMultiple): rebuilt after every change.
        *v = keep + 1e-6;
        l.weights_changed();
        const double lp = loss();
        *v = keep - 1e-6;
        l.weights_changed();
        const double lm = loss();
        *v = keep;
        l.weights_changed();
        const double fd = (lp - lm) / 2e-6, a = an.ptr<double>()[i];
        ASSERT_NEAR(fd, a, 1e-6 * (1 + std::fabs(a)))
            << (moe ? "moe " : "dense ") << name << "[" << i << "] seed " << test_seed();
      }
    }
  }
}

// Learner log-probs of sampled sequences == the sampler's, bit for bit, in deterministic mode.
TEST(ModelDeterministic, LearnerEqualsSamplerAloneAndInMixedBatches) {
  for (bool moe : {false, true}) {
    TinyOptions o;
    o.moe = moe;
    const ModelConfig c = tiny_config(o);
    const ModelWeights w = tiny_weights(c, test_seed() + 1);
    for (const char* rn :
         {"bf16", "fp8_block", "mxfp8", "nvfp4_per_token", "nvfp4_per_token_bf16_bwd"}) {
      const std::string what = std::string(moe ? "moe " : "dense ") + rn;
      Learner learner(w, recipe(rn), {});
      Sampler sampler({.temperature = 0.9, .max_new = 6, .seed = test_seed(), .max_batch = 3});
      sampler.load_policy(export_policy(learner.weights(), learner.recipe(), 0), 0, rn);
      std::vector<SampleRequest> reqs;
      for (uint32_t i = 0; i < 5; ++i)
        reqs.push_back({random_ids(1 + 3 * i, c.vocab_size, test_seed(), 100 + i), i});
      const std::vector<SampleResult> res = sampler.generate(reqs);
      LearnerConfig lc;
      lc.temperature = 0.9;
      Learner scorer(w, recipe(rn), lc);
      // All sequences packed in one batch, then each alone.
      Batch all;
      std::vector<std::pair<int64_t, int64_t>> gen_pos;  // [start, count) of generated targets
      for (size_t i = 0; i < reqs.size(); ++i) {
        std::vector<int32_t> seq = reqs[i].prompt;
        seq.insert(seq.end(), res[i].tokens.begin(), res[i].tokens.end());
        gen_pos.push_back({int64_t(all.ids.size()) + int64_t(reqs[i].prompt.size()) - 1,
                           int64_t(res[i].tokens.size())});
        all.ids.insert(all.ids.end(), seq.begin(), seq.end() - 1);
        all.targets.insert(all.targets.end(), seq.begin() + 1, seq.end());
        all.cu.push_back(int64_t(all.ids.size()));
      }
      const std::vector<float> packed =
          f32s(scorer.forward(ids_tensor(all.ids), all.cu, ids_tensor(all.targets)).logp);
      for (size_t i = 0; i < reqs.size(); ++i) {
        const auto [g0, gn] = gen_pos[i];
        const std::vector<float> got(packed.begin() + g0, packed.begin() + g0 + gn);
        expect_same_model_bits(got, res[i].logprobs, what + " batched seq " + std::to_string(i));
        const int64_t s0 = all.cu[i], s1 = all.cu[i + 1];
        const std::vector<int32_t> ids(all.ids.begin() + s0, all.ids.begin() + s1),
            tg(all.targets.begin() + s0, all.targets.begin() + s1);
        const std::vector<int64_t> cu{0, s1 - s0};
        const std::vector<float> alone =
            f32s(scorer.forward(ids_tensor(ids), cu, ids_tensor(tg)).logp);
        expect_same_model_bits(alone, std::vector<float>(packed.begin() + s0, packed.begin() + s1),
                               what + " alone vs batch " + std::to_string(i));
      }
    }
  }
}

TEST(ModelDeterministic, SameBitsWhateverTheThreadCount) {
  TinyOptions o;
  o.moe = true;
  const ModelConfig c = tiny_config(o);
  const ModelWeights w = tiny_weights(c, test_seed() + 2);
  const Batch b = make_batch({9, 4, 13}, c.vocab_size, 60);
  std::vector<std::vector<float>> runs;
  const int threads = omp_get_max_threads();
  for (int nt : {1, 2, 3}) {
    omp_set_num_threads(nt);
    for (const char* rn : {"mxfp8", "nvfp4_per_token"}) {
      Learner l(w, recipe(rn), {});
      const LearnerOutput out = l.forward(ids_tensor(b.ids), b.cu, ids_tensor(b.targets));
      std::vector<float> v = f32s(out.logp);
      Tensor ones(DType::kF32, {int64_t(b.ids.size())});
      for (int64_t i = 0; i < ones.numel(); ++i) ones.ptr<float>()[i] = 1.0f;
      l.backward(ones, ones);
      for (const auto& [name, g] : l.grads()) {
        const std::vector<float> gv = f32s(g);
        v.insert(v.end(), gv.begin(), gv.end());
      }
      l.step();
      const std::vector<float> after = f32s(l.logits(ids_tensor(b.ids), b.cu));
      v.insert(v.end(), after.begin(), after.end());
      runs.push_back(v);
    }
  }
  omp_set_num_threads(threads);
  for (size_t i = 2; i < runs.size(); ++i)
    expect_same_model_bits(runs[i], runs[i % 2], "thread count run " + std::to_string(i));
}

TEST(ModelSampler, SameSeedSameTokensWhateverTheBatch) {
  TinyOptions o;
  o.moe = true;
  const ModelConfig c = tiny_config(o);
  const ModelWeights w = tiny_weights(c, test_seed() + 3);
  for (const char* rn : {"bf16", "nvfp4_per_token"}) {
    std::vector<SampleRequest> reqs;
    for (uint32_t i = 0; i < 6; ++i)
      reqs.push_back({random_ids(2 + i, c.vocab_size, test_seed(), 200 + i), i});
    SamplerConfig sc{.temperature = 1.3,
                     .top_p = 0.95,
                     .top_k = 12,
                     .max_new = 8,
                     .seed = test_seed(),
                     .max_batch = 6};
    Sampler s(sc);
    s.load_policy(export_policy(w, recipe(rn), 3), 3, rn);
    const std::vector<SampleResult> all = s.generate(reqs);
    // Each request alone, and with other batch sizes (continuous batching re-mixes the rows).
    for (int64_t mb : {1, 4}) {
      sc.max_batch = mb;
      s.set_config(sc);
      const std::vector<SampleResult> again = s.generate(reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(again[i].tokens, all[i].tokens) << rn << " request " << i << " max_batch " << mb;
        expect_same_model_bits(again[i].logprobs, all[i].logprobs, std::string(rn) + " logprobs");
      }
    }
    const std::vector<SampleResult> one = s.generate(std::span(reqs).subspan(3, 1));
    EXPECT_EQ(one[0].tokens, all[3].tokens) << rn;
    sc.seed = test_seed() + 1;
    s.set_config(sc);
    const std::vector<SampleResult> other = s.generate(reqs);
    bool differs = false;
    for (size_t i = 0; i < reqs.size(); ++i) differs = differs || other[i].tokens != all[i].tokens;
    EXPECT_TRUE(differs) << rn << ": another seed gave the same tokens for all 6 requests";
  }
}

// Device graphs are a CUDA device's: a CPU sampler runs every step call by call and says so in
// its statistics, and a graph asked for on the CPU is refused with the device named.
TEST(ModelSampler, CpuStepsRunCallByCall) {
  const ModelConfig c = tiny_config(TinyOptions{});
  const ModelWeights w = tiny_weights(c, test_seed() + 5);
  Sampler s(SamplerConfig{.max_new = 5, .max_batch = 2});
  s.load_policy(export_policy(w, recipe("bf16"), 0), 0, "bf16");
  std::vector<SampleRequest> reqs{{random_ids(3, c.vocab_size, test_seed(), 1), 0},
                                  {random_ids(4, c.vocab_size, test_seed(), 2), 1}};
  s.generate(reqs);
  EXPECT_EQ(s.stats().graph_captures, 0);
  EXPECT_EQ(s.stats().graph_replays, 0);
  EXPECT_FALSE(device_graphs_available(Device::cpu()));
  EXPECT_FALSE(stream_capturing(Stream{}));
  DeviceGraph g;
  try {
    g.capture(Device::cpu(), Stream{}, [] {});
    ADD_FAILURE() << "a graph on the CPU was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(g.defined());
}

// A sampler keeps its rope table across versions of one config (DecoderWeights::rope): tokens and
// log-probs equal a fresh sampler's after versions of other recipes and
// of other weights; a decoder handed another config's table refuses it by name.
TEST(ModelSampler, NewVersionsKeepTheRopeTableAndTheBits) {
  TinyOptions o;
  o.moe = true;
  const ModelConfig c = tiny_config(o);
  const ModelWeights w0 = tiny_weights(c, test_seed() + 11), w1 = tiny_weights(c, test_seed() + 12);
  std::vector<SampleRequest> reqs;
  for (uint32_t i = 0; i < 3; ++i)
    reqs.push_back({random_ids(3 + i, c.vocab_size, test_seed(), 300 + i), i});
  const SamplerConfig sc{.max_new = 6, .seed = test_seed(), .max_batch = 3};
  Sampler kept(sc);
  int64_t v = 0;
  for (const ModelWeights* w : {&w0, &w1})
    for (const char* rn : {"bf16", "nvfp4_per_token", "mxfp8"}) {
      const PolicyVersion p = export_policy(*w, recipe(rn), v);
      kept.load_policy(p, v, rn);
      Sampler fresh(sc);
      fresh.load_policy(p, v, rn);
      const std::vector<SampleResult> a = kept.generate(reqs), b = fresh.generate(reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(a[i].tokens, b[i].tokens) << rn << " version " << v << " request " << i;
        expect_same_model_bits(a[i].logprobs, b[i].logprobs, std::string(rn) + " logprobs");
      }
      ++v;
    }
  ModelConfig c2 = c;
  c2.max_position_embeddings = c.max_position_embeddings * 2;
  const PolicyVersion p2 = export_policy(tiny_weights(c2, test_seed() + 13), recipe("bf16"), 0);
  DecoderWeights dw = decoder_weights(p2, Device::cpu());
  dw.rope =
      Decoder(decoder_weights(export_policy(w0, recipe("bf16"), 0), Device::cpu())).rope_table();
  try {
    Decoder d(std::move(dw));
    ADD_FAILURE() << "a rope table of another config was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rope table"), std::string::npos) << e.what();
  }
}

TEST(ModelPolicy, RefusesWrongVersionRecipeOrChecksum) {
  const ModelConfig c = tiny_config();
  const ModelWeights w = tiny_weights(c, test_seed() + 4);
  Sampler s;
  PolicyVersion p = export_policy(w, recipe("nvfp4_per_token"), 7);
  EXPECT_THROW(s.load_policy(p, 6, "nvfp4_per_token"), PolicyError);
  EXPECT_THROW(s.load_policy(p, 7, "mxfp8"), PolicyError);
  PolicyVersion bad = p;
  bad.dense.at("final_norm") = bad.dense.at("final_norm").clone();
  bad.dense.at("final_norm").ptr<float>()[0] += 1.0f;
  EXPECT_THROW(s.load_policy(bad, 7, "nvfp4_per_token"), PolicyError);
  EXPECT_NO_THROW(s.load_policy(p, 7, "nvfp4_per_token"));
  EXPECT_EQ(s.version(), 7);
  // The quantized export carries the learner's bytes; the checksum is stable across exports.
  EXPECT_EQ(export_policy(w, recipe("nvfp4_per_token"), 7).checksum, p.checksum);
  EXPECT_LT(p.nbytes(),
            export_policy(w, recipe("nvfp4_per_token"), 7, {.force_bf16 = true}).nbytes() + 1);
}

TEST(ModelLearner, CheckpointContinuesBitIdentically) {
  TinyOptions o;
  o.moe = true;
  const ModelConfig c = tiny_config(o);
  const Batch b = make_batch({7, 5}, c.vocab_size, 80);
  const Tensor ids = ids_tensor(b.ids), tg = ids_tensor(b.targets);
  Tensor adv(DType::kF32, {int64_t(b.ids.size())});
  for (int64_t i = 0; i < adv.numel(); ++i) adv.ptr<float>()[i] = i % 2 ? 1.0f : -0.5f;
  LearnerConfig lc;
  lc.adamw.lr = 1e-2;
  lc.max_grad_norm = 0.5;
  auto train = [&](Learner& l, int steps) {
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) {
      const LearnerOutput out = l.forward(ids, b.cu, tg);
      losses.push_back(f32s(out.logp)[0]);
      l.backward(adv, Tensor());
      l.step();
    }
    return losses;
  };
  Learner straight(tiny_weights(c, test_seed() + 5), recipe("nvfp4_per_token"), lc);
  const std::vector<float> l4 = train(straight, 4);
  Learner first(tiny_weights(c, test_seed() + 5), recipe("nvfp4_per_token"), lc);
  train(first, 2);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("lockstep_ckpt_" + std::to_string(test_seed())))
          .string();
  first.save_checkpoint(dir);
  std::unique_ptr<Learner> resumed = Learner::load_checkpoint(dir);
  EXPECT_EQ(resumed->version(), 2);
  const std::vector<float> l2 = train(*resumed, 2);
  std::filesystem::remove_all(dir);
  expect_same_model_bits(l2, std::vector<float>(l4.begin() + 2, l4.end()), "losses after reload");
  for (const auto& [name, t] : straight.weights().tensors)
    expect_same_model_bits(f32s(t), f32s(resumed->weights().tensors.at(name)), "weights " + name);
}

TEST(ModelErrors, BadInputIsRefusedWithAMessage) {
  const ModelConfig c = tiny_config();
  Learner l(tiny_weights(c, 1), recipe("bf16"), {});
  const std::vector<int64_t> cu{0, 3};
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([&] {
              l.logits(ids_tensor({1, 2, int32_t(c.vocab_size)}), cu);
            }).find("out of range"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              l.forward(ids_tensor({1, 2, 3}), cu, ids_tensor({0, -1, 2}));
            }).find("target -1"),
            std::string::npos);
  std::vector<int32_t> longseq(size_t(c.max_position_embeddings + 1), 1);
  const std::vector<int64_t> cul{0, int64_t(longseq.size())};
  EXPECT_NE(msg([&] { l.logits(ids_tensor(longseq), cul); }).find("context"), std::string::npos);
  Sampler s;
  s.load_policy(export_policy(l.weights(), l.recipe(), 0), 0, "");
  const std::vector<SampleRequest> empty{{{}, 0}};
  EXPECT_NE(msg([&] { s.generate(empty); }).find("empty"), std::string::npos);
}

TEST(ModelLearner, StepAmaxPerConverterDomainExportsTheSameBytesAsReadingTheWeights) {
  // nvfp4_per_tensor on every linear layer scales each expert's weight apart (per_group) and each
  // other weight as one tensor: the learner's AdamW step computes those amax values as it writes
  // the masters, and the export that takes them equals the export that reads the masters.
  TinyOptions o;
  o.moe = true;
  const ModelConfig c = tiny_config(o);
  Recipe sampler_recipe = recipe("nvfp4_per_tensor");
  sampler_recipe.name = "test_nvfp4_per_tensor_all_linear";
  sampler_recipe.coverage.scope = CoverageScope::kAllLinear;
  sampler_recipe.coverage.last_fraction_bf16 = 0.0;
  const std::map<std::string, int64_t> counts = weight_amax_domain_counts(c, sampler_recipe);
  ASSERT_FALSE(counts.empty());
  bool per_expert = false;
  for (const auto& [name, d] : counts) per_expert = per_expert || d == c.num_experts;
  EXPECT_TRUE(per_expert) << "no expert weight with one domain per expert";
  EXPECT_TRUE(weight_amax_domain_counts(c, recipe("nvfp4_per_token")).empty());  // per_row
  EXPECT_TRUE(weight_amax_domain_counts(c, recipe("bf16")).empty());

  const Batch b = make_batch({7, 5}, c.vocab_size, 90);
  LearnerConfig lc;
  lc.adamw.lr = 1e-2;
  Learner l(tiny_weights(c, test_seed() + 31), recipe("bf16"), lc);
  l.set_weight_amax_domains(counts);
  EXPECT_TRUE(l.weight_amax().empty());
  Tensor ones(DType::kF32, {int64_t(b.ids.size())});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.ptr<float>()[i] = 1.0f;
  for (int s = 0; s < 2; ++s) {
    l.forward(ids_tensor(b.ids), b.cu, ids_tensor(b.targets));
    l.backward(ones, Tensor());
    l.step();
  }
  const WeightAmax amax = usable_weight_amax(l.weight_amax(), c, sampler_recipe);
  ASSERT_EQ(amax.size(), counts.size());
  for (const auto& [name, d] : counts) EXPECT_EQ(amax.at(name).numel(), d) << name;
  const PolicyVersion read = export_policy(l.weights(), sampler_recipe, 2);
  const PolicyVersion given = export_policy(l.weights(), sampler_recipe, 2, {}, &amax);
  EXPECT_EQ(given.checksum, read.checksum);
  // A wrong value is used, not re-read: the same check can fail.
  WeightAmax wrong = amax;
  Tensor twice = wrong.begin()->second.clone();
  for (int64_t i = 0; i < twice.numel(); ++i) twice.ptr<float>()[i] *= 2.0f;
  wrong.begin()->second = twice;
  EXPECT_NE(export_policy(l.weights(), sampler_recipe, 2, {}, &wrong).checksum, read.checksum);
  // An amax for another domain count is not usable under this recipe.
  EXPECT_TRUE(
      usable_weight_amax(l.weight_amax(), c, recipe("nvfp4_per_token_w_per_tensor")).size() <=
      amax.size());
  // Masters changed outside step(): no amax until the next step.
  l.weights_changed();
  EXPECT_TRUE(l.weight_amax().empty());
  EXPECT_THROW(l.set_weight_amax_domains({{"no_such_weight", 1}}), std::invalid_argument);
  EXPECT_THROW(l.set_weight_amax_domains({{counts.begin()->first, 0}}), std::invalid_argument);
}
