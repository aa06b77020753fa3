// Per-scalar-type helpers for the templated RL objectives: exp is the portable fp32 exp_f32 for
// float (same bits on host and device) and std::exp for the float64 reference used by tests.
#pragma once

#include <cmath>

#include "lockstep/numerics/transcendental.h"

namespace lockstep::rl::detail {

inline float exp_s(float x) { return num::exp_f32(x); }
inline double exp_s(double x) { return std::exp(x); }

}  // namespace lockstep::rl::detail
