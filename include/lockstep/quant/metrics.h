// Error metrics of CONTRACT.md section 10, computed in float64.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace lockstep {

struct ErrorMetrics {
  std::optional<double> rel_l2;  // undefined when ||x||_2 == 0 or overflow > 0
  std::optional<double> snr_db;  // undefined likewise (inf when the error is zero)
  double mae = 0.0;              // inf when overflow > 0
  double max_abs = 0.0;
  int64_t n = 0;
  // Finite x whose x_hat is +-Inf: the format cannot represent them (MXFP8 near FLT_MAX,
  // docs/contract-notes.md). Reports show "overflow", not a number, when this is nonzero.
  int64_t overflow = 0;
};

ErrorMetrics error_metrics(std::span<const float> x, std::span<const float> x_hat);

}  // namespace lockstep
