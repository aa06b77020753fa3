// lockstep_test_gpu: the two MoE producer fusions (moe_fused.h) on CUDA against their CPU
// definitions (the unfused composition): permute + NVFP4 per_row, weighted SwiGLU + NVFP4 per_row,
// including the bf16 SwiGLU kernel's shapes (H of 1 .. 1024 chunks, teams, wrapping row buffers).
#include <random>

#include "lockstep/quant/moe_fused.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

namespace {

Tensor probs(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> p(static_cast<size_t>(rows));
  for (float& x : p) x = float(rng() % 1000 + 1) / 1000.0f;
  return Tensor::from_vector<float>(p, {rows}, DType::kF32);
}

void swiglu_case(const std::string& name, const QuantConfig& s, Shape sh, Dist d, bool bf16) {
  if (!selected(name)) return;
  const Tensor fc1 = host_tensor(make_values(sh.rows, sh.cols * 2, d, bf16, case_seed(name)),
                                 sh.rows, sh.cols * 2, bf16);
  const Tensor p = probs(sh.rows, case_seed(name) + 1);
  const Tensor fd = to_gpu(fc1), pd = to_gpu(p);
  check_q(
      name, [&] { return swiglu_quantize(fc1, p, s, "fc1"); },
      [&] { return swiglu_quantize(fd, pd, s, "fc1"); });
}

}  // namespace

void test_fused() {
  QuantConfig s;
  s.format = Format::kNvfp4, s.scaling = Scaling::kPerRow;
  for (bool sr : {false, true})
    for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled})
      for (Shape sh : std::vector<Shape>{{200, 512}, {1, 16}, {0, 64}, {37, 2048}})
        for (bool bf16 : {true, false}) {
          s.stochastic = sr, s.scale_layout = l, s.seed = 11;
          const std::string tail = quant_spec_name(s) + " " + std::to_string(sh.rows) + "x" +
                                   std::to_string(sh.cols) + (bf16 ? " bf16" : " f32");
          if (want("permute", "nvfp4")) {
            const std::string name = "permute " + tail;
            if (selected(name)) {
              std::mt19937_64 rng(case_seed(name));
              // top-2 routing over 8 experts; groups padded to 16 rows with -1 (zero) rows half the
              // time
              const int64_t experts = 8;
              std::vector<std::vector<int32_t>> per(experts);
              for (int64_t t = 0; t < sh.rows; ++t) {
                const int64_t e0 = int64_t(rng() % experts),
                              e1 = (e0 + 1 + int64_t(rng() % (experts - 1))) % experts;
                per[size_t(e0)].push_back(int32_t(t));
                per[size_t(e1)].push_back(int32_t(t));
              }
              std::vector<int32_t> src;
              std::vector<int64_t> off{0};
              for (int64_t e = 0; e < experts; ++e) {
                src.insert(src.end(), per[size_t(e)].begin(), per[size_t(e)].end());
                if (e % 2 == 0)
                  while (src.size() % 16) src.push_back(-1);
                off.push_back(int64_t(src.size()));
              }
              const Tensor x =
                  host_tensor(make_values(sh.rows, sh.cols, Dist::kEdge, bf16, case_seed(name)),
                              sh.rows, sh.cols, bf16);
              const Tensor rows_t =
                  Tensor::from_vector<int32_t>(src, {int64_t(src.size())}, DType::kI32);
              const Tensor xd = to_gpu(x), rd = to_gpu(rows_t);
              check_q(
                  name, [&] { return permute_quantize(x, rows_t, off, s, "tokens"); },
                  [&] { return permute_quantize(xd, rd, off, s, "tokens"); });
            }
          }
          if (want("swiglu", "nvfp4")) swiglu_case("swiglu " + tail, s, sh, Dist::kEdge, bf16);
        }
  // The bf16 SwiGLU kernel: H of 1 .. 1024 chunks (1025: the generic kernel), teams of 32 .. 1024
  // threads, up to ~10 rows per team (its row buffers wrap), every value distribution (zeros: gates
  // outside the silu table; nanrows: all-NaN rows).
  if (!want("swiglu", "nvfp4")) return;
  struct FS {
    Shape sh;
    bool all_dists;
  };
  std::vector<FS> fs = {{{20000, 16}, true},   {{6000, 80}, true},  {{2100, 1600}, true},
                        {{2200, 4096}, false}, {{40, 16384}, true}, {{3, 16400}, true}};
  if (g_opt.reduced) fs = {{{3000, 16}, true}, {{40, 4096}, true}};
  for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled})
    for (const FS& f : fs)
      for (Dist d : {Dist::kNormal, Dist::kEdge, Dist::kZeros, Dist::kNanRows}) {
        if (!f.all_dists && (d == Dist::kZeros || d == Dist::kNanRows)) continue;
        s.stochastic = false, s.scale_layout = l;
        swiglu_case("swiglu " + quant_spec_name(s) + " " + std::to_string(f.sh.rows) + "x" +
                        std::to_string(f.sh.cols) + " bf16 " + dist_name(d),
                    s, f.sh, d, true);
      }
}

}  // namespace lockstep::gpu_test
