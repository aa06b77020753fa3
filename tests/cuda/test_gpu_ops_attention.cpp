// lockstep_test_gpu --op attention / attention_prefill / attention_backward: the packed attention
// entries on CUDA against the CPU. kRowwise (attention_row on both) bit for bit (NaN == NaN) on
// normal, edge (NaN, inf, huge, subnormal) and zero inputs; kPrefill and the backward within the
// analytic bounds of docs/ops.md, computed per element in float64 from the inputs. Sequences of
// length 1, 31, 32, 33, 4097 and packed batches of mixed lengths (one empty), GQA ratios 1 / 2 / 8,
// head_dim 16 / 24 / 64 / 128 / 256, cu_seqlens on the host and on the device, outputs poisoned
// and every GPU run done twice with identical bytes. --op kv_cache / attention_cached:
// test_gpu_ops_kv_cache.cpp.
#include "test_gpu_ops_attention.h"

#include <cmath>
#include <random>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/tensor_ops.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

namespace attn = attention_test;

namespace {

using attn::Inputs;
using attn::Packed;

// The forward on the CPU and twice on CUDA (poisoned outputs): GPU vs CPU through `cmp`, GPU run 1
// vs run 2 byte for byte.
std::string forward_case(const Packed& p, const Inputs& in, ops::AttentionKernel kernel,
                         bool device_cu,
                         const std::function<std::string(const Tensor&, const Tensor&,
                                                         const Tensor&, const Tensor&)>& cmp) {
  const ops::AttentionShape s{p.hq, p.hkv, p.D};
  Tensor lse_c;
  const Tensor out_c = ops::attention(in.q, in.k, in.v, p.cu_host(), s, kernel, &lse_c);
  const Tensor qd = to_gpu(in.q), kd = to_gpu(in.k), vd = to_gpu(in.v);
  const Tensor cu = device_cu ? to_gpu(p.cu_i32()) : p.cu_host();
  Tensor lse1, lse2;
  set_poison_device_allocations(true);
  const Tensor out1 = ops::attention(qd, kd, vd, cu, s, kernel, &lse1);
  const Tensor out2 = ops::attention(qd, kd, vd, cu, s, kernel, &lse2);
  set_poison_device_allocations(false);
  return cmp(out_c, lse_c, out1, lse1) + compare_t(out1, out2, false, "rerun out") +
         compare_t(lse1, lse2, false, "rerun lse");
}

std::string bits(const Tensor& oc, const Tensor& lc, const Tensor& og, const Tensor& lg) {
  return compare_t(oc, og, true, "out") + compare_t(lc, lg, true, "lse");
}

void rowwise_cases() {
  struct Dims {
    int64_t hq, hkv, D;
  };
  std::vector<std::vector<int64_t>> lengths{{1}, {31}, {32}, {33}, {5, 1, 70, 32, 0, 33, 31, 64}};
  std::vector<Dims> dims{{4, 4, 16}, {4, 2, 64}, {8, 1, 128}, {6, 3, 24}, {2, 1, 256}};
  if (g_opt.reduced) {
    lengths = {{1}, {33}, {5, 1, 70, 32, 0, 33, 31, 64}};
    dims = {{4, 2, 64}, {8, 1, 128}, {6, 3, 24}};
  } else {
    dims.push_back({32, 4, 128});
  }
  for (const Dims& d : dims)
    for (const auto& len : lengths)
      for (Dist dist : {Dist::kNormal, Dist::kEdge, Dist::kZeros})
        for (bool dev_cu : {false, true}) {
          if (dist != Dist::kNormal && (dev_cu || len.size() == 1)) continue;
          const Packed p(len, d.hq, d.hkv, d.D);
          const std::string name = "attention rowwise " + p.name() + " " + dist_name(dist) +
                                   (dev_cu ? " cu:device" : " cu:host");
          run_case(name, [&] {
            const Inputs in = attn::raw_inputs(p, dist, case_seed(name));
            return forward_case(p, in, ops::AttentionKernel::kRowwise, dev_cu, bits);
          });
        }
  // A 4097-token sequence (129 key chunks, the last with one key) beside short ones.
  if (!g_opt.reduced) {
    const Packed p({4097, 3}, 4, 2, 64);
    const std::string name = "attention rowwise " + p.name() + " normal";
    run_case(name, [&] {
      const Inputs in = attn::raw_inputs(p, Dist::kNormal, case_seed(name));
      return forward_case(p, in, ops::AttentionKernel::kRowwise, true, bits);
    });
  }
}

void prefill_cases() {
  struct Dims {
    int64_t hq, hkv, D;
  };
  std::vector<std::vector<int64_t>> lengths{{1},  {31}, {32},
                                            {33}, {65}, {5, 1, 70, 32, 0, 33, 31, 129}};
  std::vector<Dims> dims{{4, 4, 16}, {4, 2, 64}, {8, 1, 128}, {6, 3, 24}, {2, 1, 256}};
  if (!g_opt.reduced) dims.push_back({32, 4, 128});
  for (const Dims& d : dims)
    for (const auto& len : lengths)
      for (attn::Kind kind :
           {attn::Kind::kBf16, attn::Kind::kUniform, attn::Kind::kPeaked, attn::Kind::kZeroQ})
        for (bool dev_cu : {false, true}) {
          if (kind != attn::Kind::kBf16 && (dev_cu || len.size() == 1)) continue;
          const Packed p(len, d.hq, d.hkv, d.D);
          const std::string name = "attention_prefill " + p.name() + " " + attn::kind_name(kind) +
                                   (dev_cu ? " cu:device" : " cu:host");
          run_case(name, [&] {
            const Inputs in = attn::bounded_inputs(p, kind, case_seed(name));
            return forward_case(
                p, in, ops::AttentionKernel::kPrefill, dev_cu,
                [&](const Tensor& oc, const Tensor& lc, const Tensor& og, const Tensor& lg) {
                  return attn::check_forward_bound(p, in, oc, lc, og, lg, 1);
                });
          });
        }
  if (!g_opt.reduced) {
    const Packed p({4097, 3}, 2, 1, 64);
    const std::string name = "attention_prefill " + p.name() + " bf16";
    run_case(name, [&] {
      const Inputs in = attn::bounded_inputs(p, attn::Kind::kBf16, case_seed(name));
      return forward_case(
          p, in, ops::AttentionKernel::kPrefill, true,
          [&](const Tensor& oc, const Tensor& lc, const Tensor& og, const Tensor& lg) {
            return attn::check_forward_bound(p, in, oc, lc, og, lg, 7);
          });
    });
  }
}

void backward_cases() {
  struct Dims {
    int64_t hq, hkv, D;
  };
  std::vector<std::vector<int64_t>> lengths{{1}, {33}, {65}, {5, 1, 70, 32, 0, 33, 31, 129}};
  std::vector<Dims> dims{{4, 4, 16}, {4, 2, 64}, {8, 1, 128}, {6, 3, 24}, {2, 1, 256}};
  if (g_opt.reduced) {
    lengths = {{1}, {5, 1, 70, 32, 0, 33, 31, 129}};
    dims = {{4, 2, 64}, {8, 1, 128}, {2, 1, 256}};
  }
  for (const Dims& d : dims)
    for (const auto& len : lengths)
      for (attn::Kind kind : {attn::Kind::kBf16, attn::Kind::kUniform, attn::Kind::kPeaked})
        for (bool dev_cu : {false, true}) {
          if (kind != attn::Kind::kBf16 && (dev_cu || len.size() == 1)) continue;
          const Packed p(len, d.hq, d.hkv, d.D);
          const std::string name = "attention_backward " + p.name() + " " + attn::kind_name(kind) +
                                   (dev_cu ? " cu:device" : " cu:host");
          run_case(name, [&] { return attn::backward_case(p, kind, dev_cu, case_seed(name)); });
        }
  if (!g_opt.reduced) {
    const Packed p({4097}, 2, 1, 16);
    const std::string name = "attention_backward " + p.name() + " bf16";
    run_case(name,
             [&] { return attn::backward_case(p, attn::Kind::kBf16, true, case_seed(name)); });
  }
}

}  // namespace

void test_attention() {
  if (want("attention")) rowwise_cases();
  if (want("attention_prefill")) prefill_cases();
  if (want("attention_backward")) backward_cases();
}

}  // namespace lockstep::gpu_test
