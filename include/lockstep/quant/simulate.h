// Simulated ExMy formats for sensitivity sweeps (CONTRACT.md section 9): blocks of 16 with an
// E4M3 two-level scale (as NVFP4, the format's max in place of 6) or an E8M0 scale (as MXFP8).
// Not a wire format; E2M1 with an E4M3 scale reproduces NVFP4 byte for byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/quant/format.h"
#include "lockstep/quant/metrics.h"
#include "lockstep/quant/quantize.h"

namespace lockstep {

struct SimFormat {
  int e_bits = 2;
  int m_bits = 1;
  ScaleKind scale = ScaleKind::kE4M3;  // kE4M3 (two-level with fp32 outer) or kE8M0
  std::string name() const;            // "E2M1/E4M3"
};

struct SimQuantized {
  std::vector<uint8_t> codes;        // one code per element, [rows, cols] (sign in the top bit)
  std::vector<uint8_t> block_scale;  // [rows, cols/16]
  std::vector<float> amax;           // outer amax per domain (E4M3 scale only)
  std::vector<float> values;         // dequantized, [rows, cols]
};

// outer: kPerTensor or kPerRow (E4M3 scale only). cols % 16 == 0.
// x: a 2-D host F32 / BF16 / F16 tensor.
SimQuantized simulate_quantize(const Tensor& x, const SimFormat& f,
                               Scaling outer = Scaling::kPerTensor,
                               std::string_view name = "tensor");

struct SweepRow {
  SimFormat format;
  ErrorMetrics metrics;
  int64_t worst_row = -1;       // row with the largest rel-L2 (-1 when no row has a defined one)
  double worst_row_rel_l2 = 0;  // +inf when that row overflows (ErrorMetrics::overflow)
};

// The formats of `lockstep sweep`: E2M1..E2M4 and E3M1..E5M1, each with E4M3 and E8M0 scales.
std::vector<SimFormat> sweep_formats();
std::vector<SweepRow> sweep(const Tensor& x, Scaling outer = Scaling::kPerTensor,
                            std::string_view name = "tensor");

// A reproducible heavy-tailed activation-like tensor: Student-t (3 degrees of freedom) noise
// from Philox with a few outlier channels scaled up, as seen in LLM activations.
std::vector<float> generate_activation_like(int64_t rows, int64_t cols, uint64_t seed);

}  // namespace lockstep
