// CPU reference quantizers and dequantizers: NVFP4 (1-D and 2-D blocks; per-tensor, per-row,
// per-group and joint outer domains), MXFP8 (rowwise, columnwise), FP8 with fp32 scales, with
// optional stochastic rounding and Hadamard transform. Parallel over rows with OpenMP; every
// output byte depends only on its own inputs, never on the thread count.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/fast_codecs.h"
#include "lockstep/numerics/hadamard.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/quant/layout.h"
#include "lockstep/quant/quantize.h"

namespace lockstep {
namespace {

using num::MiniFloat;

const MiniFloat& elem_codec(const QuantSpec& spec) {
  if (spec.format == Format::kNvfp4) return num::kE2M1;
  return spec.elem == ElemCodec::kE5M2 ? num::kE5M2 : num::kE4M3;
}

float elem_max(const QuantSpec& spec) {
  if (spec.format == Format::kNvfp4) return num::kE2M1Max;
  return spec.elem == ElemCodec::kE5M2 ? num::kE5M2Max : num::kE4M3Max;
}

// Encode one scaled element: RNE, or stochastic with the element's Philox word.
inline uint8_t encode_elem(const MiniFloat& f, const QuantSpec& spec, float v, uint64_t index) {
  if (spec.stochastic)
    return num::encode_minifloat_stochastic(f, v, num::philox_element_word(spec.seed, spec.stream, index));
  // The wire formats through their named codecs, which the compiler specialises (the generic
  // encoder with a runtime format costs ~10x more); E2M1 through encode_e2m1_arith, equal to
  // encode_e2m1 on every fp32 input (tests/test_numerics.cpp, lockstep_test_backend --op codec).
  if (f.e_bits == 2 && f.m_bits == 1) return uint8_t(num::encode_e2m1_arith(v));
  if (f.e_bits == 4 && f.m_bits == 3) return num::encode_e4m3(v);
  if (f.e_bits == 5 && f.m_bits == 2) return num::encode_e5m2(v);
  return num::encode_minifloat(f, v);
}

float amax_finish(float acc, int64_t count) { return count == 0 ? 0.0f : acc; }

float amax_of(const float* p, int64_t n) {
  float acc = num::amax_empty();
  for (int64_t i = 0; i < n; ++i) acc = num::amax_fold(acc, p[i]);
  return amax_finish(acc, n);
}

// amax over rows [r0, r1) of a [*, cols] matrix; parallel, order-independent.
float amax_rows(const MatrixF32& x, int64_t r0, int64_t r1) {
  const int64_t n = (r1 - r0) * x.cols;
  if (n == 0) return 0.0f;
  const float* base = x.values.data() + r0 * x.cols;
  std::vector<float> partial(size_t(omp_get_max_threads()), num::amax_empty());
#pragma omp parallel
  {
    float acc = num::amax_empty();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) acc = num::amax_fold(acc, base[i]);
    partial[size_t(omp_get_thread_num())] = acc;
  }
  float acc = num::amax_empty();
  for (float p : partial) acc = num::fmax_f32(acc, p);
  return acc;  // n > 0, so the sentinel survives only if every element was NaN (-> NaN)
}

struct QuantShape {
  const std::string& name;
  int64_t rows, cols;
};
std::string where(const QuantShape& x) { return fmt::format("tensor '{}' [{}, {}]", x.name, x.rows, x.cols); }
std::string where(const MatrixF32& x) { return where(QuantShape{x.name, x.rows, x.cols}); }

}  // namespace

void validate_quant_input(const std::string& name, int64_t rows, int64_t cols, std::span<const int64_t> offsets,
                          const QuantSpec& spec) {
  const QuantShape x{name, rows, cols};
  if (x.rows < 0 || x.cols < 0) throw QuantError(fmt::format("{}: negative shape", where(x)));
  const auto fmt_name = format_name(spec.format);
  const auto sc_name = scaling_name(spec.scaling);
  auto bad_combo = [&](const char* why) {
    throw QuantError(fmt::format("{}: format {} with scaling {}: {}", where(x), fmt_name, sc_name, why));
  };
  switch (spec.format) {
    case Format::kNvfp4:
      if (spec.scaling != Scaling::kPerTensor && spec.scaling != Scaling::kPerRow && spec.scaling != Scaling::kPerGroup)
        bad_combo("nvfp4 takes per_tensor, per_row or per_group");
      if (x.cols % 16 != 0)
        throw QuantError(fmt::format("{}: nvfp4 needs cols % 16 == 0 (blocks of 16 along the row); pad the tensor", where(x)));
      if (spec.block2d && x.rows % 16 != 0)
        throw QuantError(fmt::format("{}: nvfp4 2-D (16x16) blocks need rows % 16 == 0; pad the tensor", where(x)));
      if (spec.block2d && spec.scaling == Scaling::kPerRow)
        bad_combo("2-D 16x16 blocks span 16 rows, so they cannot use per-row outer scales");
      if (spec.pow2) bad_combo("power-of-two scales are an fp8 option");
      if (spec.colwise) bad_combo("a columnwise copy is an mxfp8 option");
      break;
    case Format::kMxfp8:
      if (spec.scaling != Scaling::kBlock1x32) bad_combo("mxfp8 takes block_1x32 only");
      if (spec.rowwise && x.cols % 32 != 0)
        throw QuantError(fmt::format("{}: mxfp8 rowwise needs cols % 32 == 0 (blocks of 32 along the row); pad the tensor", where(x)));
      if (spec.colwise && x.rows % 32 != 0)
        throw QuantError(fmt::format("{}: mxfp8 columnwise needs rows % 32 == 0 (blocks of 32 down a column); pad the tensor", where(x)));
      if (!spec.rowwise && !spec.colwise) bad_combo("neither a rowwise nor a columnwise copy was asked for");
      if (spec.block2d || spec.pow2) bad_combo("block2d and pow2 do not apply to mxfp8");
      break;
    case Format::kFp8:
      if (spec.scaling == Scaling::kBlock1x32) bad_combo("fp8 takes per_tensor, per_row, per_group, block_1x128 or block_128x128");
      if (spec.block2d || spec.colwise) bad_combo("block2d and colwise do not apply to fp8");
      break;
    case Format::kCount:
      bad_combo("unknown format");
  }
  if (spec.scaling == Scaling::kPerGroup && offsets.empty())
    bad_combo("per_group needs group offsets (a grouped buffer)");
  if (spec.hadamard && x.cols % 16 != 0)
    throw QuantError(fmt::format("{}: the Hadamard transform needs cols % 16 == 0", where(x)));
  if (!offsets.empty()) {
    check_group_offsets(offsets, x.rows);
    int64_t need = 1;
    if (spec.format == Format::kNvfp4 && spec.block2d) need = 16;
    if (spec.format == Format::kMxfp8 && spec.colwise) need = 32;
    if (spec.format == Format::kFp8 && spec.scaling == Scaling::kBlock128x128) need = 128;
    for (size_t g = 0; g + 1 < offsets.size(); ++g)
      if ((offsets[g + 1] - offsets[g]) % need != 0)
        throw QuantError(fmt::format("{}: group {} has {} rows; blocks spanning rows need groups padded to a multiple of {}",
                                     where(x), g, offsets[g + 1] - offsets[g], need));
  }
}

namespace {

void validate(const MatrixF32& x, std::span<const int64_t> offsets, const QuantSpec& spec) {
  if (int64_t(x.values.size()) != x.rows * x.cols)
    throw QuantError(fmt::format("{}: {} values do not match the shape", where(x), x.values.size()));
  validate_quant_input(x.name, x.rows, x.cols, offsets, spec);
}

// Maps each row to its outer-scale domain.
std::vector<int64_t> row_domains(int64_t rows, std::span<const int64_t> offsets, Scaling s) {
  std::vector<int64_t> d(size_t(rows), 0);
  if (s == Scaling::kPerRow) {
    for (int64_t r = 0; r < rows; ++r) d[size_t(r)] = r;
  } else if (s == Scaling::kPerGroup) {
    for (size_t g = 0; g + 1 < offsets.size(); ++g)
      for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) d[size_t(r)] = int64_t(g);
  }
  return d;
}

// Outer amax per domain (per tensor: [1], per row: [rows], per group: [groups]).
std::vector<float> domain_amax(const MatrixF32& x, std::span<const int64_t> offsets, Scaling s) {
  if (s == Scaling::kPerRow) {
    std::vector<float> a(size_t(x.rows));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < x.rows; ++r) a[size_t(r)] = amax_of(x.values.data() + r * x.cols, x.cols);
    return a;
  }
  if (s == Scaling::kPerGroup) {
    std::vector<float> a(offsets.size() - 1);
    for (size_t g = 0; g + 1 < offsets.size(); ++g) a[g] = amax_rows(x, offsets[g], offsets[g + 1]);
    return a;
  }
  return {amax_rows(x, 0, x.rows)};
}

void store_scale(QTensor& q, int64_t r, int64_t c, uint8_t code) {
  if (q.scale_layout == ScaleLayout::kCompact)
    q.block_scale[size_t(r * q.scale_cols + c)] = code;
  else
    q.block_scale[size_t(swizzled_offset(r, c, round_up(q.scale_cols, 4)))] = code;
}

uint8_t load_scale(const QTensor& q, int64_t r, int64_t c) {
  if (q.scale_layout == ScaleLayout::kCompact) return q.block_scale[size_t(r * q.scale_cols + c)];
  return q.block_scale[size_t(swizzled_offset(r, c, round_up(q.scale_cols, 4)))];
}

void alloc_scales(QTensor& q, int64_t srows, int64_t scols, ScaleLayout layout) {
  q.scale_rows = srows;
  q.scale_cols = scols;
  q.scale_layout = layout;
  size_t n = layout == ScaleLayout::kCompact ? size_t(srows * scols) : size_t(round_up(srows, 128) * round_up(scols, 4));
  q.block_scale.assign(n, 0);
}

void quantize_nvfp4(const MatrixF32& x, std::span<const int64_t> offsets, const QuantSpec& spec,
                    const std::vector<float>& amax, QTensor& q) {
  const int64_t rows = x.rows, cols = x.cols, nb = cols / 16;
  q.amax = amax;
  std::vector<num::TwoLevelOuter> outer(amax.size());
  for (size_t d = 0; d < amax.size(); ++d) outer[d] = num::two_level_outer(amax[d], num::kE2M1Max);
  const std::vector<int64_t> dom = row_domains(rows, offsets, spec.scaling);
  q.data.assign(size_t(rows * cols / 2), 0);
  alloc_scales(q, rows, nb, spec.scale_layout);
  const float* xv = x.values.data();

  // Block scales: 1-D blocks of 16 along a row, or 16x16 tiles (the same scale on all 16 rows).
  if (spec.block2d) {
#pragma omp parallel for schedule(static)
    for (int64_t tr = 0; tr < rows / 16; ++tr) {
      const num::TwoLevelOuter& o = outer[size_t(dom[size_t(tr * 16)])];
      for (int64_t j = 0; j < nb; ++j) {
        float acc = num::amax_empty();
        for (int64_t r = tr * 16; r < tr * 16 + 16; ++r)
          for (int64_t c = j * 16; c < j * 16 + 16; ++c) acc = num::amax_fold(acc, xv[r * cols + c]);
        uint8_t s = num::two_level_block_scale(acc, o);
        for (int64_t r = tr * 16; r < tr * 16 + 16; ++r) store_scale(q, r, j, s);
      }
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const num::TwoLevelOuter& o = outer[size_t(dom[size_t(r)])];
      for (int64_t j = 0; j < nb; ++j) store_scale(q, r, j, num::two_level_block_scale(amax_of(xv + r * cols + j * 16, 16), o));
    }
  }
  // Elements.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const num::TwoLevelOuter& o = outer[size_t(dom[size_t(r)])];
    for (int64_t j = 0; j < nb; ++j) {
      const float enc = num::two_level_encode_factor(load_scale(q, r, j), o);
      for (int64_t c = j * 16; c < j * 16 + 16; c += 2) {
        uint64_t i0 = uint64_t(r * cols + c);
        uint8_t lo = encode_elem(num::kE2M1, spec, num::mul_rn(xv[i0], enc), i0);
        uint8_t hi = encode_elem(num::kE2M1, spec, num::mul_rn(xv[i0 + 1], enc), i0 + 1);
        q.data[size_t(i0 / 2)] = uint8_t(lo | (hi << 4));
      }
    }
  }
}

void quantize_mxfp8(const MatrixF32& x, const QuantSpec& spec, QTensor& q) {
  const int64_t rows = x.rows, cols = x.cols;
  const MiniFloat& f = elem_codec(spec);
  const float emax = elem_max(spec);
  const float* xv = x.values.data();
  q.has_rowwise = spec.rowwise;
  if (spec.rowwise) {
    q.data.assign(size_t(rows * cols), 0);
    alloc_scales(q, rows, cols / 32, spec.scale_layout);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols / 32; ++j) {
        const uint8_t e = num::mx_block_exponent(amax_of(xv + r * cols + j * 32, 32), emax);
        store_scale(q, r, j, e);
        const float factor = num::mx_encode_factor(e);
        for (int64_t c = j * 32; c < j * 32 + 32; ++c) {
          uint64_t i = uint64_t(r * cols + c);
          q.data[i] = encode_elem(f, spec, num::mul_rn(xv[i], factor), i);
        }
      }
    }
  }
  if (spec.colwise) {
    // Blocks of 32 down each column; quantized from the input, never from the rowwise copy.
    q.data_colwise.assign(size_t(rows * cols), 0);
    q.block_scale_colwise.assign(size_t(rows / 32 * cols), 0);
#pragma omp parallel for schedule(static)
    for (int64_t br = 0; br < rows / 32; ++br) {
      for (int64_t c = 0; c < cols; ++c) {
        float acc = num::amax_empty();
        for (int64_t r = br * 32; r < br * 32 + 32; ++r) acc = num::amax_fold(acc, xv[r * cols + c]);
        const uint8_t e = num::mx_block_exponent(acc, emax);
        q.block_scale_colwise[size_t(br * cols + c)] = e;
        const float factor = num::mx_encode_factor(e);
        for (int64_t r = br * 32; r < br * 32 + 32; ++r) {
          uint64_t i = uint64_t(r * cols + c);
          q.data_colwise[i] = encode_elem(f, spec, num::mul_rn(xv[i], factor), i);
        }
      }
    }
  }
}

void quantize_fp8(const MatrixF32& x, std::span<const int64_t> offsets, const QuantSpec& spec, QTensor& q) {
  const int64_t rows = x.rows, cols = x.cols;
  const MiniFloat& f = elem_codec(spec);
  const float emax = elem_max(spec);
  const float* xv = x.values.data();
  auto scale_of = [&](float a) { return num::fp8_scale(a, emax, spec.eps, x.type_max, spec.pow2); };
  q.data.assign(size_t(rows * cols), 0);
  // Block geometry of one fp32 scale: br x bc elements.
  int64_t br = rows, bc = cols;
  switch (spec.scaling) {
    case Scaling::kBlock1x128: br = 1, bc = 128; break;
    case Scaling::kBlock128x128: br = 128, bc = 128; break;
    case Scaling::kPerRow: br = 1, bc = std::max<int64_t>(cols, 1); break;
    default: break;
  }
  if (spec.scaling == Scaling::kPerTensor || spec.scaling == Scaling::kPerGroup) {
    std::vector<float> a = domain_amax(x, offsets, spec.scaling);
    const std::vector<int64_t> dom = row_domains(rows, offsets, spec.scaling);
    std::vector<float> scale(a.size());
    q.scale_inv.resize(a.size());
    for (size_t d = 0; d < a.size(); ++d) {
      scale[d] = scale_of(a[d]);
      q.scale_inv[d] = num::fp8_scale_inv(scale[d]);
    }
    q.scale_inv_rows = int64_t(a.size());
    q.scale_inv_cols = 1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float s = scale[size_t(dom[size_t(r)])];
      for (int64_t c = 0; c < cols; ++c) {
        uint64_t i = uint64_t(r * cols + c);
        q.data[i] = encode_elem(f, spec, num::mul_rn(xv[i], s), i);
      }
    }
    return;
  }
  const int64_t nbr = (rows + br - 1) / br;
  const int64_t nbc = spec.scaling == Scaling::kPerRow ? 1 : (cols + bc - 1) / bc;
  q.scale_inv.assign(size_t(nbr * nbc), 0.0f);
  q.scale_inv_rows = nbr;
  q.scale_inv_cols = spec.scaling == Scaling::kPerRow ? 1 : nbc;
#pragma omp parallel for schedule(static)
  for (int64_t bi = 0; bi < nbr; ++bi) {
    const int64_t r0 = bi * br, r1 = std::min(rows, r0 + br);
    for (int64_t bj = 0; bj < nbc; ++bj) {
      const int64_t c0 = bj * bc, c1 = std::min(cols, c0 + bc);
      float acc = num::amax_empty();
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) acc = num::amax_fold(acc, xv[r * cols + c]);
      const float s = scale_of(amax_finish(acc, (r1 - r0) * (c1 - c0)));
      q.scale_inv[size_t(bi * nbc + bj)] = num::fp8_scale_inv(s);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          uint64_t i = uint64_t(r * cols + c);
          q.data[i] = encode_elem(f, spec, num::mul_rn(xv[i], s), i);
        }
    }
  }
}

QTensor quantize_impl(const MatrixF32& x_in, std::span<const int64_t> offsets, const QuantSpec& spec,
                      const float* joint_amax) {
  validate(x_in, offsets, spec);
  std::vector<float> rotated;
  MatrixF32 x = x_in;
  if (spec.hadamard) {
    rotated = hadamard16_rows(x_in);
    x.values = rotated;
  }
  QTensor q;
  q.format = spec.format;
  q.scaling = spec.scaling;
  q.elem = spec.format == Format::kNvfp4 ? ElemCodec::kE4M3 : spec.elem;
  q.block2d = spec.block2d;
  q.rows = x.rows;
  q.cols = x.cols;
  q.group_offsets.assign(offsets.begin(), offsets.end());
  switch (spec.format) {
    case Format::kNvfp4: {
      std::vector<float> amax = joint_amax ? std::vector<float>{*joint_amax} : domain_amax(x, offsets, spec.scaling);
      quantize_nvfp4(x, offsets, spec, amax, q);
      break;
    }
    case Format::kMxfp8: quantize_mxfp8(x, spec, q); break;
    case Format::kFp8: quantize_fp8(x, offsets, spec, q); break;
    case Format::kCount: break;
  }
  return q;
}

}  // namespace

MatrixF32 as_matrix_f32(const Tensor& t, std::vector<float>& storage, const std::string& name) {
  if (t.dim() != 2)
    throw QuantError(fmt::format("tensor '{}' {}: quantization takes 2-D tensors", name, t.describe()));
  MatrixF32 m;
  m.name = name;
  m.rows = t.shape()[0];
  m.cols = t.shape()[1];
  switch (t.dtype()) {
    case DType::kF32: m.type_max = num::kFltMax; break;
    case DType::kBF16: m.type_max = num::kBf16Max; break;
    case DType::kF16: m.type_max = num::kF16Max; break;
    default:
      throw QuantError(fmt::format("tensor '{}' {}: quantization takes F32, BF16 or F16 input", name, t.describe()));
  }
  storage = to_f32(t);
  m.values = storage;
  return m;
}

QTensor quantize(const MatrixF32& x, const QuantSpec& spec) {
  if (spec.scaling == Scaling::kPerGroup)
    throw QuantError(fmt::format("{}: per_group scaling needs a grouped buffer (quantize_grouped)", where(x)));
  return quantize_impl(x, {}, spec, nullptr);
}

QTensor quantize(const Tensor& x, const QuantSpec& spec, const std::string& name) {
  std::vector<float> storage;
  return quantize(as_matrix_f32(x, storage, name), spec);
}

QTensor quantize_grouped(const MatrixF32& x, std::span<const int64_t> offsets, const QuantSpec& spec) {
  if (offsets.empty()) throw QuantError(fmt::format("{}: quantize_grouped needs group offsets", where(x)));
  return quantize_impl(x, offsets, spec, nullptr);
}

std::vector<QTensor> quantize_nvfp4_joint(std::span<const MatrixF32> xs, const QuantSpec& spec) {
  if (spec.format != Format::kNvfp4 || spec.scaling != Scaling::kPerTensor)
    throw QuantError("joint quantization is defined for nvfp4 with per_tensor scaling (one shared amax)");
  // The joint amax is taken over what is quantized, i.e. after the optional Hadamard transform.
  float acc = num::amax_empty();
  int64_t count = 0;
  for (const MatrixF32& x : xs) {
    validate(x, {}, spec);
    float a;
    if (spec.hadamard) {
      std::vector<float> h = hadamard16_rows(x);
      a = amax_of(h.data(), int64_t(h.size()));
    } else {
      a = amax_rows(x, 0, x.rows);
    }
    if (x.rows * x.cols > 0) acc = num::fmax_f32(acc, a);
    count += x.rows * x.cols;
  }
  const float joint = amax_finish(acc, count);
  std::vector<QTensor> out;
  for (const MatrixF32& x : xs) out.push_back(quantize_impl(x, {}, spec, &joint));
  return out;
}

std::vector<float> hadamard16_rows(const MatrixF32& x) {
  if (x.cols % 16 != 0) throw QuantError(fmt::format("{}: the Hadamard transform needs cols % 16 == 0", where(x)));
  std::vector<float> out(x.values.size());
  const int64_t chunks = x.rows * x.cols / 16;
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) num::hadamard16_chunk(x.values.data() + k * 16, out.data() + k * 16);
  return out;
}

std::vector<float> dequantize(const QTensor& q) {
  const int64_t rows = q.rows, cols = q.cols;
  std::vector<float> out(size_t(rows * cols));
  if (q.format == Format::kMxfp8 && !q.has_rowwise) return dequantize_colwise(q);
  const MiniFloat& f = q.elem == ElemCodec::kE5M2 ? num::kE5M2 : num::kE4M3;
  switch (q.format) {
    case Format::kNvfp4: {
      const std::vector<int64_t> dom = row_domains(rows, q.group_offsets, q.scaling);
      std::vector<float> s_dec(q.amax.size());
      for (size_t d = 0; d < q.amax.size(); ++d) s_dec[d] = num::two_level_outer(q.amax[d], num::kE2M1Max).s_dec;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          uint8_t byte = q.data[size_t((r * cols + c) / 2)];
          uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
          out[size_t(r * cols + c)] =
              num::two_level_dequant(num::decode_e2m1(code), load_scale(q, r, c / 16), s_dec[size_t(dom[size_t(r)])]);
        }
      break;
    }
    case Format::kMxfp8:
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          out[size_t(r * cols + c)] = num::mx_dequant(num::decode_minifloat(f, q.data[size_t(r * cols + c)]), load_scale(q, r, c / 32));
      break;
    case Format::kFp8: {
      const std::vector<int64_t> dom = row_domains(rows, q.group_offsets, q.scaling);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          size_t si;
          switch (q.scaling) {
            case Scaling::kBlock1x128: si = size_t(r * q.scale_inv_cols + c / 128); break;
            case Scaling::kBlock128x128: si = size_t(r / 128 * q.scale_inv_cols + c / 128); break;
            case Scaling::kPerRow: si = size_t(r); break;
            default: si = size_t(dom[size_t(r)]); break;
          }
          out[size_t(r * cols + c)] = num::mul_rn(num::decode_minifloat(f, q.data[size_t(r * cols + c)]), q.scale_inv[si]);
        }
      break;
    }
    case Format::kCount: break;
  }
  return out;
}

std::vector<float> dequantize_colwise(const QTensor& q) {
  if (q.format != Format::kMxfp8 || q.data_colwise.empty())
    throw QuantError("dequantize_colwise: the tensor has no mxfp8 columnwise copy");
  const MiniFloat& f = q.elem == ElemCodec::kE5M2 ? num::kE5M2 : num::kE4M3;
  std::vector<float> out(size_t(q.rows * q.cols));
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      size_t i = size_t(r * q.cols + c);
      out[i] = num::mx_dequant(num::decode_minifloat(f, q.data_colwise[i]), q.block_scale_colwise[size_t(r / 32 * q.cols + c)]);
    }
  return out;
}

int64_t count_nonfinite(std::span<const float> values) {
  int64_t n = 0;
  for (float v : values) n += num::is_finite(v) ? 0 : 1;
  return n;
}

}  // namespace lockstep
