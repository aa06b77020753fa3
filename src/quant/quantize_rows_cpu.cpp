// The fast CPU rowwise quantizer (quantize_rows_cpu.h): the row kernels run over a tensor,
// parallel over rows (or 16-row tiles) with a static split, so every byte depends only on its own
// row's inputs and never on the thread count. Outer statistics follow the reference exactly,
// including the rare all-NaN domain, whose stored NVFP4 amax is the reference's own result.
#include "quantize_rows_cpu.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "lockstep/numerics/block_rules.h"
#include "quantize_cpu.h"
#include "quantize_cpu_detail.h"
#include "quantize_meta.h"

namespace lockstep::cpu {
namespace {

using namespace detail;

// Calls fn(p) with p at row r of x as bf16 bits (const uint16_t*) or fp32 values (const float*);
// F16 rows (nrows of them) are widened exactly into `buf` first.
template <class Fn>
auto with_rows(const Tensor& x, int64_t r, int64_t nrows, std::vector<float>& buf, Fn&& fn) {
  const int64_t cols = x.cols();
  if (x.dtype() == DType::kBF16) return fn(x.ptr<uint16_t>() + r * cols);
  if (x.dtype() == DType::kF32) return fn(x.ptr<float>() + r * cols);
  const uint16_t* h = x.ptr<uint16_t>() + r * cols;  // F16
  buf.resize(size_t(nrows * cols));
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = num::f16_to_f32(h[i]);
  return fn(static_cast<const float*>(buf.data()));
}

// The amax (CONTRACT.md section 0) a largest key stands for, over rows [r0, r1) of x. A set of
// only NaN takes the reference's own result, since its payload is what NVFP4 stores: amax_of
// (sequential) for one row's domain, amax_rows for a tensor's or a group's.
float amax_from_key(const Tensor& x, uint32_t key, int64_t r0, int64_t r1, bool one_row) {
  if ((r1 - r0) * x.cols() == 0) return 0.0f;
  if (key != 0) return num::f32_from_bits(key - 1);
  std::vector<float> storage;
  const MatrixF32 m = as_matrix(x.slice_rows(r0, r1), storage, "tensor");
  return one_row ? amax_of(m.values.data(), m.cols) : amax_rows(m, 0, m.rows);
}

// The amax of each outer domain of a per_tensor / per_group scaling: one key per row (parallel),
// then the largest per domain.
std::vector<float> domain_amaxes(const Tensor& x, std::span<const int64_t> offsets, Scaling s) {
  const int64_t rows = x.rows(), cols = x.cols();
  std::vector<uint32_t> keys(static_cast<size_t>(rows));
#pragma omp parallel
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      keys[size_t(r)] =
          with_rows(x, r, 1, buf, [&](const auto* p) { return rows::row_amax_key(p, cols); });
  }
  std::vector<int64_t> bounds = {0, rows};
  if (s == Scaling::kPerGroup) bounds.assign(offsets.begin(), offsets.end());
  std::vector<float> amax;
  for (size_t d = 0; d + 1 < bounds.size(); ++d) {
    uint32_t key = 0;
    for (int64_t r = bounds[d]; r < bounds[d + 1]; ++r) key = std::max(key, keys[size_t(r)]);
    amax.push_back(amax_from_key(x, key, bounds[d], bounds[d + 1], false));
  }
  return amax;
}

// Stores one row's compact scale codes (cols of them) into row r of a copy's block scales.
void store_scale_row(const ScaleView& sc, ScaleLayout layout, int64_t r, const uint8_t* codes,
                     int64_t cols) {
  if (layout == ScaleLayout::kCompact) {
    std::copy(codes, codes + cols, sc.p + r * cols);
    return;
  }
  for (int64_t j = 0; j < cols; ++j) sc.store(r, j, codes[j]);
}

// Encodes x in units of `unit` consecutive rows, in parallel over units with a fixed split: each
// thread keeps a widening buffer and nb scale codes per row; encode(first_row, rows_ptr, codes)
// writes the unit's data and its codes and returns its non-finite count, then the codes go to
// every row of the unit in the copy's scale layout. Returns the total non-finite count.
template <class Encode>
int64_t encode_units(const Tensor& x, int64_t unit, int64_t nb, const ScaleView& sc,
                     ScaleLayout layout, Encode encode) {
  int64_t nonfinite = 0;
#pragma omp parallel reduction(+ : nonfinite)
  {
    std::vector<float> buf;
    std::vector<uint8_t> codes(static_cast<size_t>(nb));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < x.rows() / unit; ++t) {
      const int64_t r0 = t * unit;
      nonfinite += int64_t(
          with_rows(x, r0, unit, buf, [&](const auto* p) { return encode(r0, p, codes.data()); }));
      for (int64_t r = r0; r < r0 + unit; ++r) store_scale_row(sc, layout, r, codes.data(), nb);
    }
  }
  return nonfinite;
}

int64_t nvfp4(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
              std::span<const float> given_amax, QData& q) {
  const int64_t rows = x.rows(), cols = x.cols(), nb = cols / 16;
  const bool per_row = cfg.scaling == Scaling::kPerRow;
  std::vector<float> amax;
  if (!given_amax.empty())
    amax.assign(given_amax.begin(), given_amax.end());
  else
    amax = per_row ? std::vector<float>(size_t(rows)) : domain_amaxes(x, offsets, cfg.scaling);
  const std::vector<int64_t> dom = row_domains(rows, offsets, cfg.scaling);
  std::vector<num::TwoLevelOuter> outer(amax.size());
  for (size_t d = 0; d < amax.size() && !per_row; ++d)
    outer[d] = num::two_level_outer(amax[d], num::kE2M1Max);
  q.data = Tensor::empty(DType::kU8, {rows, cols / 2});  // every byte written below
  alloc_scales(q, rows, nb, cfg.scale_layout);
  const ScaleView sc = scale_access(q, cfg.scale_layout);
  uint8_t* data = q.data.ptr<uint8_t>();
  int64_t nonfinite = 0;
  if (cfg.block2d) {
    nonfinite = encode_units(x, 16, nb, sc, cfg.scale_layout,
                             [&](int64_t r0, const auto* p, uint8_t* codes) {
                               const num::TwoLevelOuter& o = outer[size_t(dom[size_t(r0)])];
                               return rows::nvfp4_tile_rows(p, cols, o.s_enc_x_inv_max, o.s_dec,
                                                            codes, data + r0 * (cols / 2));
                             });
  } else {
    nonfinite =
        encode_units(x, 1, nb, sc, cfg.scale_layout, [&](int64_t r, const auto* p, uint8_t* codes) {
          num::TwoLevelOuter o;
          if (per_row) {
            amax[size_t(r)] = amax_from_key(x, rows::row_amax_key(p, cols), r, r + 1, true);
            o = num::two_level_outer(amax[size_t(r)], num::kE2M1Max);
          } else {
            o = outer[size_t(dom[size_t(r)])];
          }
          return rows::nvfp4_row(p, cols, o.s_enc_x_inv_max, o.s_dec, codes, data + r * (cols / 2));
        });
  }
  q.amax = host_f32(amax, {int64_t(amax.size())});
  return nonfinite;
}

int64_t mxfp8(const Tensor& x, const QuantConfig& cfg, QData& q) {
  const int64_t rows = x.rows(), cols = x.cols(), nb = cols / 32;
  const bool e5m2 = cfg.elem == ElemCodec::kE5M2;
  const float inv_max = num::div_rn(1.0f, elem_max(cfg.format, cfg.elem));
  q.data = Tensor::empty(DType::kU8, {rows, cols});
  alloc_scales(q, rows, nb, cfg.scale_layout);
  const ScaleView sc = scale_access(q, cfg.scale_layout);
  uint8_t* data = q.data.ptr<uint8_t>();
  return encode_units(x, 1, nb, sc, cfg.scale_layout,
                      [&](int64_t r, const auto* p, uint8_t* codes) {
                        return rows::mxfp8_row(p, cols, e5m2, inv_max, codes, data + r * cols);
                      });
}

int64_t fp8(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg, QData& q) {
  const int64_t rows = x.rows(), cols = x.cols();
  const bool e5m2 = cfg.elem == ElemCodec::kE5M2;
  const float emax = elem_max(cfg.format, cfg.elem), type_max = source_type_max(x.dtype());
  auto scale_of = [&](float a) { return num::fp8_scale(a, emax, cfg.eps, type_max, cfg.pow2); };
  q.data = Tensor::empty(DType::kU8, {rows, cols});
  uint8_t* data = q.data.ptr<uint8_t>();
  // One scale per domain (per_tensor, per_group), or per block of bc columns of each row
  // (block_1x128: 128; per_row: the whole row).
  const bool per_domain = cfg.scaling == Scaling::kPerTensor || cfg.scaling == Scaling::kPerGroup;
  std::vector<float> scale, inv;
  int64_t nbc = 1, bc = std::max<int64_t>(cols, 1);
  if (per_domain) {
    for (float a : domain_amaxes(x, offsets, cfg.scaling)) {
      scale.push_back(scale_of(a));
      inv.push_back(num::fp8_scale_inv(scale.back()));
    }
    q.scale_rows = int64_t(inv.size());
  } else {
    if (cfg.scaling == Scaling::kBlock1x128) bc = 128, nbc = (cols + 127) / 128;
    inv.assign(size_t(rows * nbc), 0.0f);
    q.scale_rows = rows;
  }
  q.scale_cols = per_domain ? 1 : nbc;
  const std::vector<int64_t> dom = row_domains(rows, offsets, cfg.scaling);
  int64_t nonfinite = 0;
#pragma omp parallel reduction(+ : nonfinite)
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      nonfinite += int64_t(with_rows(x, r, 1, buf, [&](const auto* p) {
        uint64_t n = 0;
        if (per_domain)
          return rows::fp8_scaled(p, cols, scale[size_t(dom[size_t(r)])], e5m2, data + r * cols);
        for (int64_t b = 0; b < nbc; ++b) {
          const int64_t c0 = b * bc, len = std::min(cols, c0 + bc) - c0;
          const uint32_t key = rows::row_amax_key(p + c0, len);
          const float s = scale_of(len == 0   ? 0.0f
                                   : key == 0 ? num::amax_empty()
                                              : num::f32_from_bits(key - 1));
          inv[size_t(r * nbc + b)] = num::fp8_scale_inv(s);
          n += rows::fp8_scaled(p + c0, len, s, e5m2, data + r * cols + c0);
        }
        return n;
      }));
    }
  }
  q.scale_inv = host_f32(inv, {q.scale_rows, q.scale_cols});
  return nonfinite;
}

}  // namespace

bool rows_path_applies(const Tensor& x, const QuantConfig& cfg) {
  if (!x.is_cpu() || x.dim() != 2 || !x.is_contiguous() || !cfg.rowwise || cfg.colwise ||
      cfg.stochastic || cfg.hadamard)
    return false;
  if (x.dtype() != DType::kF32 && x.dtype() != DType::kBF16 && x.dtype() != DType::kF16)
    return false;
  switch (cfg.format) {
    case Format::kNvfp4:
      return cfg.scaling == Scaling::kPerTensor || cfg.scaling == Scaling::kPerRow ||
             cfg.scaling == Scaling::kPerGroup;
    case Format::kMxfp8:
      return cfg.scaling == Scaling::kBlock1x32;
    case Format::kFp8:
      return cfg.scaling == Scaling::kPerTensor || cfg.scaling == Scaling::kPerRow ||
             cfg.scaling == Scaling::kPerGroup || cfg.scaling == Scaling::kBlock1x128;
    default:
      return false;
  }
}

QTensor quantize_rows(const Tensor& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                      int64_t& nonfinite, std::span<const float> given_amax) {
  if (!given_amax.empty() && (cfg.format != Format::kNvfp4 || cfg.scaling == Scaling::kPerRow))
    throw QuantError("quantize_rows: a given amax applies to nvfp4 per_tensor / per_group only");
  QTensor q = quantized_meta(cfg, x.rows(), x.cols(), offsets);
  switch (cfg.format) {
    case Format::kNvfp4:
      nonfinite = nvfp4(x, offsets, cfg, given_amax, q.rowwise);
      break;
    case Format::kMxfp8:
      nonfinite = mxfp8(x, cfg, q.rowwise);
      break;
    case Format::kFp8:
      nonfinite = fp8(x, offsets, cfg, q.rowwise);
      break;
    default:
      throw QuantError(
          fmt::format("format {} has no fast CPU row quantizer", format_name(cfg.format)));
  }
  return q;
}

}  // namespace lockstep::cpu
