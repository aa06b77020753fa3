// The scalar functions added for the ops layer: log_f32 (portable fp32 log, within 1 ulp of the
// float64 log on a dense sample of all positive floats, exact edges) and sqrt_rn (IEEE sqrt).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "lockstep/numerics/transcendental.h"
#include "lockstep/ops/op_math.h"

using namespace lockstep;

namespace {
// |got - ref| in units of the last place of the float nearest to ref.
double ulp_error(float got, double ref) {
  int e = 0;
  std::frexp(float(ref), &e);
  return std::fabs(double(got) - ref) / std::ldexp(1.0, std::max(e, -125) - 24);
}
}  // namespace

TEST(PortableLog, WithinOneUlpOnEveryThousandthPositiveFloat) {
  // Every 1009th bit pattern from the smallest subnormal to the largest finite float, plus the
  // neighbourhood of 1 where log is smallest relative to its argument.
  double worst = 0;
  uint32_t worst_bits = 0;
  auto check = [&](uint32_t b) {
    const float x = std::bit_cast<float>(b);
    const double err = ulp_error(num::log_f32(x), std::log(double(x)));
    if (err > worst) {
      worst = err;
      worst_bits = b;
    }
  };
  for (uint32_t b = 1; b < 0x7F800000u; b += 1009) check(b);
  for (uint32_t b = 0x3F700000u; b < 0x3F880000u; b += 7) check(b);
  EXPECT_LE(worst, 1.0) << "worst at bits 0x" << std::hex << worst_bits;
}

TEST(PortableLog, EdgesAndExactValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(num::log_f32(1.0f), 0.0f);
  EXPECT_FALSE(std::signbit(num::log_f32(1.0f)));
  EXPECT_EQ(num::log_f32(0.0f), -inf);
  EXPECT_EQ(num::log_f32(-0.0f), -inf);
  EXPECT_EQ(num::log_f32(inf), inf);
  EXPECT_TRUE(std::isnan(num::log_f32(-1.0f)));
  EXPECT_TRUE(std::isnan(num::log_f32(-inf)));
  EXPECT_TRUE(std::isnan(num::log_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_LE(ulp_error(num::log_f32(2.0f), std::log(2.0)), 0.5);
  EXPECT_LE(ulp_error(num::log_f32(std::numeric_limits<float>::denorm_min()),
                      std::log(double(std::numeric_limits<float>::denorm_min()))),
            0.5);
  EXPECT_NEAR(num::log_f32(std::numeric_limits<float>::max()), 88.72283935546875, 1e-5);
}

TEST(PortableLog, InvertsExpWithinAFewUlp) {
  for (float x = -80.0f; x <= 80.0f; x += 0.37f) {
    const float y = num::log_f32(num::exp_f32(x));
    EXPECT_NEAR(y, x, 4 * std::fabs(x) * 1.2e-7 + 1e-6) << x;
  }
}

TEST(SqrtRn, IsTheCorrectlyRoundedSquareRoot) {
  // A float's sqrt is correctly rounded iff it equals the float64 sqrt rounded to float: the
  // float64 result has more than twice float's precision, so the double rounding is innocuous.
  for (uint32_t b = 0; b < 0x7F800000u; b += 4099) {
    const float x = std::bit_cast<float>(b);
    ASSERT_EQ(num::sqrt_rn(x), float(std::sqrt(double(x)))) << x;
  }
  EXPECT_EQ(ops::OpMath<float>::sqrt(4.0f), 2.0f);
  EXPECT_TRUE(std::isnan(num::sqrt_rn(-1.0f)));
}
