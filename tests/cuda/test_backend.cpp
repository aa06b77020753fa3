// lockstep_test_backend: the cross-backend harness (in the spirit of ggml's test-backend-ops).
// Every CUDA op runs against the CPU reference over formats x scalings x options x awkward shapes
// x input dtypes x value distributions. Outputs are poisoned (0xFF: NaN floats, 0xFF codes)
// before each run, every op runs twice and both runs must equal the CPU bytes exactly.
// Usage: lockstep_test_backend [--op OP] [--format F] [--only SUBSTR] [--seed S] [--reduced]
//        [--mode test|perf] [--rows R --cols C]. Last line: "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"
#include "lockstep/quant/moe_fused.h"
#include "lockstep/quant/quantize_cuda.h"

using namespace lockstep;
using namespace lockstep::cuda;

namespace {

struct Options {
  std::string op, format, only, mode = "test";
  uint64_t seed = 20261130;
  bool reduced = false;
  int64_t rows = 16384, cols = 8192;
};

int g_pass = 0, g_fail = 0;
const char* g_argv0 = "lockstep_test_backend";

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

// ---- inputs ---------------------------------------------------------------------------------
enum class Dist { kNormal, kEdge, kZeros, kNanRows };
const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kNormal: return "normal";
    case Dist::kEdge: return "edge";
    case Dist::kZeros: return "zeros";
    case Dist::kNanRows: return "nanrows";
  }
  return "?";
}

std::vector<float> make_values(int64_t rows, int64_t cols, Dist d, bool bf16, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> v(size_t(rows * cols));
  const float kNan = std::bit_cast<float>(0x7FC00000u);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, kNan, 1e38f, -3.4e38f, 1e-40f, -1e-45f, 0.25f, 0.75f,
                            2.5f, 5.0f, 448.0f, 464.0f, 57344.0f, 6.0f, 1.0f / 6.0f, 1e-8f, 65504.0f};
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::pow(10.0f, -3.0f + 6.0f * ud(rng));
    const bool nan_row = d == Dist::kNanRows && (r % 3 == 1);
    for (int64_t c = 0; c < cols; ++c) {
      float x = nd(rng) * row_scale;
      if (d == Dist::kZeros) x = (r % 2 == 0) ? 0.0f : -0.0f;
      if (d == Dist::kEdge && ud(rng) < 0.08f) x = specials[rng() % (sizeof(specials) / sizeof(float))];
      if (d == Dist::kEdge && ud(rng) < 0.02f) x = std::ldexp(nd(rng), int(rng() % 250) - 140);
      if (nan_row) x = (c % 2) ? kNan : -kNan;
      if (bf16) x = num::bf16_to_f32(num::f32_to_bf16(x));
      v[size_t(r * cols + c)] = x;
    }
  }
  return v;
}

// ---- comparison -----------------------------------------------------------------------------
template <class T>
size_t count_diff(const std::vector<T>& a, const std::vector<T>& b, size_t* first) {
  if (a.size() != b.size()) return std::max(a.size(), b.size()) + 1;
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool same;
    if constexpr (std::is_same_v<T, float>) same = std::memcmp(&a[i], &b[i], 4) == 0;
    else same = a[i] == b[i];
    if (!same && n++ == 0) *first = i;
  }
  return n;
}

// Dequantized values: bit-exact, except that all NaN encodings count as equal (GPU arithmetic
// returns the canonical NaN 0x7FFFFFFF; x86 propagates the operand's payload).
size_t count_diff_values(const std::vector<float>& a, const std::vector<float>& b, size_t* first) {
  if (a.size() != b.size()) return std::max(a.size(), b.size()) + 1;
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = (std::isnan(a[i]) && std::isnan(b[i])) || std::memcmp(&a[i], &b[i], 4) == 0;
    if (!same && n++ == 0) *first = i;
  }
  return n;
}

std::string compare_q(const QTensor& e, const QTensor& g) {
  std::string err;
  auto meta = [&](const char* what, int64_t a, int64_t b) {
    if (a != b) err += std::string(" ") + what + "(" + std::to_string(a) + " vs " + std::to_string(b) + ")";
  };
  meta("format", int(e.format), int(g.format));
  meta("scaling", int(e.scaling), int(g.scaling));
  meta("elem", int(e.elem), int(g.elem));
  meta("block2d", e.block2d, g.block2d);
  meta("rows", e.rows, g.rows);
  meta("cols", e.cols, g.cols);
  meta("scale_rows", e.scale_rows, g.scale_rows);
  meta("scale_cols", e.scale_cols, g.scale_cols);
  meta("scale_layout", int(e.scale_layout), int(g.scale_layout));
  meta("scale_inv_rows", e.scale_inv_rows, g.scale_inv_rows);
  meta("scale_inv_cols", e.scale_inv_cols, g.scale_inv_cols);
  meta("has_rowwise", e.has_rowwise, g.has_rowwise);
  if (e.group_offsets != g.group_offsets) err += " group_offsets";
  size_t f = 0, n;
  if ((n = count_diff(e.data, g.data, &f))) err += " data:" + std::to_string(n) + "@" + std::to_string(f);
  if ((n = count_diff(e.block_scale, g.block_scale, &f))) err += " block_scale:" + std::to_string(n) + "@" + std::to_string(f);
  if ((n = count_diff(e.amax, g.amax, &f))) err += " amax:" + std::to_string(n) + "@" + std::to_string(f);
  if ((n = count_diff(e.scale_inv, g.scale_inv, &f))) err += " scale_inv:" + std::to_string(n) + "@" + std::to_string(f);
  if ((n = count_diff(e.data_colwise, g.data_colwise, &f))) err += " data_colwise:" + std::to_string(n) + "@" + std::to_string(f);
  if ((n = count_diff(e.block_scale_colwise, g.block_scale_colwise, &f)))
    err += " block_scale_colwise:" + std::to_string(n) + "@" + std::to_string(f);
  return err;
}

void poison(DeviceQTensor& q) {
  for (DeviceBuffer* b : {&q.data, &q.block_scale, &q.amax, &q.scale_inv, &q.data_colwise, &q.block_scale_colwise}) b->fill(0xFF);
}

void report(const std::string& name, uint64_t seed, const std::string& err, const Options& o) {
  if (err.empty()) {
    ++g_pass;
    return;
  }
  ++g_fail;
  std::printf("FAIL %s seed=%llu:%s\n  repro: %s --only '%s' --seed %llu\n", name.c_str(), (unsigned long long)seed,
              err.c_str(), g_argv0, name.c_str(), (unsigned long long)o.seed);
}

// Runs `cpu` and `gpu` (poison -> run -> copy, twice) and compares; exceptions must agree.
void check_q(const std::string& name, uint64_t seed, const Options& o, const std::function<QTensor()>& cpu,
             const std::function<void(DeviceQTensor&)>& gpu) {
  if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
  QTensor expect;
  std::string cpu_err, gpu_err;
  try {
    expect = cpu();
  } catch (const QuantError& e) {
    cpu_err = e.what();
  }
  DeviceQTensor q;
  QTensor got[2];
  try {
    gpu(q);  // sizes the buffers
    for (int k = 0; k < 2; ++k) {
      poison(q);
      gpu(q);
      LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
      got[k] = to_host(q);
    }
  } catch (const QuantError& e) {
    gpu_err = e.what();
  }
  if (!cpu_err.empty() || !gpu_err.empty()) {
    report(name, seed, cpu_err.empty() == gpu_err.empty() ? "" : " cpu threw '" + cpu_err + "', cuda threw '" + gpu_err + "'", o);
    return;
  }
  std::string err = compare_q(expect, got[0]);
  const std::string again = compare_q(got[0], got[1]);
  if (!again.empty()) err += " | second run differs:" + again;
  report(name, seed, err, o);
}

bool want(const Options& o, const std::string& op, const std::string& fmt) {
  return (o.op.empty() || o.op == op) && (o.format.empty() || o.format == fmt);
}

struct Shape {
  int64_t rows, cols;
};

std::string spec_name(const QuantConfig& s) {
  std::string n = std::string(format_name(s.format)) + " " + std::string(scaling_name(s.scaling));
  if (s.block2d) n += " 2d";
  if (s.format == Format::kMxfp8) n += s.rowwise ? (s.colwise ? " row+col" : " row") : " col";
  if (s.elem == ElemCodec::kE5M2 && s.format != Format::kNvfp4) n += " e5m2";
  if (s.pow2) n += " pow2";
  if (s.eps != 0.0f) n += " eps";
  if (s.stochastic) n += " sr";
  if (s.hadamard) n += " had";
  if (s.scale_layout == ScaleLayout::kSwizzled) n += " swz";
  return n;
}

std::vector<QuantConfig> all_specs() {
  std::vector<QuantConfig> v;
  for (Scaling sc : {Scaling::kPerTensor, Scaling::kPerRow})
    for (bool b2 : {false, true})
      for (bool sr : {false, true})
        for (bool had : {false, true})
          for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled}) {
            if (b2 && (sc == Scaling::kPerRow || had)) continue;
            QuantConfig s;
            s.format = Format::kNvfp4, s.scaling = sc, s.block2d = b2, s.stochastic = sr, s.hadamard = had, s.scale_layout = l;
            s.seed = 0x1234567890ABCDEFull, s.rng_stream = 7;
            v.push_back(s);
          }
  for (int mode = 0; mode < 3; ++mode)
    for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2})
      for (bool sr : {false, true})
        for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled}) {
          if (mode == 2 && l == ScaleLayout::kSwizzled) continue;
          QuantConfig s;
          s.format = Format::kMxfp8, s.scaling = Scaling::kBlock1x32, s.elem = e, s.stochastic = sr, s.scale_layout = l;
          s.rowwise = mode != 2, s.colwise = mode != 0, s.seed = 99, s.rng_stream = 3;
          v.push_back(s);
        }
  for (Scaling sc : {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kBlock1x128, Scaling::kBlock128x128})
    for (ElemCodec e : {ElemCodec::kE4M3, ElemCodec::kE5M2})
      for (int opt = 0; opt < 4; ++opt) {
        QuantConfig s;
        s.format = Format::kFp8, s.scaling = sc, s.elem = e;
        s.pow2 = opt == 1, s.eps = opt == 2 ? 1e-3f : 0.0f, s.stochastic = opt == 3, s.hadamard = false, s.seed = 5;
        v.push_back(s);
      }
  {
    QuantConfig s;  // fp8 with the Hadamard transform
    s.format = Format::kFp8, s.scaling = Scaling::kBlock1x128, s.hadamard = true;
    v.push_back(s);
  }
  return v;
}

void test_quantize(const Options& o) {
  std::vector<Shape> shapes = {{1, 16}, {993, 512}, {0, 0}, {0, 32}, {5, 0}, {32, 32}, {96, 256}, {256, 4096}, {4, 20480},
                               {7, 100}, {130, 300}, {160, 48}, {24, 16}};
  if (o.reduced) shapes = {{1, 16}, {96, 256}, {7, 100}, {0, 32}, {32, 20480}};
  const Dist dists[] = {Dist::kNormal, Dist::kEdge, Dist::kZeros, Dist::kNanRows};
  for (const QuantConfig& s : all_specs()) {
    const std::string fmt(format_name(s.format));
    if (!want(o, "quantize", fmt) && !want(o, "dequantize", fmt)) continue;
    for (const Shape& sh : shapes)
      for (Dist d : dists)
        for (bool bf16 : {true, false}) {
          if (o.reduced && (d == Dist::kZeros || !bf16)) continue;
          if ((d == Dist::kZeros || d == Dist::kNanRows) && sh.rows * sh.cols > 100000) continue;
          const std::string name = "quantize " + spec_name(s) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols) +
                                   (bf16 ? " bf16 " : " f32 ") + dist_name(d);
          const uint64_t seed = o.seed ^ name_hash(name);
          if (!o.only.empty() && name.find(o.only) == std::string::npos) continue;
          std::vector<float> v = make_values(sh.rows, sh.cols, d, bf16, seed);
          MatrixF32 m{v, sh.rows, sh.cols, bf16 ? num::kBf16Max : num::kFltMax, "x"};
          DeviceBuffer in = upload_matrix(m, bf16 ? InputType::kBF16 : InputType::kF32);
          DeviceMatrix dm{in.get(), bf16 ? InputType::kBF16 : InputType::kF32, sh.rows, sh.cols, m.type_max, "x"};
          if (want(o, "quantize", fmt))
            check_q(name, seed, o, [&] { return quantize(m, s); }, [&](DeviceQTensor& q) { quantize_device(dm, s, q); });
          // Dequantize the CPU bytes on both backends.
          if (!want(o, "dequantize", fmt) || d == Dist::kZeros) continue;
          QTensor ref;
          try {
            ref = quantize(m, s);
          } catch (const QuantError&) {
            continue;
          }
          for (bool col : {false, true}) {
            if (col && ref.data_colwise.empty()) continue;
            const std::string dn = "dequantize" + std::string(col ? "_colwise " : " ") + name.substr(9);
            std::vector<float> e;
            std::string cpu_err, gpu_err, err;
            try {
              e = col ? dequantize_colwise(ref) : dequantize(ref);
            } catch (const QuantError& x) {
              cpu_err = x.what();
            }
            DeviceQTensor dq;
            to_device(ref, dq);
            DeviceBuffer out(size_t(ref.rows * ref.cols) * 4);
            std::vector<float> got[2];
            try {
              for (int k = 0; k < 2; ++k) {
                out.fill(0xFF);
                dequantize_device(dq, out.as<float>(), col);
                got[k] = out.download<float>();
              }
            } catch (const QuantError& x) {
              gpu_err = x.what();
            }
            if (!cpu_err.empty() || !gpu_err.empty()) {
              report(dn, seed, cpu_err.empty() == gpu_err.empty() ? "" : " cpu threw '" + cpu_err + "', cuda threw '" + gpu_err + "'", o);
              continue;
            }
            size_t f = 0, n;
            if ((n = count_diff_values(e, got[0], &f))) err += " values:" + std::to_string(n) + "@" + std::to_string(f);
            if ((n = count_diff(got[0], got[1], &f))) err += " second run differs:" + std::to_string(n);
            report(dn, seed, err, o);
          }
        }
  }
}

std::vector<int64_t> ragged_offsets(int64_t groups, int64_t rows_each_max, int64_t multiple, std::mt19937_64& rng) {
  std::vector<int64_t> off{0};
  for (int64_t g = 0; g < groups; ++g) {
    int64_t n = (rng() % 4 == 0) ? 0 : int64_t(rng() % uint64_t(rows_each_max + 1));  // zero-token experts
    off.push_back(off.back() + round_up(n, multiple));
  }
  return off;
}

void test_grouped(const Options& o) {
  struct G {
    int64_t groups, max_rows, cols;
  };
  std::vector<G> gs = {{1, 5, 32}, {8, 40, 256}, {128, 48, 256}, {3, 0, 64}};
  if (o.reduced) gs = {{8, 40, 256}};
  for (const QuantConfig& base : all_specs()) {
    const std::string fmt(format_name(base.format));
    if (!want(o, "grouped", fmt)) continue;
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
          const std::string name = "grouped " + spec_name(s) + " g" + std::to_string(g.groups) + " c" + std::to_string(g.cols) +
                                   (padded ? " padded" : " ragged");
          const uint64_t seed = o.seed ^ name_hash(name);
          if (!o.only.empty() && name.find(o.only) == std::string::npos) continue;
          std::mt19937_64 rng(seed);
          std::vector<int64_t> src_off = ragged_offsets(g.groups, g.max_rows, need, rng);
          std::vector<float> v0 = make_values(src_off.back(), g.cols, Dist::kEdge, true, seed);
          PaddedGroups pg = pad_groups(v0, g.cols, src_off, mult);  // padding rows are zero
          MatrixF32 m{pg.values, pg.offsets.back(), g.cols, num::kBf16Max, "moe"};
          DeviceBuffer in = upload_matrix(m, InputType::kBF16);
          DeviceMatrix dm{in.get(), InputType::kBF16, m.rows, m.cols, m.type_max, "moe"};
          DeviceGroups dg(pg.offsets);
          check_q(name, seed, o, [&] { return quantize_grouped(m, pg.offsets, s); },
                  [&](DeviceQTensor& q) { quantize_device(dm, s, q, &dg); });
        }
  }
}

void test_joint(const Options& o) {
  if (!want(o, "joint", "nvfp4")) return;
  for (bool had : {false, true})
    for (bool sr : {false, true})
      for (int variant = 0; variant < 3; ++variant) {
        QuantConfig s;
        s.format = Format::kNvfp4, s.scaling = Scaling::kPerTensor, s.hadamard = had, s.stochastic = sr, s.seed = 77;
        const std::string name = std::string("joint nvfp4") + (had ? " had" : "") + (sr ? " sr" : "") + " v" + std::to_string(variant);
        const uint64_t seed = o.seed ^ name_hash(name);
        if (!o.only.empty() && name.find(o.only) == std::string::npos) continue;
        std::vector<Shape> shapes = variant == 0 ? std::vector<Shape>{{64, 256}, {64, 256}}
                                  : variant == 1 ? std::vector<Shape>{{3, 32}, {0, 48}, {17, 512}}
                                                 : std::vector<Shape>{{0, 16}};
        std::vector<std::vector<float>> vals;
        std::vector<MatrixF32> ms;
        std::vector<DeviceBuffer> ins;
        std::vector<DeviceMatrix> dms;
        for (size_t i = 0; i < shapes.size(); ++i) vals.push_back(make_values(shapes[i].rows, shapes[i].cols, Dist::kEdge, false, seed + i));
        for (size_t i = 0; i < shapes.size(); ++i) {
          ms.push_back(MatrixF32{vals[i], shapes[i].rows, shapes[i].cols, num::kFltMax, "t" + std::to_string(i)});
          ins.push_back(upload_matrix(ms[i], InputType::kF32));
          dms.push_back(DeviceMatrix{ins[i].get(), InputType::kF32, shapes[i].rows, shapes[i].cols, num::kFltMax, ms[i].name});
        }
        std::vector<QTensor> expect = quantize_nvfp4_joint(ms, s);
        std::vector<DeviceQTensor> outs(ms.size());
        quantize_nvfp4_joint_device(dms, s, outs);
        std::string err;
        for (int k = 0; k < 2; ++k) {
          for (auto& q : outs) poison(q);
          quantize_nvfp4_joint_device(dms, s, outs);
          LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
          for (size_t i = 0; i < outs.size(); ++i) {
            const std::string e = compare_q(expect[i], to_host(outs[i]));
            if (!e.empty()) err += " [" + std::to_string(i) + "]" + e;
          }
        }
        report(name, seed, err, o);
      }
}

void test_hadamard(const Options& o) {
  if (!want(o, "hadamard", "")) return;
  for (Shape sh : std::vector<Shape>{{1, 16}, {993, 512}, {0, 16}, {7, 48}})
    for (Dist d : {Dist::kNormal, Dist::kEdge})
      for (bool bf16 : {true, false}) {
        const std::string name = "hadamard " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + (bf16 ? " bf16 " : " f32 ") + dist_name(d);
        const uint64_t seed = o.seed ^ name_hash(name);
        if (!o.only.empty() && name.find(o.only) == std::string::npos) continue;
        std::vector<float> v = make_values(sh.rows, sh.cols, d, bf16, seed);
        MatrixF32 m{v, sh.rows, sh.cols, num::kFltMax, "x"};
        std::vector<float> e = hadamard16_rows(m);
        DeviceBuffer in = upload_matrix(m, bf16 ? InputType::kBF16 : InputType::kF32);
        DeviceMatrix dm{in.get(), bf16 ? InputType::kBF16 : InputType::kF32, sh.rows, sh.cols, num::kFltMax, "x"};
        DeviceBuffer out(e.size() * 4);
        std::vector<float> got[2];
        for (int k = 0; k < 2; ++k) {
          out.fill(0xFF);
          hadamard16_rows_device(dm, out.as<float>());
          got[k] = out.download<float>();
        }
        std::string err;
        size_t f = 0, n;
        if ((n = count_diff_values(e, got[0], &f))) err += " values:" + std::to_string(n) + "@" + std::to_string(f);
        if ((n = count_diff(got[0], got[1], &f))) err += " second run differs";
        report(name, seed, err, o);
      }
}

void test_fused(const Options& o) {
  QuantConfig s;
  s.format = Format::kNvfp4, s.scaling = Scaling::kPerRow;
  for (bool sr : {false, true})
    for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled})
      for (Shape sh : std::vector<Shape>{{200, 512}, {1, 16}, {0, 64}, {37, 2048}})
        for (bool bf16 : {true, false}) {
          s.stochastic = sr, s.scale_layout = l, s.seed = 11;
          const std::string tail = spec_name(s) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + (bf16 ? " bf16" : " f32");
          const InputType it = bf16 ? InputType::kBF16 : InputType::kF32;
          if (want(o, "permute", "nvfp4")) {
            const std::string name = "permute " + tail;
            const uint64_t seed = o.seed ^ name_hash(name);
            std::mt19937_64 rng(seed);
            // top-2 routing over 8 experts; groups padded to 16 rows with -1 (zero) rows half the time
            const int64_t experts = 8;
            std::vector<std::vector<int32_t>> per(experts);
            for (int64_t t = 0; t < sh.rows; ++t) {
              const int64_t e0 = int64_t(rng() % experts), e1 = (e0 + 1 + int64_t(rng() % (experts - 1))) % experts;
              per[size_t(e0)].push_back(int32_t(t));
              per[size_t(e1)].push_back(int32_t(t));
            }
            std::vector<int32_t> src;
            std::vector<int64_t> off{0};
            for (int64_t e = 0; e < experts; ++e) {
              src.insert(src.end(), per[size_t(e)].begin(), per[size_t(e)].end());
              if (e % 2 == 0) while (src.size() % 16) src.push_back(-1);
              off.push_back(int64_t(src.size()));
            }
            std::vector<float> v = make_values(sh.rows, sh.cols, Dist::kEdge, bf16, seed);
            MatrixF32 m{v, sh.rows, sh.cols, num::kFltMax, "tokens"};
            DeviceBuffer in = upload_matrix(m, it), dsrc;
            dsrc.upload(std::span<const int32_t>(src));
            DeviceGroups dg(off);
            DeviceMatrix dm{in.get(), it, sh.rows, sh.cols, num::kFltMax, "tokens"};
            check_q(name, seed, o, [&] { return permute_quantize_nvfp4_cpu(m, src, off, s); },
                    [&](DeviceQTensor& q) { permute_quantize_nvfp4_device(dm, dsrc.as<int32_t>(), int64_t(src.size()), dg, s, q); });
          }
          if (want(o, "swiglu", "nvfp4")) {
            const std::string name = "swiglu " + tail;
            const uint64_t seed = o.seed ^ name_hash(name);
            std::mt19937_64 rng(seed);
            std::vector<float> v = make_values(sh.rows, sh.cols * 2, Dist::kEdge, bf16, seed);
            std::vector<float> prob(size_t(sh.rows));
            for (float& p : prob) p = float(rng() % 1000 + 1) / 1000.0f;
            MatrixF32 m{v, sh.rows, sh.cols * 2, num::kFltMax, "fc1"};
            DeviceBuffer in = upload_matrix(m, it), dp;
            dp.upload(std::span<const float>(prob));
            DeviceMatrix dm{in.get(), it, sh.rows, sh.cols * 2, num::kFltMax, "fc1"};
            check_q(name, seed, o, [&] { return swiglu_quantize_nvfp4_cpu(m, prob, s); },
                    [&](DeviceQTensor& q) { swiglu_quantize_nvfp4_device(dm, dp.as<float>(), s, q); });
          }
        }
  // The bf16 SwiGLU kernel (quantize_swiglu_cuda.cuh): H of 1 .. 1024 chunks (1025: the generic
  // kernel), teams of 32 .. 1024 threads, up to ~10 rows per team (its row buffers wrap), every
  // value distribution (zeros: gates outside the silu table; nanrows: all-NaN rows).
  if (want(o, "swiglu", "nvfp4")) {
    struct FS {
      Shape sh;
      bool all_dists;
    };
    std::vector<FS> fs = {{{20000, 16}, true}, {{6000, 80}, true}, {{2100, 1600}, true}, {{2200, 4096}, false},
                          {{40, 16384}, true}, {{3, 16400}, true}};
    if (o.reduced) fs = {{{3000, 16}, true}, {{40, 4096}, true}};
    for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled})
      for (const FS& f : fs)
        for (Dist d : {Dist::kNormal, Dist::kEdge, Dist::kZeros, Dist::kNanRows}) {
          if (!f.all_dists && (d == Dist::kZeros || d == Dist::kNanRows)) continue;
          s.stochastic = false, s.scale_layout = l;
          const Shape sh = f.sh;
          const std::string name = "swiglu " + spec_name(s) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols) +
                                   " bf16 " + dist_name(d);
          const uint64_t seed = o.seed ^ name_hash(name);
          if (!o.only.empty() && name.find(o.only) == std::string::npos) continue;
          std::mt19937_64 rng(seed);
          std::vector<float> v = make_values(sh.rows, sh.cols * 2, d, true, seed);
          std::vector<float> prob(size_t(sh.rows));
          for (float& p : prob) p = float(rng() % 1000 + 1) / 1000.0f;
          MatrixF32 m{v, sh.rows, sh.cols * 2, num::kFltMax, "fc1"};
          DeviceBuffer in = upload_matrix(m, InputType::kBF16), dp;
          dp.upload(std::span<const float>(prob));
          DeviceMatrix dm{in.get(), InputType::kBF16, sh.rows, sh.cols * 2, num::kFltMax, "fc1"};
          check_q(name, seed, o, [&] { return swiglu_quantize_nvfp4_cpu(m, prob, s); },
                  [&](DeviceQTensor& q) { swiglu_quantize_nvfp4_device(dm, dp.as<float>(), s, q); });
        }
  }
}

void test_codec(const Options& o) {
  if (!want(o, "codec", "") || o.reduced) return;  // 2^32 inputs: too slow under compute-sanitizer
  if (!o.only.empty() && std::string("codec exhaustive").find(o.only) == std::string::npos) return;
  uint64_t counts[3];
  codec_mismatches_cuda(counts);
  std::string err;
  const char* names[3] = {"e2m1", "e4m3", "e5m2"};
  for (int k = 0; k < 3; ++k)
    if (counts[k]) err += std::string(" ") + names[k] + ":" + std::to_string(counts[k]);
  report("codec exhaustive (all 2^32 fp32 inputs, fast vs reference encoders)", 0, err, o);
}

}  // namespace

int bench_main(const Options& o);

int main(int argc, char** argv) {
  g_argv0 = argv[0];
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--op") o.op = next();
    else if (a == "--format") o.format = next();
    else if (a == "--only") o.only = next();
    else if (a == "--seed") o.seed = std::stoull(next());
    else if (a == "--mode") o.mode = next();
    else if (a == "--reduced") o.reduced = true;
    else if (a == "--rows") o.rows = std::stoll(next());
    else if (a == "--cols") o.cols = std::stoll(next());
    else {
      std::printf("usage: %s [--op quantize|dequantize|grouped|joint|hadamard|permute|swiglu|codec] [--format nvfp4|mxfp8|fp8]\n"
                  "          [--only SUBSTR] [--seed S] [--reduced] [--mode test|perf] [--rows R --cols C]\n", argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  try {
    if (o.mode == "perf") return bench_main(o);
    test_codec(o);
    test_quantize(o);
    test_grouped(o);
    test_joint(o);
    test_hadamard(o);
    test_fused(o);
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    ++g_fail;
  }
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

int bench_main(const Options& o) {
  std::vector<BenchRow> rows = bench_quantize_cuda(o.rows, o.cols, o.op.empty() ? o.only : o.op);
  std::printf("%s", format_bench_table(rows).c_str());
  std::printf("%zu passed, 0 failed\n", rows.size());
  return 0;
}
