// CPU reference quantizer entry: the rowwise copy and the columnwise copy of CONTRACT.md
// section 12. NVFP4 1-D blocks, FP8 1x128 and FP8 per_row columnwise copies are the quantization
// of X^T (per group for grouped buffers); NVFP4 2-D, FP8 per_tensor, per_group and 128x128 ones are
// the transpose of the rowwise copy; MXFP8's is its blocks-down-columns copy (section 3).
#include <fmt/format.h>

#include <algorithm>

#include "lockstep/numerics/block_rules.h"
#include "quantize_cpu.h"
#include "quantize_cpu_detail.h"
#include "quantize_meta.h"

namespace lockstep::cpu {
namespace {
using namespace detail;

// Whether the columnwise copy is the transpose of the rowwise copy (same blocks, same scales).
bool colwise_is_transpose(const QuantConfig& cfg) {
  if (cfg.format == Format::kNvfp4) return cfg.block2d;
  if (cfg.format == Format::kFp8)
    return cfg.scaling == Scaling::kPerTensor || cfg.scaling == Scaling::kPerGroup ||
           cfg.scaling == Scaling::kBlock128x128;
  return false;
}

std::vector<int64_t> groups_of(std::span<const int64_t> offsets, int64_t rows) {
  if (offsets.empty()) return {0, rows};
  return {offsets.begin(), offsets.end()};
}

// Appends the bytes of a host tensor to a byte vector.
template <class T>
void append(std::vector<T>& out, const Tensor& t) {
  if (!t.defined()) return;
  auto v = t.data<T>();
  out.insert(out.end(), v.begin(), v.end());
}

// The transposed input of each group (optionally Hadamard-transformed along its rows).
struct TransposedGroups {
  std::vector<std::vector<float>> values;
  std::vector<MatrixF32> mats;
};

TransposedGroups transposed_groups(const MatrixF32& x, const std::vector<int64_t>& groups,
                                   bool hadamard) {
  TransposedGroups t;
  const size_t ng = groups.size() - 1;
  t.values.resize(ng);
  t.mats.resize(ng);
  for (size_t g = 0; g < ng; ++g) {
    const int64_t r0 = groups[g], rg = groups[g + 1] - r0;
    MatrixF32 xg{x.values.subspan(size_t(r0 * x.cols), size_t(rg * x.cols)), rg, x.cols, x.type_max,
                 x.name};
    t.values[g] = transpose(xg);
    MatrixF32 xt{t.values[g], x.cols, rg, x.type_max, x.name + ".T"};
    if (hadamard) {
      t.values[g] = hadamard16_rows(xt);
      xt.values = t.values[g];
    }
    t.mats[g] = xt;
  }
  return t;
}

// The amax (CONTRACT.md section 0) over every element of several matrices.
float amax_of_all(const std::vector<MatrixF32>& mats) {
  float acc = num::amax_empty();
  int64_t n = 0;
  for (const MatrixF32& m : mats) {
    if (m.rows * m.cols == 0) continue;
    acc = num::fmax_f32(acc, amax_rows(m, 0, m.rows));
    n += m.rows * m.cols;
  }
  return n == 0 ? 0.0f : acc;
}

// Columnwise copy as the quantization of each group's X_g^T (NVFP4 1-D, FP8 1x128, FP8 per_row).
QData quantize_transposed(const MatrixF32& x, std::span<const int64_t> offsets,
                          const QuantConfig& cfg, const float* joint_amax) {
  const std::vector<int64_t> groups = groups_of(offsets, x.rows);
  const bool grouped = !offsets.empty();
  const TransposedGroups tg = transposed_groups(x, groups, cfg.hadamard);
  QuantConfig piece_cfg = cfg;
  if (grouped) piece_cfg.scale_layout = ScaleLayout::kCompact;
  float tensor_amax = 0.0f;
  if (cfg.format == Format::kNvfp4 && cfg.scaling == Scaling::kPerTensor)
    tensor_amax = joint_amax ? *joint_amax : amax_of_all(tg.mats);
  std::vector<uint8_t> data, scales;
  std::vector<float> amax, scale_inv;
  QData out;
  for (size_t g = 0; g + 1 < groups.size(); ++g) {
    const MatrixF32& xt = tg.mats[g];
    const uint64_t base = uint64_t(x.cols * groups[g]);
    QData piece;
    if (cfg.format == Format::kNvfp4) {
      std::vector<float> a;
      std::vector<int64_t> dom(size_t(xt.rows), 0);
      if (cfg.scaling == Scaling::kPerRow) {
        a = domain_amax(xt, {}, Scaling::kPerRow);
        for (int64_t r = 0; r < xt.rows; ++r) dom[size_t(r)] = r;
      } else if (cfg.scaling == Scaling::kPerGroup) {
        a = {amax_rows(xt, 0, xt.rows)};
      } else {
        a = {tensor_amax};
      }
      nvfp4_rows(xt, piece_cfg, a, dom, base, piece);
      // per_tensor: one A for every group, stored once.
      if (cfg.scaling != Scaling::kPerTensor || g == 0) append(amax, piece.amax);
    } else {
      fp8_rows(xt, {}, piece_cfg, base, piece);
      append(scale_inv, piece.scale_inv);
    }
    append(data, piece.data);
    append(scales, piece.block_scale);
    if (!grouped) {
      out = piece;
      if (cfg.format == Format::kNvfp4) out.amax = host_f32(amax, {int64_t(amax.size())});
      return out;
    }
  }
  out.data = Tensor::from_vector<uint8_t>(data, {int64_t(data.size())}, DType::kU8);
  if (!scales.empty() || cfg.format == Format::kNvfp4)
    out.block_scale = Tensor::from_vector<uint8_t>(scales, {int64_t(scales.size())}, DType::kU8);
  if (cfg.format == Format::kNvfp4) out.amax = host_f32(amax, {int64_t(amax.size())});
  if (cfg.format == Format::kFp8) out.scale_inv = host_f32(scale_inv, {int64_t(scale_inv.size())});
  out.scale_rows = x.cols;
  out.scale_cols = 0;  // per group: see QTensor::colwise and group_view()
  return out;
}

// Columnwise copy as the transpose of the rowwise copy (NVFP4 2-D, FP8 per_tensor / per_group /
// 128x128), per group for grouped buffers.
QData transpose_rowwise(const QData& r, const QTensor& q, std::span<const int64_t> offsets) {
  const std::vector<int64_t> groups = groups_of(offsets, q.rows);
  const bool grouped = !offsets.empty();
  const bool fp4 = q.format == Format::kNvfp4;
  const int64_t rows = q.rows, cols = q.cols;
  const uint8_t* src = r.data.ptr<uint8_t>();
  std::vector<uint8_t> data(size_t(fp4 ? rows * cols / 2 : rows * cols), 0);
  std::vector<uint8_t> scales;
  std::vector<float> scale_inv;
  for (size_t g = 0; g + 1 < groups.size(); ++g) {
    const int64_t r0 = groups[g], rg = groups[g + 1] - r0;
    uint8_t* dst = data.data() + (fp4 ? cols * r0 / 2 : cols * r0);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t rr = 0; rr < rg; ++rr) {
        const int64_t i = (r0 + rr) * cols + c;
        if (fp4) {
          const uint8_t code = (i % 2 == 0) ? (src[i / 2] & 0xF) : (src[i / 2] >> 4);
          const int64_t o = c * rg + rr;
          dst[o / 2] = uint8_t(dst[o / 2] | (o % 2 == 0 ? code : code << 4));
        } else {
          dst[c * rg + rr] = src[i];
        }
      }
    if (fp4) {  // the 16x16 tile (r/16, c/16) scales the transposed block (c, r/16)
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t j = 0; j < rg / 16; ++j)
          scales.push_back(load_scale(r, q.scale_layout, r0 + j * 16, c / 16));
    } else if (q.scaling == Scaling::kBlock128x128) {
      const float* si = r.scale_inv.ptr<float>();
      const int64_t nbc = r.scale_cols, tr0 = r0 / 128, ntr = (rg + 127) / 128;
      for (int64_t bj = 0; bj < nbc; ++bj)
        for (int64_t bi = 0; bi < ntr; ++bi) scale_inv.push_back(si[(tr0 + bi) * nbc + bj]);
    }
  }
  QData out;
  if (!grouped) {
    out.data = Tensor::from_vector<uint8_t>(data, {cols, fp4 ? rows / 2 : rows}, DType::kU8);
    if (fp4) {
      out.scale_rows = cols;
      out.scale_cols = rows / 16;
      if (q.scale_layout == ScaleLayout::kSwizzled) {
        const std::vector<uint8_t> sw = swizzle_scales(scales, cols, rows / 16);
        out.block_scale = Tensor::from_vector<uint8_t>(sw, {int64_t(sw.size())}, DType::kU8);
      } else {
        out.block_scale = Tensor::from_vector<uint8_t>(scales, {cols, rows / 16}, DType::kU8);
      }
      out.amax = r.amax;
    } else if (q.scaling == Scaling::kBlock128x128) {
      out.scale_rows = r.scale_cols;
      out.scale_cols = r.scale_rows;
      out.scale_inv = host_f32(scale_inv, {out.scale_rows, out.scale_cols});
    } else {
      out.scale_rows = r.scale_rows;
      out.scale_cols = r.scale_cols;
      out.scale_inv = r.scale_inv;
    }
    return out;
  }
  out.data = Tensor::from_vector<uint8_t>(data, {int64_t(data.size())}, DType::kU8);
  out.scale_rows = cols;
  out.scale_cols = 0;
  if (fp4) {
    out.block_scale = Tensor::from_vector<uint8_t>(scales, {int64_t(scales.size())}, DType::kU8);
    out.amax = r.amax;
  } else if (q.scaling == Scaling::kBlock128x128) {
    out.scale_inv = host_f32(scale_inv, {int64_t(scale_inv.size())});
  } else {
    out.scale_inv = r.scale_inv.view({r.scale_inv.numel()});
  }
  return out;
}

}  // namespace

float nvfp4_tensor_amax(const MatrixF32& x, std::span<const int64_t> offsets, bool hadamard,
                        Copy copy) {
  if (copy == Copy::kRowwise) {
    if (!hadamard) return amax_rows(x, 0, x.rows);
    const std::vector<float> h = hadamard16_rows(x);
    return amax_of(h.data(), int64_t(h.size()));
  }
  return amax_of_all(transposed_groups(x, groups_of(offsets, x.rows), hadamard).mats);
}

QTensor quantize(const MatrixF32& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
                 const float* joint_amax, const float* joint_amax_col) {
  QTensor q = quantized_meta(cfg, x.rows, x.cols, offsets);
  const bool transpose_col = cfg.colwise && colwise_is_transpose(cfg);
  if (cfg.rowwise || transpose_col) {
    std::vector<float> rotated;
    MatrixF32 xr = x;
    if (cfg.hadamard) {
      rotated = hadamard16_rows(x);
      xr.values = rotated;
    }
    switch (cfg.format) {
      case Format::kNvfp4: {
        const std::vector<float> amax =
            joint_amax ? std::vector<float>{*joint_amax} : domain_amax(xr, offsets, cfg.scaling);
        const std::vector<int64_t> dom = row_domains(x.rows, offsets, cfg.scaling);
        nvfp4_rows(xr, cfg, amax, dom, 0, q.rowwise);
        break;
      }
      case Format::kMxfp8:
        mxfp8_rows(xr, cfg, q.rowwise);
        break;
      case Format::kFp8:
        fp8_rows(xr, offsets, cfg, 0, q.rowwise);
        break;
      default:
        throw QuantError(
            fmt::format("format {} is not a quantized format", format_name(cfg.format)));
    }
  }
  if (cfg.colwise) {
    if (cfg.format == Format::kMxfp8)
      mxfp8_cols(x, cfg, q.colwise);
    else if (transpose_col)
      q.colwise = transpose_rowwise(q.rowwise, q, offsets);
    else
      q.colwise = quantize_transposed(x, offsets, cfg, joint_amax_col);
  }
  if (!cfg.rowwise) q.rowwise = QData{};
  return q;
}

}  // namespace lockstep::cpu
