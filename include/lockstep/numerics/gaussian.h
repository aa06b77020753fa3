// Standard normal numbers from Philox words by the Box-Muller transform, computed in float64 with
// only correctly rounded +, -, *, / and sqrt (no libm log/sin/cos, whose last bits differ between
// C libraries and GPUs), so every machine draws the same values. Used by random weight init.
#pragma once

#include <cmath>
#include <cstdint>

#include "lockstep/numerics/hd.h"
#include "lockstep/numerics/philox.h"

namespace lockstep::num {

// sqrt, correctly rounded by IEEE 754 on the host and on CUDA devices alike.
LOCKSTEP_HD inline double sqrt_f64(double x) {
#ifdef __CUDA_ARCH__
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// ln(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)) found by exact doubling,
// then ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716, by the odd series
// through s^25 (the next term is below 2^-60 relative). Accuracy about 1e-16 relative.
LOCKSTEP_HD inline double ln_unit_f64(double u) {
  int e = 0;
  double m = u;
  while (m < 0.70710678118654752) {  // sqrt(1/2); exact doublings
    m *= 2.0;
    --e;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double z = s * s;
  double series = 1.0 / 25.0;
  for (int k = 23; k >= 1; k -= 2) series = 1.0 / double(k) + z * series;
  constexpr double kLn2 = 0.69314718055994530942;
  return double(e) * kLn2 + 2.0 * s * series;
}

// sin(x) and cos(x) for x in [0, pi/4] by Taylor series through x^21 and x^20 (Horner form,
// coefficients (-1)^k / (2k+1)! and (-1)^k / (2k)! as correctly rounded literals); the first
// omitted term is below 2^-70.
LOCKSTEP_HD inline void sincos_octant_f64(double x, double& s, double& c) {
  constexpr double kSin[11] = {1.0,
                               -0.16666666666666666,
                               0.008333333333333333,
                               -0.0001984126984126984,
                               2.7557319223985893e-06,
                               -2.505210838544172e-08,
                               1.6059043836821613e-10,
                               -7.647163731819816e-13,
                               2.8114572543455206e-15,
                               -8.22063524662433e-18,
                               1.9572941063391263e-20};
  constexpr double kCos[11] = {1.0,
                               -0.5,
                               0.041666666666666664,
                               -0.001388888888888889,
                               2.48015873015873e-05,
                               -2.755731922398589e-07,
                               2.08767569878681e-09,
                               -1.1470745597729725e-11,
                               4.779477332387385e-14,
                               -1.5619206968586225e-16,
                               4.110317623312165e-19};
  const double z = x * x;
  double ps = 0.0, pc = 0.0;
  for (int k = 10; k >= 0; --k) {
    ps = kSin[k] + z * ps;
    pc = kCos[k] + z * pc;
  }
  s = x * ps;
  c = pc;
}

// cos(2 pi t) and sin(2 pi t) for t in [0, 1): t = (o + f) / 8 with the octant o and f in [0, 1)
// split exactly; the angle inside the quadrant is reduced to [0, pi/4] (f or 1 - f times pi/4)
// and the quadrant applied by exact sign and swap rules.
LOCKSTEP_HD inline void cos_sin_2pi_f64(double t, double& c, double& s) {
  constexpr double kPiOver4 = 0.78539816339744830962;
  const double t8 = t * 8.0;  // exact
  int o = int(t8);
  if (o > 7) o = 7;
  const double f = t8 - double(o);  // exact
  double sa, ca;
  if (o % 2 == 0) {
    sincos_octant_f64(f * kPiOver4, sa, ca);  // angle b = f pi/4 inside the quadrant
  } else {
    double sb, cb;  // b = pi/2 - (1 - f) pi/4: sin b = cos(b'), cos b = sin(b')
    sincos_octant_f64((1.0 - f) * kPiOver4, sb, cb);
    sa = cb;
    ca = sb;
  }
  switch (o / 2) {
    case 0:
      c = ca, s = sa;
      break;
    case 1:
      c = -sa, s = ca;
      break;
    case 2:
      c = -ca, s = -sa;
      break;
    default:
      c = sa, s = -ca;
      break;
  }
}

// Two independent standard normals from two Philox words: u1 = (w1 + 1) 2^-32 in (0, 1],
// u2 = w2 2^-32 in [0, 1), r = sqrt(-2 ln u1), z0 = r cos(2 pi u2), z1 = r sin(2 pi u2).
// |z| <= sqrt(64 ln 2) ~ 6.66.
LOCKSTEP_HD inline void box_muller_f64(uint32_t w1, uint32_t w2, double& z0, double& z1) {
  constexpr double kInv2to32 = 1.0 / 4294967296.0;
  const double u1 = (double(w1) + 1.0) * kInv2to32;
  const double u2 = double(w2) * kInv2to32;
  const double r = sqrt_f64(-2.0 * ln_unit_f64(u1));
  double c, s;
  cos_sin_2pi_f64(u2, c, s);
  z0 = r * c;
  z1 = r * s;
}

// The standard normal of element `index` of a stream: one Philox call (CONTRACT.md section 5
// counters) serves elements 4q .. 4q + 3; words 0, 1 give elements 4q, 4q + 1 (cos, sin) and
// words 2, 3 give elements 4q + 2, 4q + 3.
LOCKSTEP_HD inline double philox_normal_f64(uint64_t seed, uint32_t stream, uint64_t index) {
  const Philox4x32 w = philox_quad_words(seed, stream, index >> 2);
  const uint32_t pair = uint32_t(index & 2u);
  double z0, z1;
  box_muller_f64(w.v[pair], w.v[pair + 1], z0, z1);
  return (index & 1u) ? z1 : z0;
}

}  // namespace lockstep::num
