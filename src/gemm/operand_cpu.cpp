// Validation and exact decoding of GEMM operand copies into inner values, per-row outer scales and
// FP8 chunk scales (operand.h). The codecs and scale rules come from numerics/; nothing here
// rounds: dense operands are read at their own precision.
#include <fmt/format.h>

#include <algorithm>

#include "../tensor/cpu_parallel.h"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"
#include "operand.h"

namespace lockstep::gemm {
namespace {
// Below this much work a loop runs on one thread: a parallel region costs microseconds, and the
// OpenMP if clause changes only how many threads run it, never a value.

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One copy of a quantized operand read as a matrix [m, k]: which bytes hold (i, kk) and its scales.
struct CopyView {
  const QTensor* q = nullptr;  // metadata (format, scaling, elem, layout)
  const QData* d = nullptr;
  int64_t m = 0, k = 0;
  bool down_columns = false;  // MXFP8 columnwise: codes stored [k, m], scales [k/32, m]
  bool transposed = false;    // NVFP4 / FP8 columnwise copy (the quantization of X^T)
};

// The outer domain of matrix row i: rowwise copies by the QTensor's scaling and groups, transposed
// copies per row of X^T (per_row) or one domain.
int64_t domain(const CopyView& v, int64_t i) {
  if (!v.transposed) return rowwise_domain_of(*v.q, i);
  return v.q->scaling == Scaling::kPerRow && !v.q->block2d ? i : 0;
}

void check_parts(const CopyView& v, const std::string& what) {
  const QTensor& q = *v.q;
  const QData& d = *v.d;
  auto bad = [&](const std::string& why) {
    throw GemmError(fmt::format("operand {}: {}", what, why));
  };
  auto numel = [](const Tensor& t) { return t.defined() ? t.numel() : 0; };
  if (!is_quantized(q.format)) bad("not a quantized format");
  if (const std::string why = quant_spec_violation(quant_spec(q)); !why.empty()) bad(why);
  // The format table's K multiple: blocks (and FP8 block scales) never straddle K's end.
  const int64_t km = k_multiple(q.format, q.scaling);
  if (v.k % km != 0)
    bad(fmt::format("{} {} needs K % {} == 0 in a GEMM (blocks of {} along K); pad K",
                    format_name(q.format), scaling_name(q.scaling), km, km));
  if (q.scaling == Scaling::kPerGroup && !v.transposed &&
      (q.group_offsets.size() < 2 || q.group_offsets.front() != 0 ||
       q.group_offsets.back() != q.rows))
    bad("per_group scaling needs group offsets from 0 to rows");
  const int64_t n = v.m * v.k;
  switch (q.format) {
    case Format::kNvfp4: {
      if (numel(d.data) != n / 2) bad("packed data size does not match the shape");
      const int64_t need = q.scale_layout == ScaleLayout::kCompact
                               ? v.m * (v.k / 16)
                               : round_up(v.m, 128) * round_up(v.k / 16, 4);
      if (d.scale_rows != v.m || d.scale_cols != v.k / 16 || numel(d.block_scale) != need)
        bad(fmt::format("block scales [{}, {}] ({} bytes) do not match the shape (want [{}, {}])",
                        d.scale_rows, d.scale_cols, numel(d.block_scale), v.m, v.k / 16));
      const int64_t doms = v.transposed ? (q.scaling == Scaling::kPerRow && !q.block2d ? v.m : 1)
                                        : rowwise_domains(q);
      if (numel(d.amax) != doms)
        bad(fmt::format("{} amax values for {} domains", numel(d.amax), doms));
      break;
    }
    case Format::kMxfp8:
      if (numel(d.data) != n) bad("data size does not match the shape");
      if (!v.down_columns) {
        const int64_t need = q.scale_layout == ScaleLayout::kCompact
                                 ? v.m * (v.k / 32)
                                 : round_up(v.m, 128) * round_up(v.k / 32, 4);
        if (numel(d.block_scale) != need) bad("block scales do not match the shape");
      } else if (numel(d.block_scale) != (v.k / 32) * v.m) {
        bad("columnwise block scales do not match the shape");
      }
      break;
    case Format::kFp8: {
      if (numel(d.data) != n) bad("data size does not match the shape");
      int64_t want = 1;
      if (q.scaling == Scaling::kBlock1x128)
        want = v.m * (v.k / kChunk);
      else if (q.scaling == Scaling::kBlock128x128)
        want = ceil_div(v.m, 128) * (v.k / kChunk);
      else if (q.scaling == Scaling::kPerRow)
        want = v.m;
      else if (q.scaling == Scaling::kPerGroup && !v.transposed)
        want = rowwise_domains(q);
      if (numel(d.scale_inv) != want)
        bad(fmt::format("{} scale_inv values, want {}", numel(d.scale_inv), want));
      break;
    }
    default:
      bad("not a quantized format");
  }
}

DecodedOperand decode_copy(const CopyView& v, int64_t row0, int64_t count) {
  DecodedOperand d;
  d.rows = count;
  d.cols = v.k;
  const int64_t K = v.k;
  const QTensor& q = *v.q;
  d.inner.resize(size_t(count * K));
  d.outer.assign(size_t(count), 1.0f);
  const num::MiniFloat f = q.elem == ElemCodec::kE5M2 ? num::kE5M2 : num::kE4M3;
  const uint8_t* data = v.d->data.ptr<uint8_t>();
  // Code tables (every decode is exact, so a table gives the same values as the codec calls).
  float elem_lut[256];
  for (int c = 0; c < 256; ++c) elem_lut[c] = num::decode_minifloat(f, uint32_t(c));
  const uint8_t* scale_base =
      v.d->block_scale.defined() ? v.d->block_scale.ptr<uint8_t>() : nullptr;
  const bool compact = q.scale_layout == ScaleLayout::kCompact;
  const int64_t scale_cols = v.d->scale_cols, swz_cols = round_up(v.d->scale_cols, 4);
  auto scale_at = [&](int64_t r, int64_t c) {
    return compact ? scale_base[r * scale_cols + c] : scale_base[swizzled_offset(r, c, swz_cols)];
  };
  switch (q.format) {
    case Format::kNvfp4: {
      const float* amax = v.d->amax.ptr<float>();
      float e2m1[16];
      for (int c = 0; c < 16; ++c) e2m1[c] = num::decode_e2m1(uint8_t(c));
#pragma omp parallel for schedule(static) if (count * K >= lockstep::detail::kParallelMinWork)
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = row0 + i;
        d.outer[size_t(i)] = num::two_level_outer(amax[domain(v, r)], num::kE2M1Max).s_dec;
        const uint8_t* row = data + r * K / 2;
        float* out = d.inner.data() + i * K;
        for (int64_t b = 0; b < K / 16; ++b) {
          // Exact: a 2-bit times a 4-bit significand, magnitude in [2^-10, 2688].
          const float s = num::decode_e4m3(scale_at(r, b));
          for (int64_t j = 0; j < 8; ++j) {
            const uint8_t byte = row[b * 8 + j];
            out[b * 16 + 2 * j] = num::mul_rn(e2m1[byte & 0xF], s);
            out[b * 16 + 2 * j + 1] = num::mul_rn(e2m1[byte >> 4], s);
          }
        }
      }
      break;
    }
    case Format::kMxfp8: {
      const uint8_t* sc = scale_base;
#pragma omp parallel for schedule(static) if (count * K >= lockstep::detail::kParallelMinWork)
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = row0 + i;
        float* out = d.inner.data() + i * K;
        for (int64_t b = 0; b < K / 32; ++b) {
          // Exact for e <= 246 (|inner| < 2^128; larger e may overflow to inf); e = 0xFF is NaN.
          const uint8_t e = v.down_columns ? sc[b * v.m + r] : scale_at(r, b);
          const float s = num::decode_e8m0(e);
          for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
            const uint8_t code = v.down_columns ? data[k * v.m + r] : data[r * K + k];
            out[k] = num::mul_rn(elem_lut[code], s);
          }
        }
      }
      break;
    }
    case Format::kFp8: {
      const bool block = q.scaling == Scaling::kBlock1x128 || q.scaling == Scaling::kBlock128x128;
      const float* si = v.d->scale_inv.ptr<float>();
      if (block) {
        d.chunked = true;
        d.chunks = K / kChunk;
        d.chunk_scale.resize(size_t(count * d.chunks));
      }
#pragma omp parallel for schedule(static) if (count * K >= lockstep::detail::kParallelMinWork)
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = row0 + i;
        for (int64_t k = 0; k < K; ++k) d.inner[size_t(i * K + k)] = elem_lut[data[r * K + k]];
        if (!block) {
          d.outer[size_t(i)] = si[domain(v, r)];
        } else {
          const int64_t sr = q.scaling == Scaling::kBlock1x128 ? r : r / 128;
          for (int64_t c = 0; c < d.chunks; ++c)
            d.chunk_scale[size_t(i * d.chunks + c)] = si[sr * d.chunks + c];
        }
      }
      break;
    }
    default:
      break;
  }
  return d;
}

}  // namespace

DecodedOperand decode_operand(const GemmArg& op, Copy copy, int64_t row0, int64_t count,
                              std::string_view name) {
  const std::string what = op.describe(copy, name);
  const int64_t m = op.rows(copy), k = op.cols(copy);
  if (row0 < 0 || count < 0 || row0 + count > m)
    throw GemmError(
        fmt::format("operand {}: rows [{}, {}) out of range", what, row0, row0 + count));
  if (!op.quantized()) {
    const Tensor& t = op.t();
    if (t.dtype() != DType::kBF16 && t.dtype() != DType::kF32)
      throw GemmError(
          fmt::format("operand {}: dense operands are BF16, F32 (or F64 on both sides)", what));
    // One pass: widen (BF16 exactly) and, for the columnwise copy, transpose in 32 x 32 tiles.
    const Tensor host = t.to(Device::cpu()).contiguous();
    DecodedOperand d;
    d.rows = count;
    d.cols = k;
    d.inner.resize(size_t(count * k));
    d.outer.assign(size_t(count), 1.0f);
    const int64_t C = host.cols();
    const bool bf16 = host.dtype() == DType::kBF16;
    const float* pf = bf16 ? nullptr : host.ptr<float>();
    const uint16_t* pb = bf16 ? host.ptr<uint16_t>() : nullptr;
    auto at = [&](int64_t r, int64_t c) {
      return bf16 ? num::bf16_to_f32(pb[r * C + c]) : pf[r * C + c];
    };
    float* out = d.inner.data();
    if (copy == Copy::kRowwise) {
      for (int64_t i = 0; i < count; ++i)
        for (int64_t c = 0; c < k; ++c) out[i * k + c] = at(row0 + i, c);
    } else {
      // Matrix element (i, kk) of X^T is X(kk, row0 + i).
      constexpr int64_t kTile = 32;
      for (int64_t k0 = 0; k0 < k; k0 += kTile)
        for (int64_t i0 = 0; i0 < count; i0 += kTile)
          for (int64_t kk = k0; kk < std::min(k, k0 + kTile); ++kk)
            for (int64_t i = i0; i < std::min(count, i0 + kTile); ++i)
              out[i * k + kk] = at(kk, row0 + i);
    }
    return d;
  }
  check_operand(op, copy, name);
  const QTensor host = op.q().device().is_cpu() ? op.q() : op.q().to(Device::cpu());
  CopyView v;
  v.q = &host;
  v.d = &host.copy(copy);
  v.m = m;
  v.k = k;
  v.down_columns = copy == Copy::kColwise && host.format == Format::kMxfp8;
  v.transposed = copy == Copy::kColwise && host.format != Format::kMxfp8;
  return decode_copy(v, row0, count);
}

void check_operand(const GemmArg& op, Copy copy, std::string_view name) {
  if (!op.quantized()) return;
  const std::string what = op.describe(copy, name);
  const QTensor& q = op.q();
  const QData& data = q.copy(copy);
  if (!data.defined())
    throw GemmError(
        fmt::format("operand {}: the tensor has no {} copy (quantize it with {} = true)", what,
                    copy == Copy::kRowwise ? "rowwise" : "columnwise",
                    copy == Copy::kRowwise ? "rowwise" : "colwise"));
  if (copy == Copy::kColwise && q.format != Format::kMxfp8 && !q.group_offsets.empty())
    throw GemmError(
        fmt::format("operand {}: the columnwise copy of a grouped buffer is read per group "
                    "(grouped_qgemm, or group_view)",
                    what));
  CopyView v;
  v.q = &q;
  v.d = &data;
  v.m = op.rows(copy);
  v.k = op.cols(copy);
  v.down_columns = copy == Copy::kColwise && q.format == Format::kMxfp8;
  v.transposed = copy == Copy::kColwise && q.format != Format::kMxfp8;
  check_parts(v, what);
}

int64_t grouped_w_rows_per_group(const GemmArg& w, Copy w_copy, int64_t groups, int64_t k,
                                 const std::string& what) {
  const int64_t wr = w.rows(Copy::kRowwise), wc = w.cols(Copy::kRowwise);
  if (w_copy == Copy::kRowwise) {
    if (wr % groups != 0)
      throw GemmError(fmt::format("{}: W rows {} are not groups ({}) x N", what, wr, groups));
    if (wc != k)
      throw GemmError(fmt::format("{}: K mismatch (A has {} columns, W {})", what, k, wc));
    return wr / groups;
  }
  if (wr != groups * k)
    throw GemmError(
        fmt::format("{}: a columnwise grouped W must have groups ({}) x K ({}) rows, got {}", what,
                    groups, k, wr));
  return wc;
}

std::vector<double> dense_f64(const GemmArg& op, Copy copy) {
  const Tensor host = op.t().to(Device::cpu());
  const Tensor view = (copy == Copy::kRowwise ? host : host.transpose()).contiguous();
  auto v = view.data<double>();
  return {v.begin(), v.end()};
}

}  // namespace lockstep::gemm
