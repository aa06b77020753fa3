// The scalar functions the ops/ kernels are written with, per scalar type T. For float: the
// portable numerics (exp_f32, log_f32, sqrt_rn, silu_f32), callable on host and device, so that
// the row functions compute the same bits on both; for double: the C library, host only (the
// float64 instantiations exist for the CPU's gradient checks).
#pragma once

#include <cmath>

#include "lockstep/numerics/hd.h"
#include "lockstep/numerics/transcendental.h"

namespace lockstep::ops {

template <class T>
struct OpMath;

template <>
struct OpMath<float> {
  LOCKSTEP_HD static float exp(float x) { return num::exp_f32(x); }
  LOCKSTEP_HD static float log(float x) { return num::log_f32(x); }
  LOCKSTEP_HD static float sqrt(float x) { return num::sqrt_rn(x); }
  // RN(g / RN(1 + exp_f32(-g))), the silu of numerics/transcendental.h.
  LOCKSTEP_HD static float silu(float g) { return num::silu_f32(g); }
};

template <>
struct OpMath<double> {
  static double exp(double x) { return std::exp(x); }
  static double log(double x) { return std::log(x); }
  static double sqrt(double x) { return std::sqrt(x); }
  static double silu(double g) { return g / (1.0 + std::exp(-g)); }
};

}  // namespace lockstep::ops
