// lockstep_test_gpu: the rowwise quantizers (quantize, quantize_grouped, quantize_joint),
// dequantize and the Hadamard transform on CUDA against the CPU reference: every format, scaling
// and option over awkward shapes, bf16 and fp32 inputs, normal / edge / zero / NaN-row values.
// Device outputs are poisoned (0xFF) when allocated, every op runs twice and both runs must equal
// the CPU bytes.
#include <algorithm>
#include <random>

#include "lockstep/quant/layout.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {
namespace {

std::string spec_name(const QuantConfig& s) {
  std::string n = std::string(format_name(s.format)) + " " + std::string(scaling_name(s.scaling));
  if (s.block2d) n += " 2d";
  if (s.rowwise && s.colwise)
    n += " row+col";
  else if (s.colwise)
    n += " col";
  if (s.elem == ElemCodec::kE5M2 && s.format != Format::kNvfp4) n += " e5m2";
  if (s.pow2) n += " pow2";
  if (s.eps != 0.0f) n += " eps";
  if (s.stochastic) n += " sr";
  if (s.hadamard) n += " had";
  if (s.scale_layout == ScaleLayout::kSwizzled) n += " swz";
  return n;
}

// The rowwise configurations (the columnwise ones: test_gpu_colwise.cpp), MXFP8 with its
// columnwise copy (its tile kernel writes both).
std::vector<QuantConfig> rowwise_specs() {
  std::vector<QuantConfig> v;
  for (Scaling sc : {Scaling::kPerTensor, Scaling::kPerRow})
    for (bool b2 : {false, true})
      for (bool sr : {false, true})
        for (bool had : {false, true})
          for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled}) {
            if (b2 && (sc == Scaling::kPerRow || had)) continue;
            QuantConfig s;
            s.format = Format::kNvfp4, s.scaling = sc, s.block2d = b2, s.stochastic = sr,
            s.hadamard = had;
            s.scale_layout = l, s.seed = 0x1234567890ABCDEFull, s.rng_stream = 7;
            v.push_back(s);
          }
  for (int mode = 0; mode < 3; ++mode)
    for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2})
      for (bool sr : {false, true})
        for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled}) {
          if (mode == 2 && l == ScaleLayout::kSwizzled) continue;
          QuantConfig s;
          s.format = Format::kMxfp8, s.scaling = Scaling::kBlock1x32, s.elem = e, s.stochastic = sr,
          s.scale_layout = l;
          s.rowwise = mode != 2, s.colwise = mode != 0, s.seed = 99, s.rng_stream = 3;
          v.push_back(s);
        }
  for (Scaling sc :
       {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kBlock1x128, Scaling::kBlock128x128})
    for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2})
      for (int opt = 0; opt < 4; ++opt) {
        QuantConfig s;
        s.format = Format::kFp8, s.scaling = sc, s.elem = e;
        s.pow2 = opt == 1, s.eps = opt == 2 ? 1e-3f : 0.0f, s.stochastic = opt == 3, s.seed = 5;
        v.push_back(s);
      }
  return v;
}

}  // namespace

std::vector<QuantConfig> all_rowwise_specs() { return rowwise_specs(); }
std::string quant_spec_name(const QuantConfig& s) { return spec_name(s); }

void quantize_cases(const std::string& prefix, const QuantConfig& s,
                    const std::vector<Shape>& shapes) {
  for (const Shape& sh : shapes)
    for (Dist d : {Dist::kNormal, Dist::kEdge, Dist::kZeros, Dist::kNanRows})
      for (bool bf16 : {true, false}) {
        if (g_opt.reduced && d != Dist::kEdge) continue;  // (both loaders: bf16 and f32)
        if ((d == Dist::kZeros || d == Dist::kNanRows) && sh.rows * sh.cols > 100000) continue;
        const std::string name = prefix + " " + spec_name(s) + " " + std::to_string(sh.rows) + "x" +
                                 std::to_string(sh.cols) + (bf16 ? " bf16 " : " f32 ") +
                                 dist_name(d);
        if (!selected(name)) continue;
        const Tensor x = host_tensor(make_values(sh.rows, sh.cols, d, bf16, case_seed(name)),
                                     sh.rows, sh.cols, bf16);
        const Tensor xd = to_gpu(x);
        check_q(
            name, [&] { return quantize(x, s, "x"); }, [&] { return quantize(xd, s, "x"); });
      }
}

void test_quantize() {
  if (!want("quantize") && !want("dequantize")) return;
  std::vector<Shape> shapes = {{1, 16},    {993, 512}, {0, 0},      {0, 32},    {5, 0},
                               {32, 32},   {96, 256},  {256, 4096}, {4, 20480}, {7, 100},
                               {130, 300}, {160, 48},  {24, 16}};
  if (g_opt.reduced) shapes = {{1, 16}, {96, 256}, {7, 100}, {0, 32}, {32, 20480}};
  for (const QuantConfig& s : rowwise_specs())
    if (want("quantize", std::string(format_name(s.format)))) quantize_cases("quantize", s, shapes);
}

// Dequantize of CPU bytes on both backends, every copy, F32 and BF16 outputs.
void test_dequantize() {
  if (!want("dequantize")) return;
  std::vector<Shape> shapes = {{1, 16}, {96, 256}, {130, 300}, {0, 32}, {64, 4096}};
  if (g_opt.reduced) shapes = {{1, 16}, {96, 256}};
  std::vector<QuantConfig> specs = rowwise_specs();
  for (QuantConfig s : std::vector<QuantConfig>(specs)) {  // and every transposed columnwise copy
    if (s.format == Format::kMxfp8 || s.hadamard) continue;
    s.colwise = true;
    specs.push_back(s);
  }
  for (const QuantConfig& s : specs) {
    if (!want("dequantize", std::string(format_name(s.format)))) continue;
    for (const Shape& sh : shapes)
      for (Dist d : {Dist::kNormal, Dist::kEdge, Dist::kNanRows}) {
        const std::string base = spec_name(s) + " " + std::to_string(sh.rows) + "x" +
                                 std::to_string(sh.cols) + " " + dist_name(d);
        const Tensor x = host_tensor(make_values(sh.rows, sh.cols, d, true, case_seed(base)),
                                     sh.rows, sh.cols, true);
        QTensor ref;
        try {
          ref = quantize(x, s, "x");
        } catch (const QuantError&) {
          continue;  // (shape refused by both backends: test_quantize / test_colwise)
        }
        const QTensor refd = ref.to(gpu());
        for (Copy c : {Copy::kRowwise, Copy::kColwise})
          for (DType dt : {DType::kF32, DType::kBF16}) {
            if (!ref.copy(c).defined()) continue;
            const std::string name = std::string("dequantize ") +
                                     (c == Copy::kColwise ? "colwise " : "") +
                                     (dt == DType::kBF16 ? "bf16out " : "") + base;
            if (!selected(name)) continue;
            DequantConfig dc;
            dc.copy = c, dc.dtype = dt;
            run_case(name, [&] {
              std::string err;
              const Tensor e = dequantize(ref, dc);
              set_poison_device_allocations(true);
              const Tensor g0 = dequantize(refd, dc), g1 = dequantize(refd, dc);
              set_poison_device_allocations(false);
              err = compare_t(e, g0, true, "values") + compare_t(g0, g1, false, "second run");
              return err;
            });
          }
      }
  }
}

void test_grouped() {
  if (!want("grouped")) return;
  struct G {
    int64_t groups, max_rows, cols;
  };
  std::vector<G> gs = {{1, 5, 32}, {8, 40, 256}, {128, 48, 256}, {3, 0, 64}};
  if (g_opt.reduced) gs = {{8, 40, 256}};
  for (const QuantConfig& base : rowwise_specs()) {
    if (!want("grouped", std::string(format_name(base.format)))) continue;
    std::vector<QuantConfig> specs{base};
    if (base.format != Format::kMxfp8 && base.scaling == Scaling::kPerTensor) {
      QuantConfig s = base;
      s.scaling = Scaling::kPerGroup;
      specs.push_back(s);
    }
    for (const QuantConfig& s : specs)
      for (const G& g : gs)
        for (bool padded : {false, true}) {
          int64_t need = 1;
          if (s.format == Format::kNvfp4 && s.block2d) need = 16;
          if (s.format == Format::kMxfp8 && s.colwise) need = 32;
          if (s.format == Format::kFp8 && s.scaling == Scaling::kBlock128x128) need = 128;
          const int64_t mult = padded ? std::max<int64_t>(need, 32) : need;
          const std::string name = "grouped " + spec_name(s) + " g" + std::to_string(g.groups) +
                                   " c" + std::to_string(g.cols) + (padded ? " padded" : " ragged");
          if (!selected(name)) continue;
          const std::vector<int64_t> src_off =
              ragged_offsets(g.groups, g.max_rows, need, case_seed(name));
          const std::vector<float> v0 =
              make_values(src_off.back(), g.cols, Dist::kEdge, true, case_seed(name));
          const PaddedGroups pg = pad_groups(v0, g.cols, src_off, mult);  // padding rows are zero
          const Tensor x = host_tensor(pg.values, pg.offsets.back(), g.cols, true), xd = to_gpu(x);
          check_q(
              name, [&] { return quantize_grouped(x, pg.offsets, s, "moe"); },
              [&] { return quantize_grouped(xd, pg.offsets, s, "moe"); });
        }
  }
}

void test_joint() {
  if (!want("joint", "nvfp4")) return;
  for (bool had : {false, true})
    for (bool sr : {false, true})
      for (bool col : {false, true})
        for (int variant = 0; variant < 3; ++variant) {
          QuantConfig s;
          s.format = Format::kNvfp4, s.scaling = Scaling::kPerTensor, s.hadamard = had,
          s.stochastic = sr;
          s.colwise = col, s.seed = 77;
          const std::string name = std::string("joint nvfp4") + (had ? " had" : "") +
                                   (sr ? " sr" : "") + (col ? " row+col" : "") + " v" +
                                   std::to_string(variant);
          if (!selected(name)) continue;
          const std::vector<Shape> shapes = variant == 0 ? std::vector<Shape>{{64, 256}, {64, 256}}
                                            : variant == 1
                                                ? std::vector<Shape>{{16, 32}, {0, 48}, {32, 512}}
                                                : std::vector<Shape>{{0, 16}};
          std::vector<Tensor> xs, xds;
          for (size_t i = 0; i < shapes.size(); ++i) {
            xs.push_back(host_tensor(make_values(shapes[i].rows, shapes[i].cols, Dist::kEdge, false,
                                                 case_seed(name) + i),
                                     shapes[i].rows, shapes[i].cols, false));
            xds.push_back(to_gpu(xs.back()));
          }
          run_case(name, [&] {
            std::string err;
            const std::vector<QTensor> expect = quantize_joint(xs, s);
            for (int k = 0; k < 2; ++k) {
              set_poison_device_allocations(true);
              const std::vector<QTensor> got = quantize_joint(xds, s);
              set_poison_device_allocations(false);
              for (size_t i = 0; i < got.size(); ++i) {
                const std::string e = compare_q(expect[i], got[i].to(Device::cpu()));
                if (!e.empty()) err += " [" + std::to_string(i) + "]" + e;
              }
            }
            return err;
          });
        }
}

void test_hadamard() {
  if (!want("hadamard")) return;
  for (Shape sh : std::vector<Shape>{{1, 16}, {993, 512}, {0, 16}, {7, 48}})
    for (Dist d : {Dist::kNormal, Dist::kEdge})
      for (bool bf16 : {true, false}) {
        const std::string name = "hadamard " + std::to_string(sh.rows) + "x" +
                                 std::to_string(sh.cols) + (bf16 ? " bf16 " : " f32 ") +
                                 dist_name(d);
        if (!selected(name)) continue;
        const Tensor x = host_tensor(make_values(sh.rows, sh.cols, d, bf16, case_seed(name)),
                                     sh.rows, sh.cols, bf16);
        const Tensor xd = to_gpu(x);
        const Tensor e = hadamard16_rows(x);
        set_poison_device_allocations(true);
        const Tensor g0 = hadamard16_rows(xd), g1 = hadamard16_rows(xd);
        set_poison_device_allocations(false);
        report(name, compare_t(e, g0, true, "values") + compare_t(g0, g1, false, "second run"));
      }
}

}  // namespace lockstep::gpu_test
