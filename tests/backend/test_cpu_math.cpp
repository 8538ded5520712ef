// The CPU backend's branch-free exp and tanh (backend/cpu/cpu_util.h) against libm in double,
// over a dense sweep of their input range, in units in the last place of the float result.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_util.h"

namespace loom {
namespace {

double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const float ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / static_cast<double>(ulp);
}

TEST(CpuMath, ExpWithinTwoUlps) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 1.0 / 1024) worst = std::max(worst, ulps(cpuk::exp_f32(float(x)), std::exp(double(float(x)))));
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(cpuk::exp_f32(-200.f), 0.f);
  EXPECT_TRUE(std::isinf(cpuk::exp_f32(200.f)));
  EXPECT_TRUE(std::isnan(cpuk::exp_f32(NAN)));
}

TEST(CpuMath, TanhWithinFourUlps) {
  double worst = 0;
  for (double x = -20.0; x <= 20.0; x += 1.0 / 4096) {
    const float f = static_cast<float>(x);
    if (f == 0.f) continue;
    worst = std::max(worst, ulps(cpuk::tanh_f32(f), std::tanh(double(f))));
  }
  EXPECT_LE(worst, 4.0);
  for (float tiny : {1e-30f, 1e-10f, 1e-4f, -3e-3f}) EXPECT_LE(ulps(cpuk::tanh_f32(tiny), std::tanh(double(tiny))), 1.0);
  EXPECT_EQ(cpuk::tanh_f32(1e6f), 1.f);
  EXPECT_EQ(cpuk::tanh_f32(-1e6f), -1.f);
  EXPECT_TRUE(std::isnan(cpuk::tanh_f32(NAN)));
}

}  // namespace
}  // namespace loom
