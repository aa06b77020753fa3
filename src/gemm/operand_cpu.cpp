// Validation and exact decoding of GEMM operands into inner values, per-row outer scales and FP8
// chunk scales (include/lockstep/gemm/operand.h). The codecs and scale rules come from numerics/;
// nothing here rounds except the bf16 cast of dense operands.
#include <fmt/format.h>

#include "lockstep/gemm/operand.h"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"

namespace lockstep {
namespace {

uint8_t load_block_scale(const QTensor& q, int64_t r, int64_t c) {
  if (q.scale_layout == ScaleLayout::kCompact) return q.block_scale[size_t(r * q.scale_cols + c)];
  return q.block_scale[size_t(swizzled_offset(r, c, round_up(q.scale_cols, 4)))];
}

// The outer-scale domain of row r: per_tensor 0, per_row r, per_group the group holding r.
int64_t domain_of(const QTensor& q, int64_t r) {
  if (q.scaling == Scaling::kPerRow) return r;
  if (q.scaling == Scaling::kPerGroup) {
    for (size_t g = 0; g + 1 < q.group_offsets.size(); ++g)
      if (r < q.group_offsets[g + 1]) return int64_t(g);
  }
  return 0;
}

int64_t domain_count(const QTensor& q) {
  if (q.scaling == Scaling::kPerRow) return q.rows;
  if (q.scaling == Scaling::kPerGroup) return int64_t(q.group_offsets.size()) - 1;
  return 1;
}

void check_sizes(const GemmOperand& op) {
  const QTensor& q = *op.q;
  auto bad = [&](const std::string& why) { throw GemmError(fmt::format("operand {}: {}", op.describe(), why)); };
  if (q.rows < 0 || q.cols < 0) bad("negative shape");
  const int64_t n = q.rows * q.cols;
  auto want_scales = [&](int64_t srows, int64_t scols) {
    const size_t need = q.scale_layout == ScaleLayout::kCompact
                            ? size_t(srows * scols)
                            : size_t(round_up(srows, 128) * round_up(scols, 4));
    if (q.scale_rows != srows || q.scale_cols != scols || q.block_scale.size() != need)
      bad(fmt::format("block scales [{}, {}] ({} bytes) do not match the shape (want [{}, {}])", q.scale_rows,
                      q.scale_cols, q.block_scale.size(), srows, scols));
  };
  if (q.scaling == Scaling::kPerGroup) {
    if (q.group_offsets.size() < 2 || q.group_offsets.front() != 0 || q.group_offsets.back() != q.rows)
      bad("per_group scaling needs group offsets from 0 to rows");
  }
  switch (q.format) {
    case Format::kNvfp4:
      if (q.cols % 16 != 0) bad("nvfp4 needs K % 16 == 0 (blocks of 16 along K)");
      if (q.data.size() != size_t(n / 2)) bad("packed data size does not match the shape");
      want_scales(q.rows, q.cols / 16);
      if (int64_t(q.amax.size()) != domain_count(q)) bad(fmt::format("{} amax values for {} domains", q.amax.size(), domain_count(q)));
      break;
    case Format::kMxfp8:
      if (!q.has_rowwise || q.data.size() != size_t(n))
        bad("mxfp8 GEMM operands need the rowwise copy (blocks of 32 along K)");
      if (q.cols % 32 != 0) bad("mxfp8 needs K % 32 == 0 (blocks of 32 along K)");
      want_scales(q.rows, q.cols / 32);
      break;
    case Format::kFp8: {
      if (q.data.size() != size_t(n)) bad("data size does not match the shape");
      int64_t sr = domain_count(q), sc = 1;
      if (q.scaling == Scaling::kBlock1x128 || q.scaling == Scaling::kBlock128x128) {
        if (q.cols % kGemmChunk != 0)
          bad("fp8 block scaling needs K % 128 == 0 in a GEMM (one fp32 scale per 128-wide k chunk); pad K");
        sr = q.scaling == Scaling::kBlock1x128 ? q.rows : (q.rows + 127) / 128;
        sc = q.cols / kGemmChunk;
      } else if (q.scaling == Scaling::kBlock1x32) {
        bad("fp8 does not take block_1x32");
      }
      if (int64_t(q.scale_inv.size()) != sr * sc)
        bad(fmt::format("{} scale_inv values, want {} x {}", q.scale_inv.size(), sr, sc));
      break;
    }
    case Format::kCount: bad("unknown format");
  }
}

}  // namespace

GemmFormat GemmOperand::format() const {
  if (!q) return GemmFormat::kBf16;
  switch (q->format) {
    case Format::kFp8: return GemmFormat::kFp8;
    case Format::kMxfp8: return GemmFormat::kMxfp8;
    default: return GemmFormat::kNvfp4;
  }
}

std::string GemmOperand::describe() const {
  if (!q) return fmt::format("'{}' [{}, {}] bf16", name, rows, cols);
  return fmt::format("'{}' [{}, {}] {} {}", name, q->rows, q->cols, format_name(q->format), scaling_name(q->scaling));
}

DecodedOperand decode_gemm_operand(const GemmOperand& op, int64_t row0, int64_t count) {
  DecodedOperand d;
  d.rows = count;
  d.cols = op.n_cols();
  if (row0 < 0 || count < 0 || row0 + count > op.n_rows())
    throw GemmError(fmt::format("operand {}: rows [{}, {}) out of range", op.describe(), row0, row0 + count));
  const int64_t K = d.cols;
  d.inner.resize(size_t(count * K));
  d.outer.assign(size_t(count), 1.0f);
  if (!op.q) {
    if (op.rows < 0 || op.cols < 0 || int64_t(op.dense.size()) != op.rows * op.cols)
      throw GemmError(fmt::format("operand {}: {} values do not match the shape", op.describe(), op.dense.size()));
    const float* src = op.dense.data() + row0 * K;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count * K; ++i) d.inner[size_t(i)] = num::bf16_to_f32(num::f32_to_bf16(src[i]));
    return d;
  }
  check_sizes(op);
  const QTensor& q = *op.q;
  const num::MiniFloat f = q.elem == ElemCodec::kE5M2 ? num::kE5M2 : num::kE4M3;
  switch (q.format) {
    case Format::kNvfp4: {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = row0 + i;
        d.outer[size_t(i)] = num::two_level_outer(q.amax[size_t(domain_of(q, r))], num::kE2M1Max).s_dec;
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t byte = q.data[size_t((r * K + k) / 2)];
          const uint8_t code = k % 2 == 0 ? (byte & 0xF) : (byte >> 4);
          // Exact: a 2-bit times a 4-bit significand, magnitude in [2^-10, 2688].
          d.inner[size_t(i * K + k)] = num::mul_rn(num::decode_e2m1(code), num::decode_e4m3(load_block_scale(q, r, k / 16)));
        }
      }
      break;
    }
    case Format::kMxfp8: {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = row0 + i;
        for (int64_t k = 0; k < K; ++k)
          // Exact for e <= 246 (|inner| < 2^128; larger e may overflow to inf); e = 0xFF is NaN.
          d.inner[size_t(i * K + k)] = num::mx_dequant(num::decode_minifloat(f, q.data[size_t(r * K + k)]), load_block_scale(q, r, k / 32));
      }
      break;
    }
    case Format::kFp8: {
      const bool block = q.scaling == Scaling::kBlock1x128 || q.scaling == Scaling::kBlock128x128;
      if (block) {
        d.chunked = true;
        d.chunks = K / kGemmChunk;
        d.chunk_scale.resize(size_t(count * d.chunks));
      }
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = row0 + i;
        for (int64_t k = 0; k < K; ++k) d.inner[size_t(i * K + k)] = num::decode_minifloat(f, q.data[size_t(r * K + k)]);
        if (!block) {
          d.outer[size_t(i)] = q.scale_inv[size_t(domain_of(q, r))];
        } else {
          const int64_t sr = q.scaling == Scaling::kBlock1x128 ? r : r / 128;
          for (int64_t c = 0; c < d.chunks; ++c)
            d.chunk_scale[size_t(i * d.chunks + c)] = q.scale_inv[size_t(sr * d.chunks + c)];
        }
      }
      break;
    }
    case Format::kCount: break;
  }
  return d;
}

}  // namespace lockstep
