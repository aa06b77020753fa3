// lockstep_test_gpu: the columnwise copies of CONTRACT.md section 12 on CUDA against the CPU
// reference, byte for byte: NVFP4 1-D (per_tensor, per_row, per_group, with and without the
// rowwise copy, Hadamard, stochastic rounding, swizzled scales), NVFP4 2-D (the transpose), FP8
// 1x128 / per_row (the quantization of X^T) and per_tensor / per_group / 128x128 (the transpose),
// MXFP8 (blocks down columns); ungrouped on awkward shapes, grouped with ragged and empty groups.
#include <algorithm>
#include <random>

#include "lockstep/quant/layout.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

namespace {

// Every columnwise configuration; grouped: per_group added, swizzled scales (refused for grouped
// transposed copies) kept only where they apply.
std::vector<QuantConfig> colwise_specs(bool grouped) {
  std::vector<QuantConfig> v;
  std::vector<Scaling> nv = {Scaling::kPerTensor, Scaling::kPerRow};
  if (grouped) nv.push_back(Scaling::kPerGroup);
  for (Scaling sc : nv)
    for (bool b2 : {false, true})
      for (bool row : {true, false})
        for (int opt = 0; opt < 4; ++opt) {  // 0 plain, 1 sr, 2 hadamard, 3 swizzled
          if (b2 && (sc == Scaling::kPerRow || opt == 2)) continue;
          if (grouped && opt == 3) continue;
          QuantConfig s;
          s.format = Format::kNvfp4, s.scaling = sc, s.block2d = b2, s.rowwise = row,
          s.colwise = true;
          s.stochastic = opt == 1, s.hadamard = opt == 2;
          s.scale_layout = opt == 3 ? ScaleLayout::kSwizzled : ScaleLayout::kCompact;
          s.seed = 0xFEEDFACE12345ull, s.rng_stream = 11;
          v.push_back(s);
        }
  std::vector<Scaling> f8 = {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kBlock1x128,
                             Scaling::kBlock128x128};
  if (grouped) f8.push_back(Scaling::kPerGroup);
  for (Scaling sc : f8)
    for (bool row : {true, false})
      for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2})
        for (int opt = 0; opt < 4; ++opt) {  // 0 plain, 1 pow2, 2 eps, 3 sr
          if (e == ElemCodec::kE5M2 && opt != 0) continue;
          QuantConfig s;
          s.format = Format::kFp8, s.scaling = sc, s.elem = e, s.rowwise = row, s.colwise = true;
          s.pow2 = opt == 1, s.eps = opt == 2 ? 1e-3f : 0.0f, s.stochastic = opt == 3, s.seed = 21,
          s.rng_stream = 2;
          v.push_back(s);
        }
  for (bool row : {true, false})
    for (bool sr : {false, true}) {
      QuantConfig s;
      s.format = Format::kMxfp8, s.scaling = Scaling::kBlock1x32, s.rowwise = row, s.colwise = true,
      s.stochastic = sr;
      v.push_back(s);
    }
  return v;
}

}  // namespace

void test_colwise() {
  if (!want("colwise")) return;
  // Shapes: the minimal 16 x 16, ragged column counts (cols % 128 != 0, cols % 32 != 0 where the
  // format allows), rows not a multiple of the 128-row tiles, empty tensors, a wide and a tall one.
  std::vector<Shape> shapes = {{16, 16}, {32, 48},   {48, 160},  {96, 256},   {160, 48},
                               {0, 32},  {16, 0},    {1008, 80}, {256, 4096}, {4096, 128},
                               {7, 100}, {130, 300}, {1, 16},    {993, 512}};
  if (g_opt.reduced) shapes = {{16, 16}, {48, 160}, {130, 300}, {0, 32}};
  for (const QuantConfig& s : colwise_specs(false))
    if (want("colwise", std::string(format_name(s.format)))) quantize_cases("colwise", s, shapes);
  struct G {
    int64_t groups, max_rows, cols;
  };
  std::vector<G> gs = {{1, 40, 32}, {6, 200, 144}, {64, 48, 256}, {3, 0, 64}};
  if (g_opt.reduced) gs = {{6, 200, 144}};
  for (const QuantConfig& s : colwise_specs(true)) {
    if (!want("colwise", std::string(format_name(s.format)))) continue;
    int64_t need = 1;
    if (s.format == Format::kNvfp4) need = 16;
    if (s.format == Format::kMxfp8) need = 32;
    if (s.format == Format::kFp8 && s.scaling == Scaling::kBlock128x128) need = 128;
    for (const G& g : gs) {
      const std::string name = "colwise grouped " + quant_spec_name(s) + " g" +
                               std::to_string(g.groups) + " c" + std::to_string(g.cols);
      if (!selected(name)) continue;
      const std::vector<int64_t> off = ragged_offsets(g.groups, g.max_rows, need, case_seed(name));
      const Tensor x =
          host_tensor(make_values(off.back(), g.cols, Dist::kEdge, true, case_seed(name)),
                      off.back(), g.cols, true);
      const Tensor xd = to_gpu(x);
      check_q(
          name, [&] { return quantize_grouped(x, off, s, "moe"); },
          [&] { return quantize_grouped(xd, off, s, "moe"); });
    }
  }
}

}  // namespace lockstep::gpu_test
