// The CPU backend's branch-free exp and erfc (backend/cpu/cpu_util.h), and the GELU formulas evaluated with
// them in float (backend/kernel_math.h), against libm in double over a dense sweep of their input
// range, in units in the last place of the float result.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_util.h"
#include "backend/kernel_math.h"

namespace loom {
namespace {

double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const float ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / static_cast<double>(ulp);
}

TEST(CpuMath, ExpWithinTwoUlps) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 1.0 / 1024)
    worst = std::max(worst, ulps(cpuk::exp_f32(float(x)), std::exp(double(float(x)))));
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(cpuk::exp_f32(-200.f), 0.f);
  EXPECT_TRUE(std::isinf(cpuk::exp_f32(200.f)));
  EXPECT_TRUE(std::isnan(cpuk::exp_f32(NAN)));
}

// The CPU kernels' GELU (float, FastMath) against the reference backend's (double, libm).
float gelu_f(float x) { return kmath::gelu<float, cpuk::FastMath>(x); }
float gelu_grad_f(float x) { return kmath::gelu_grad<float, cpuk::FastMath>(x, 1.f); }
double gelu_def(double x) { return kmath::gelu<double>(x); }
double gelu_grad_def(double x) { return kmath::gelu_grad<double>(x, 1.0); }

// Errors in units of the float ulp of the result's scale, divided by the condition number 1 + |2u|
// (u = √(2/π)·(x + 0.044715·x³) itself carries a float rounding, which exp(−2u) magnifies by |2u|;
// a tanh evaluation has the same limit). The gradient's scale is the size of its two terms, since
// it crosses zero near x = −0.75.
TEST(CpuMath, GeluAndItsGradientWithinFewUlps) {
  double worst = 0, worst_grad = 0;
  for (double x = -9.0; x <= 9.0; x += 1.0 / 4096) {
    const float f = static_cast<float>(x);
    if (f == 0.f) continue;
    const double u = kmath::kSqrt2OverPi * (x + kmath::kGeluCoeff * x * x * x);
    const double cond = 1 + std::fabs(2 * u);
    worst = std::max(worst, ulps(gelu_f(f), gelu_def(f)) / cond);
    const double s = 1 / (1 + std::exp(-2 * u));
    const double scale = s + std::fabs(2 * x * s * (1 - s) * kmath::kSqrt2OverPi * (1 + 3 * kmath::kGeluCoeff * x * x));
    const double err = std::fabs(gelu_grad_f(f) - gelu_grad_def(f));
    worst_grad = std::max(worst_grad, err / (scale * 0x1p-24) / cond);  // 2⁻²⁴: half a float ulp at 1
  }
  EXPECT_LE(worst, 4.0);       // measured 2.1
  EXPECT_LE(worst_grad, 4.0);  // measured 2.5
  // Saturation: −0 far left (the true value underflows), x far right; NaN propagates.
  EXPECT_EQ(gelu_f(-1e4f), 0.f);
  EXPECT_EQ(gelu_f(1e4f), 1e4f);
  EXPECT_EQ(gelu_grad_f(-1e4f), 0.f);
  EXPECT_EQ(gelu_grad_f(1e4f), 1.f);
  EXPECT_TRUE(std::isnan(gelu_f(NAN)));
}

TEST(CpuMath, ErfcWithinFewUlps) {
  double worst = 0;
  for (double x = -4.0; x <= 9.0; x += 1.0 / 1024) {
    const float f = static_cast<float>(x);
    // exp(−x²) of a rounded x²: a relative error of up to x²·2⁻²³, as in any float erfc.
    worst = std::max(worst, ulps(cpuk::erfc_f32(f), std::erfc(double(f))) / (1 + 2 * x * x));
  }
  EXPECT_LE(worst, 4.0);
  EXPECT_EQ(cpuk::erfc_f32(-20.f), 2.f);
  EXPECT_EQ(cpuk::erfc_f32(20.f), 0.f);
}

// The exact GELU x·erfc(−x/√2)/2 and its gradient Φ(x) + x·φ(x) (kernel_math.h), float with
// FastMath against double with libm. Both are conditioned by exp(−x²/2) in the left tail: errors
// in float ulps of the result's scale (the gradient's two terms; it crosses zero near x = −0.75),
// divided by 1 + x².
float gelu_erf_f(float x) { return kmath::gelu_erf<float, cpuk::FastMath>(x); }
float gelu_erf_grad_f(float x) { return kmath::gelu_erf_grad<float, cpuk::FastMath>(x, 1.f); }

TEST(CpuMath, GeluErfAndItsGradientWithinFewUlps) {
  double worst = 0, worst_grad = 0;
  for (double x = -9.0; x <= 9.0; x += 1.0 / 4096) {
    const float f = static_cast<float>(x);
    if (f == 0.f) continue;
    const double cond = 1 + x * x;
    worst = std::max(worst, ulps(gelu_erf_f(f), kmath::gelu_erf<double>(f)) / cond);
    const double phi = std::erfc(-x * kmath::kSqrtHalf) / 2, density = std::exp(-x * x / 2) * kmath::kInvSqrt2Pi;
    const double scale = phi + std::fabs(x) * density;
    const double err = std::fabs(gelu_erf_grad_f(f) - kmath::gelu_erf_grad<double>(f, 1.0));
    worst_grad = std::max(worst_grad, err / (scale * 0x1p-24) / cond);
  }
  EXPECT_LE(worst, 8.0);
  EXPECT_LE(worst_grad, 8.0);
  EXPECT_EQ(gelu_erf_f(1e4f), 1e4f);
  EXPECT_EQ(gelu_erf_f(-1e4f), 0.f);
  EXPECT_EQ(gelu_erf_grad_f(1e4f), 1.f);
  EXPECT_EQ(gelu_erf_grad_f(-1e4f), 0.f);
  EXPECT_TRUE(std::isnan(gelu_erf_f(NAN)));
}

}  // namespace
}  // namespace loom
