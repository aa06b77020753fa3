// Simulated ExMy quantization and the sensitivity sweep behind `lockstep sweep`.
#include "lockstep/quant/simulate.h"

#include <fmt/format.h>

#include <cmath>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/philox.h"
#include "quantize_cpu.h"

namespace lockstep {

std::string SimFormat::name() const {
  return fmt::format("E{}M{}/{}", e_bits, m_bits, scale == ScaleKind::kE4M3 ? "E4M3" : "E8M0");
}

namespace {
SimQuantized simulate_matrix(const cpu::MatrixF32& x, const SimFormat& f, Scaling outer) {
  if (x.cols % 16 != 0)
    throw QuantError(
        fmt::format("tensor '{}' [{}, {}]: simulated formats use blocks of 16, need cols % 16 == 0",
                    x.name, x.rows, x.cols));
  if (f.e_bits < 1 || f.e_bits > 5 || f.m_bits < 0 || f.e_bits + f.m_bits > 7)
    throw QuantError(fmt::format("simulated format E{}M{} is outside E1..E5, 8 bits with sign",
                                 f.e_bits, f.m_bits));
  if (outer != Scaling::kPerTensor && outer != Scaling::kPerRow)
    throw QuantError("simulated formats take per_tensor or per_row outer scaling");
  const num::MiniFloat mf = num::exmy_format(f.e_bits, f.m_bits);
  const float emax = num::minifloat_max(mf);
  const int64_t rows = x.rows, cols = x.cols, nb = cols / 16;
  SimQuantized s;
  s.codes.assign(size_t(rows * cols), 0);
  s.block_scale.assign(size_t(rows * nb), 0);
  s.values.assign(size_t(rows * cols), 0.0f);
  const float* xv = x.values.data();
  auto block_amax = [&](int64_t r, int64_t j) {
    float acc = num::amax_empty();
    for (int64_t c = j * 16; c < j * 16 + 16; ++c) acc = num::amax_fold(acc, xv[r * cols + c]);
    return acc;
  };
  std::vector<num::TwoLevelOuter> outers;
  if (f.scale == ScaleKind::kE4M3) {
    const int64_t domains = outer == Scaling::kPerRow ? rows : 1;
    s.amax.assign(size_t(domains), 0.0f);
    for (int64_t d = 0; d < domains; ++d) {
      const int64_t r0 = outer == Scaling::kPerRow ? d : 0,
                    r1 = outer == Scaling::kPerRow ? d + 1 : rows;
      float acc = num::amax_empty();
      for (int64_t i = r0 * cols; i < r1 * cols; ++i) acc = num::amax_fold(acc, xv[i]);
      s.amax[size_t(d)] = (r1 - r0) * cols == 0 ? 0.0f : acc;
      outers.push_back(num::two_level_outer(s.amax[size_t(d)], emax));
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nb; ++j) {
      const float b = block_amax(r, j);
      uint8_t sc;
      float enc;
      if (f.scale == ScaleKind::kE4M3) {
        const num::TwoLevelOuter& o = outers[size_t(outer == Scaling::kPerRow ? r : 0)];
        sc = num::two_level_block_scale(b, o);
        enc = num::two_level_encode_factor(sc, o);
      } else {
        sc = num::mx_block_exponent(b, emax);
        enc = num::mx_encode_factor(sc);
      }
      s.block_scale[size_t(r * nb + j)] = sc;
      for (int64_t c = j * 16; c < j * 16 + 16; ++c) {
        const size_t i = size_t(r * cols + c);
        const uint8_t code = num::encode_minifloat(mf, num::mul_rn(xv[i], enc));
        s.codes[i] = code;
        const float e = num::decode_minifloat(mf, code);
        s.values[i] = f.scale == ScaleKind::kE4M3
                          ? num::two_level_dequant(
                                e, sc, outers[size_t(outer == Scaling::kPerRow ? r : 0)].s_dec)
                          : num::mx_dequant(e, sc);
      }
    }
  }
  return s;
}
}  // namespace

std::vector<SimFormat> sweep_formats() {
  std::vector<SimFormat> out;
  const int em[][2] = {{2, 1}, {2, 2}, {2, 3}, {2, 4}, {3, 1}, {4, 1}, {5, 1}};
  for (auto [e, m] : em)
    for (ScaleKind k : {ScaleKind::kE4M3, ScaleKind::kE8M0}) out.push_back(SimFormat{e, m, k});
  return out;
}

SimQuantized simulate_quantize(const Tensor& t, const SimFormat& f, Scaling outer,
                               std::string_view name) {
  std::vector<float> storage;
  return simulate_matrix(cpu::as_matrix(t, storage, name), f, outer);
}

std::vector<SweepRow> sweep(const Tensor& t, Scaling outer, std::string_view name) {
  std::vector<float> storage;
  const cpu::MatrixF32 x = cpu::as_matrix(t, storage, name);
  std::vector<SweepRow> rows;
  for (const SimFormat& f : sweep_formats()) {
    SimQuantized s =
        simulate_matrix(x, f, f.scale == ScaleKind::kE4M3 ? outer : Scaling::kPerTensor);
    SweepRow row{f, error_metrics(x.values, s.values)};
    for (int64_t r = 0; r < x.rows; ++r) {
      auto span_x = x.values.subspan(size_t(r * x.cols), size_t(x.cols));
      auto span_h = std::span<const float>(s.values).subspan(size_t(r * x.cols), size_t(x.cols));
      ErrorMetrics m = error_metrics(span_x, span_h);
      // A row that overflows (finite x, x_hat = +-Inf) is the worst, with rel-L2 +inf.
      const std::optional<double> rel = m.overflow > 0 ? std::optional<double>(INFINITY) : m.rel_l2;
      if (rel && (row.worst_row < 0 || *rel > row.worst_row_rel_l2)) {
        row.worst_row = r;
        row.worst_row_rel_l2 = *rel;
      }
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<float> generate_activation_like(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> v(size_t(rows * cols));
  auto uniform = [&](uint64_t index, uint32_t stream) {
    // (0, 1), never 0 so that logs stay finite
    return (double(num::philox_element_word(seed, stream, index) >> 8) + 0.5) * 0x1p-24;
  };
  auto normal = [&](uint64_t index, uint32_t stream) {
    return std::sqrt(-2.0 * std::log(uniform(index, stream))) *
           std::cos(6.283185307179586 * uniform(index, stream + 1));
  };
  for (int64_t i = 0; i < rows * cols; ++i) {
    // Student-t with 3 degrees of freedom: z / sqrt(chi2_3 / 3)
    double z = normal(uint64_t(i), 0);
    double chi2 = 0;
    for (uint32_t k = 0; k < 3; ++k) {
      double n = normal(uint64_t(i), 2 + 2 * k);
      chi2 += n * n;
    }
    v[size_t(i)] = float(z / std::sqrt(chi2 / 3.0));
  }
  // A few outlier channels (every 257th column, up to 8), 30x larger.
  for (int64_t c = 7, k = 0; c < cols && k < 8; c += 257, ++k)
    for (int64_t r = 0; r < rows; ++r) v[size_t(r * cols + c)] *= 30.0f;
  return v;
}

}  // namespace lockstep
