// CPU reference dequantizers: X [rows, cols] rebuilt from the rowwise copy, from an MXFP8
// blocks-down-columns copy, or from an NVFP4 / FP8 transposed columnwise copy (dequantized as the
// matrix X_g^T of each group, then transposed back).
#include <fmt/format.h>

#include "lockstep/numerics/block_rules.h"
#include "quantize_cpu.h"
#include "quantize_cpu_detail.h"

namespace lockstep::cpu {
namespace {
// Below this much work a loop runs on one thread: a parallel region costs microseconds, and the
// OpenMP if clause changes only how many threads run it, never a value.
constexpr int64_t kParallelMin = int64_t(1) << 15;

using namespace detail;

// Dequantizes a copy read as a rowwise matrix [m, k] into out (row-major, ld = k). dom: the outer
// domain of each row (NVFP4 amax index / FP8 per-domain scale_inv index).
void dequant_rows(const QData& d, const QTensor& q, int64_t m, int64_t k,
                  std::span<const int64_t> dom, float* out) {
  const num::MiniFloat& f = elem_codec(q.format, q.elem);
  const uint8_t* data = d.data.ptr<uint8_t>();
  switch (q.format) {
    case Format::kNvfp4: {
      const Tensor amax = d.amax.contiguous();
      std::vector<float> s_dec(size_t(amax.numel()));
      for (size_t i = 0; i < s_dec.size(); ++i)
        s_dec[i] = num::two_level_outer(amax.ptr<float>()[i], num::kE2M1Max).s_dec;
#pragma omp parallel for schedule(static) if (m * k >= kParallelMin)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const uint8_t byte = data[(r * k + c) / 2];
          const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
          out[r * k + c] = num::two_level_dequant(num::decode_e2m1(code),
                                                  load_scale(d, q.scale_layout, r, c / 16),
                                                  s_dec[size_t(dom[size_t(r)])]);
        }
      break;
    }
    case Format::kMxfp8:
#pragma omp parallel for schedule(static) if (m * k >= kParallelMin)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c)
          out[r * k + c] = num::mx_dequant(num::decode_minifloat(f, data[r * k + c]),
                                           load_scale(d, q.scale_layout, r, c / 32));
      break;
    case Format::kFp8: {
      const Tensor si_t = d.scale_inv.contiguous();
      const float* si = si_t.ptr<float>();
      const int64_t sc = d.scale_cols;
#pragma omp parallel for schedule(static) if (m * k >= kParallelMin)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) {
          int64_t i;
          switch (q.scaling) {
            case Scaling::kBlock1x128:
              i = r * sc + c / 128;
              break;
            case Scaling::kBlock128x128:
              i = r / 128 * sc + c / 128;
              break;
            default:
              i = dom[size_t(r)];
              break;
          }
          out[r * k + c] = num::mul_rn(num::decode_minifloat(f, data[r * k + c]), si[i]);
        }
      break;
    }
    default:
      break;
  }
}

std::vector<int64_t> piece_domains(Scaling s, int64_t m) {
  std::vector<int64_t> dom(size_t(m), 0);
  if (s == Scaling::kPerRow)
    for (int64_t r = 0; r < m; ++r) dom[size_t(r)] = r;
  return dom;
}

}  // namespace

std::vector<float> dequantize(const QTensor& q_in, Copy copy) {
  const QTensor q = q_in.device().is_cpu() ? q_in : q_in.to(Device::cpu());
  const int64_t rows = q.rows, cols = q.cols;
  std::vector<float> out(size_t(rows * cols));
  const QData& d = q.copy(copy);
  if (!d.defined())
    throw QuantError(fmt::format("dequantize {}: the tensor has no {} copy", q.describe(),
                                 copy == Copy::kRowwise ? "rowwise" : "columnwise"));
  if (copy == Copy::kRowwise) {
    std::vector<int64_t> dom(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) dom[size_t(r)] = rowwise_domain_of(q, r);
    dequant_rows(d, q, rows, cols, dom, out.data());
    return out;
  }
  if (q.format == Format::kMxfp8) {
    const num::MiniFloat& f = elem_codec(q.format, q.elem);
    const uint8_t* data = d.data.ptr<uint8_t>();
    const uint8_t* scale = d.block_scale.ptr<uint8_t>();
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[size_t(r * cols + c)] =
            num::mx_dequant(num::decode_minifloat(f, data[r * cols + c]), scale[r / 32 * cols + c]);
    return out;
  }
  // Transposed copies: each group's piece is X_g^T [cols, rows_g].
  const int64_t ng = q.group_offsets.empty() ? 1 : int64_t(q.group_offsets.size()) - 1;
  for (int64_t g = 0; g < ng; ++g) {
    const QTensor p = q.group_offsets.empty() ? q : group_view(q, g);
    const int64_t r0 = q.group_offsets.empty() ? 0 : q.group_offsets[size_t(g)];
    std::vector<float> t(size_t(p.rows * cols));
    dequant_rows(p.colwise, p, cols, p.rows, piece_domains(p.scaling, cols), t.data());
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < p.rows; ++r)
        out[size_t((r0 + r) * cols + c)] = t[size_t(c * p.rows + r)];
  }
  return out;
}

}  // namespace lockstep::cpu
