// Error metrics (CONTRACT.md section 10), accumulated in float64 in index order.
#include "lockstep/quant/metrics.h"

#include <cmath>
#include <stdexcept>

namespace lockstep {

ErrorMetrics error_metrics(std::span<const float> x, std::span<const float> x_hat) {
  if (x.size() != x_hat.size())
    throw std::invalid_argument("error_metrics: reference and reconstruction differ in size");
  ErrorMetrics m;
  m.n = int64_t(x.size());
  double ref2 = 0.0, err2 = 0.0, abs_sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = double(x_hat[i]) - double(x[i]);
    ref2 += double(x[i]) * double(x[i]);
    err2 += d * d;
    abs_sum += std::fabs(d);
    if (std::fabs(d) > m.max_abs || std::isnan(d)) m.max_abs = std::fabs(d);
    if (std::isfinite(x[i]) && std::isinf(x_hat[i])) ++m.overflow;
  }
  m.mae = x.empty() ? 0.0 : abs_sum / double(x.size());
  if (ref2 > 0.0 && m.overflow == 0) {
    double ref = std::sqrt(ref2), err = std::sqrt(err2);
    m.rel_l2 = err / ref;
    m.snr_db = err == 0.0 ? INFINITY : 20.0 * std::log10(ref / err);
  }
  return m;
}

}  // namespace lockstep
