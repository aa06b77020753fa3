// CPU reference quantizers, rowwise copies: NVFP4 (1-D and 2-D blocks; per-tensor, per-row,
// per-group and joint outer domains), MXFP8 (blocks along rows and down columns), FP8 with fp32
// scales, with optional stochastic rounding and Hadamard transform. Parallel over rows with OpenMP;
// every output byte depends only on its own inputs, never on the thread count.
#include "quantize_cpu.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>

#include "../tensor/cpu_parallel.h"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/fast_codecs.h"
#include "lockstep/numerics/hadamard.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/quant/layout.h"
#include "quantize_cpu_detail.h"

namespace lockstep::cpu {

// Below this much work a loop runs on one thread: a parallel region costs microseconds, and the
// OpenMP if clause changes only how many threads run it, never a value.

const num::MiniFloat& elem_codec(Format f, ElemCodec e) {
  if (f == Format::kNvfp4) return num::kE2M1;
  return e == ElemCodec::kE5M2 ? num::kE5M2 : num::kE4M3;
}

float elem_max(Format f, ElemCodec e) {
  if (f == Format::kNvfp4) return num::kE2M1Max;
  return e == ElemCodec::kE5M2 ? num::kE5M2Max : num::kE4M3Max;
}

namespace detail {

uint8_t encode_elem(const num::MiniFloat& f, const QuantConfig& cfg, float v, uint64_t index) {
  if (cfg.stochastic)
    return num::encode_minifloat_stochastic(
        f, v, num::philox_element_word(cfg.seed, cfg.rng_stream, index));
  // The wire formats through their named codecs, which the compiler specialises (the generic
  // encoder with a runtime format costs ~10x more); E2M1 through encode_e2m1_arith, equal to
  // encode_e2m1 on every fp32 input (tests/test_numerics.cpp, the cross-backend codec test).
  if (f.e_bits == 2 && f.m_bits == 1) return uint8_t(num::encode_e2m1_arith(v));
  if (f.e_bits == 4 && f.m_bits == 3) return num::encode_e4m3(v);
  if (f.e_bits == 5 && f.m_bits == 2) return num::encode_e5m2(v);
  return num::encode_minifloat(f, v);
}

float amax_of(const float* p, int64_t n) {
  float acc = num::amax_empty();
  for (int64_t i = 0; i < n; ++i) acc = num::amax_fold(acc, p[i]);
  return n == 0 ? 0.0f : acc;
}

float amax_rows(const MatrixF32& x, int64_t r0, int64_t r1) {
  const int64_t n = (r1 - r0) * x.cols;
  if (n == 0) return 0.0f;
  const float* base = x.values.data() + r0 * x.cols;
  std::vector<float> partial(size_t(omp_get_max_threads()), num::amax_empty());
#pragma omp parallel if (n >= lockstep::detail::kParallelMinWork)
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

std::string where(std::string_view name, int64_t rows, int64_t cols) {
  return fmt::format("tensor '{}' [{}, {}]", name, rows, cols);
}

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

std::vector<float> domain_amax(const MatrixF32& x, std::span<const int64_t> offsets, Scaling s) {
  if (s == Scaling::kPerRow) {
    std::vector<float> a(size_t(x.rows));
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= lockstep::detail::kParallelMinWork)
    for (int64_t r = 0; r < x.rows; ++r)
      a[size_t(r)] = amax_of(x.values.data() + r * x.cols, x.cols);
    return a;
  }
  if (s == Scaling::kPerGroup) {
    std::vector<float> a(offsets.size() - 1);
    for (size_t g = 0; g + 1 < offsets.size(); ++g) a[g] = amax_rows(x, offsets[g], offsets[g + 1]);
    return a;
  }
  return {amax_rows(x, 0, x.rows)};
}

Tensor host_u8(std::vector<int64_t> shape) { return Tensor(DType::kU8, std::move(shape)); }
Tensor host_f32(std::span<const float> v, std::vector<int64_t> shape) {
  return Tensor::from_vector<float>(v, std::move(shape), DType::kF32);
}

void alloc_scales(QData& q, int64_t srows, int64_t scols, ScaleLayout layout) {
  q.scale_rows = srows;
  q.scale_cols = scols;
  if (layout == ScaleLayout::kCompact)
    q.block_scale = host_u8({srows, scols});
  else
    q.block_scale = host_u8({round_up(srows, 128) * round_up(scols, 4)});
}

void nvfp4_rows(const MatrixF32& x, const QuantConfig& cfg, std::span<const float> amax,
                std::span<const int64_t> dom, uint64_t index_base, QData& q) {
  const int64_t rows = x.rows, cols = x.cols, nb = cols / 16;
  std::vector<num::TwoLevelOuter> outer(amax.size());
  for (size_t d = 0; d < amax.size(); ++d) outer[d] = num::two_level_outer(amax[d], num::kE2M1Max);
  q.data = host_u8({rows, cols / 2});
  alloc_scales(q, rows, nb, cfg.scale_layout);
  q.amax = host_f32(amax, {int64_t(amax.size())});
  const ScaleView sc = scale_access(q, cfg.scale_layout);
  uint8_t* data = q.data.ptr<uint8_t>();
  const float* xv = x.values.data();
  // Block scales: 1-D blocks of 16 along a row, or 16x16 tiles (the same scale on all 16 rows).
  if (cfg.block2d) {
#pragma omp parallel for schedule(static) if (rows * cols >= lockstep::detail::kParallelMinWork)
    for (int64_t tr = 0; tr < rows / 16; ++tr) {
      const num::TwoLevelOuter& o = outer[size_t(dom[size_t(tr * 16)])];
      for (int64_t j = 0; j < nb; ++j) {
        float acc = num::amax_empty();
        for (int64_t r = tr * 16; r < tr * 16 + 16; ++r)
          for (int64_t c = j * 16; c < j * 16 + 16; ++c)
            acc = num::amax_fold(acc, xv[r * cols + c]);
        const uint8_t s = num::two_level_block_scale(acc, o);
        for (int64_t r = tr * 16; r < tr * 16 + 16; ++r) sc.store(r, j, s);
      }
    }
  } else {
#pragma omp parallel for schedule(static) if (rows * cols >= lockstep::detail::kParallelMinWork)
    for (int64_t r = 0; r < rows; ++r) {
      const num::TwoLevelOuter& o = outer[size_t(dom[size_t(r)])];
      for (int64_t j = 0; j < nb; ++j)
        sc.store(r, j, num::two_level_block_scale(amax_of(xv + r * cols + j * 16, 16), o));
    }
  }
  // Elements.
#pragma omp parallel for schedule(static) if (rows * cols >= lockstep::detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const num::TwoLevelOuter& o = outer[size_t(dom[size_t(r)])];
    for (int64_t j = 0; j < nb; ++j) {
      const float enc = num::two_level_encode_factor(sc.load(r, j), o);
      for (int64_t c = j * 16; c < j * 16 + 16; c += 2) {
        const int64_t i0 = r * cols + c;
        const uint8_t lo =
            encode_elem(num::kE2M1, cfg, num::mul_rn(xv[i0], enc), index_base + uint64_t(i0));
        const uint8_t hi = encode_elem(num::kE2M1, cfg, num::mul_rn(xv[i0 + 1], enc),
                                       index_base + uint64_t(i0 + 1));
        data[i0 / 2] = uint8_t(lo | (hi << 4));
      }
    }
  }
}

void mxfp8_rows(const MatrixF32& x, const QuantConfig& cfg, QData& q) {
  const int64_t rows = x.rows, cols = x.cols;
  const num::MiniFloat& f = elem_codec(cfg.format, cfg.elem);
  const float emax = elem_max(cfg.format, cfg.elem);
  const float* xv = x.values.data();
  q.data = host_u8({rows, cols});
  alloc_scales(q, rows, cols / 32, cfg.scale_layout);
  const ScaleView sc = scale_access(q, cfg.scale_layout);
  uint8_t* data = q.data.ptr<uint8_t>();
#pragma omp parallel for schedule(static) if (rows * cols >= lockstep::detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols / 32; ++j) {
      const uint8_t e = num::mx_block_exponent(amax_of(xv + r * cols + j * 32, 32), emax);
      sc.store(r, j, e);
      const float factor = num::mx_encode_factor(e);
      for (int64_t c = j * 32; c < j * 32 + 32; ++c) {
        const int64_t i = r * cols + c;
        data[i] = encode_elem(f, cfg, num::mul_rn(xv[i], factor), uint64_t(i));
      }
    }
  }
}

void mxfp8_cols(const MatrixF32& x, const QuantConfig& cfg, QData& q) {
  // Blocks of 32 down each column; quantized from the input, never from the rowwise copy.
  const int64_t rows = x.rows, cols = x.cols;
  const num::MiniFloat& f = elem_codec(cfg.format, cfg.elem);
  const float emax = elem_max(cfg.format, cfg.elem);
  const float* xv = x.values.data();
  q.data = host_u8({rows, cols});
  q.scale_rows = rows / 32;
  q.scale_cols = cols;
  q.block_scale = host_u8({rows / 32, cols});
  uint8_t* data = q.data.ptr<uint8_t>();
  uint8_t* scale = q.block_scale.ptr<uint8_t>();
#pragma omp parallel for schedule(static) if (rows * cols >= lockstep::detail::kParallelMinWork)
  for (int64_t br = 0; br < rows / 32; ++br) {
    for (int64_t c = 0; c < cols; ++c) {
      float acc = num::amax_empty();
      for (int64_t r = br * 32; r < br * 32 + 32; ++r) acc = num::amax_fold(acc, xv[r * cols + c]);
      const uint8_t e = num::mx_block_exponent(acc, emax);
      scale[br * cols + c] = e;
      const float factor = num::mx_encode_factor(e);
      for (int64_t r = br * 32; r < br * 32 + 32; ++r) {
        const int64_t i = r * cols + c;
        data[i] = encode_elem(f, cfg, num::mul_rn(xv[i], factor), uint64_t(i));
      }
    }
  }
}

void fp8_rows(const MatrixF32& x, std::span<const int64_t> offsets, const QuantConfig& cfg,
              uint64_t index_base, QData& q) {
  const int64_t rows = x.rows, cols = x.cols;
  const num::MiniFloat& f = elem_codec(cfg.format, cfg.elem);
  const float emax = elem_max(cfg.format, cfg.elem);
  const float* xv = x.values.data();
  auto scale_of = [&](float a) { return num::fp8_scale(a, emax, cfg.eps, x.type_max, cfg.pow2); };
  q.data = host_u8({rows, cols});
  uint8_t* data = q.data.ptr<uint8_t>();
  if (cfg.scaling == Scaling::kPerTensor || cfg.scaling == Scaling::kPerGroup) {
    const std::vector<float> a = domain_amax(x, offsets, cfg.scaling);
    const std::vector<int64_t> dom = row_domains(rows, offsets, cfg.scaling);
    std::vector<float> scale(a.size()), inv(a.size());
    for (size_t d = 0; d < a.size(); ++d) {
      scale[d] = scale_of(a[d]);
      inv[d] = num::fp8_scale_inv(scale[d]);
    }
    q.scale_rows = int64_t(a.size());
    q.scale_cols = 1;
    q.scale_inv = host_f32(inv, {q.scale_rows, 1});
#pragma omp parallel for schedule(static) if (rows * cols >= lockstep::detail::kParallelMinWork)
    for (int64_t r = 0; r < rows; ++r) {
      const float s = scale[size_t(dom[size_t(r)])];
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = r * cols + c;
        data[i] = encode_elem(f, cfg, num::mul_rn(xv[i], s), index_base + uint64_t(i));
      }
    }
    return;
  }
  // Block geometry of one fp32 scale: br x bc elements.
  int64_t br = 1, bc = std::max<int64_t>(cols, 1);
  if (cfg.scaling == Scaling::kBlock1x128) br = 1, bc = 128;
  if (cfg.scaling == Scaling::kBlock128x128) br = 128, bc = 128;
  const int64_t nbr = (rows + br - 1) / br;
  const int64_t nbc = cfg.scaling == Scaling::kPerRow ? 1 : (cols + bc - 1) / bc;
  std::vector<float> inv(size_t(nbr * nbc), 0.0f);
#pragma omp parallel for schedule(static) if (rows * cols >= lockstep::detail::kParallelMinWork)
  for (int64_t bi = 0; bi < nbr; ++bi) {
    const int64_t r0 = bi * br, r1 = std::min(rows, r0 + br);
    for (int64_t bj = 0; bj < nbc; ++bj) {
      const int64_t c0 = bj * bc, c1 = std::min(cols, c0 + bc);
      float acc = num::amax_empty();
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) acc = num::amax_fold(acc, xv[r * cols + c]);
      const float s = scale_of((r1 - r0) * (c1 - c0) == 0 ? 0.0f : acc);
      inv[size_t(bi * nbc + bj)] = num::fp8_scale_inv(s);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t i = r * cols + c;
          data[i] = encode_elem(f, cfg, num::mul_rn(xv[i], s), index_base + uint64_t(i));
        }
    }
  }
  q.scale_rows = nbr;
  q.scale_cols = nbc;
  q.scale_inv = host_f32(inv, {nbr, nbc});
}

}  // namespace detail

using namespace detail;

MatrixF32 as_matrix(const Tensor& t, std::vector<float>& storage, std::string_view name) {
  if (t.dim() != 2)
    throw QuantError(
        fmt::format("tensor '{}' {}: quantization takes 2-D tensors", name, t.describe()));
  if (!t.is_cpu())
    throw QuantError(
        fmt::format("tensor '{}' {}: the CPU quantizer needs a host tensor", name, t.describe()));
  MatrixF32 m;
  m.name = std::string(name);
  m.rows = t.shape()[0];
  m.cols = t.shape()[1];
  switch (t.dtype()) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      m.type_max = source_type_max(t.dtype());
      break;
    default:
      throw QuantError(fmt::format("tensor '{}' {}: quantization takes F32, BF16 or F16 input",
                                   name, t.describe()));
  }
  if (t.dtype() == DType::kF32 && t.is_contiguous()) {
    m.values = t.data<float>();
  } else {
    storage = to_f32(t);
    m.values = storage;
  }
  return m;
}

std::vector<float> hadamard16_rows(const MatrixF32& x) {
  if (x.cols % 16 != 0)
    throw QuantError(fmt::format("{}: the Hadamard transform needs cols % 16 == 0",
                                 where(x.name, x.rows, x.cols)));
  std::vector<float> out(x.values.size());
  const int64_t chunks = x.rows * x.cols / 16;
#pragma omp parallel for schedule(static) if (chunks * 16 >= lockstep::detail::kParallelMinWork)
  for (int64_t k = 0; k < chunks; ++k)
    num::hadamard16_chunk(x.values.data() + k * 16, out.data() + k * 16);
  return out;
}

std::vector<float> transpose(const MatrixF32& x) {
  std::vector<float> t(size_t(x.rows * x.cols));
  constexpr int64_t kTile = 32;
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= lockstep::detail::kParallelMinWork)
  for (int64_t c0 = 0; c0 < x.cols; c0 += kTile)
    for (int64_t r0 = 0; r0 < x.rows; r0 += kTile)
      for (int64_t c = c0; c < std::min(x.cols, c0 + kTile); ++c)
        for (int64_t r = r0; r < std::min(x.rows, r0 + kTile); ++r)
          t[size_t(c * x.rows + r)] = x.values[size_t(r * x.cols + c)];
  return t;
}

}  // namespace lockstep::cpu
