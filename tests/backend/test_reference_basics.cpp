// Hand-computed exact cases for the reference backend (the oracle the CPU kernels are checked
// against, so it is itself checked against arithmetic done by hand here).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/kernel_math.h"
#include "backend/reference/reference.h"
#include "core/rng.h"
#include "support/op_harness.h"

namespace loom {
namespace {

using testing::HostTensor;
using testing::OpCase;

void set_all(HostTensor& t, const std::vector<float>& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), v[i]);
}
void set_all_i32(HostTensor& t, const std::vector<int32_t>& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  for (size_t i = 0; i < v.size(); ++i) t.set_i32(static_cast<int64_t>(i), v[i]);
}
std::vector<float> values(const HostTensor& t) {
  std::vector<float> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get(i));
  return v;
}

TEST(ReferenceBasics, NameAndCoverage) {
  ReferenceBackend be;
  EXPECT_STREQ(be.name(), "reference");
  OpCase c(OpKind::dense, {{Shape{2, 2}, DType::f16}, {Shape{2, 2}, DType::f32}}, DenseAttrs{DType::bf16});
  EXPECT_TRUE(be.supports(c.graph(), c.node()));
}

TEST(ReferenceBasics, Dense2x2) {
  ReferenceBackend be;
  OpCase c(OpKind::dense, {{Shape{2, 2}, DType::f32}, {Shape{2, 2}, DType::f32}, {Shape{2}, DType::f32}},
           DenseAttrs{DType::f32});
  set_all(c.input(0), {1, 2, 3, 4});
  set_all(c.input(1), {5, 6, 7, 8});
  set_all(c.input(2), {0.5f, -1});
  // [[1·5+2·7, 1·6+2·8], [3·5+4·7, 3·6+4·8]] + [0.5, −1]
  EXPECT_EQ(values(c.run(be)[0]), (std::vector<float>{19.5f, 21, 43.5f, 49}));
}

TEST(ReferenceBasics, DenseBf16RoundsInputsAndOutput) {
  ReferenceBackend be;
  OpCase c(OpKind::dense, {{Shape{1, 2}, DType::f32}, {Shape{2, 1}, DType::f32}}, DenseAttrs{DType::bf16});
  // x0 = 1 + 2^-9 rounds to 1 in bf16 (8 significant bits); W = [1, 1]; x1 = 2^-8.
  set_all(c.input(0), {1.f + 0x1p-9f, 0x1p-8f});
  set_all(c.input(1), {1, 1});
  const HostTensor y = c.run(be)[0];
  EXPECT_EQ(y.dtype, DType::bf16);
  // acc = 1 + 2^-8, a tie between 1 and 1 + 2^-7 in bf16: to even, 1.
  EXPECT_EQ(y.get(0), 1.f);
}

TEST(ReferenceBasics, DenseGrads) {
  ReferenceBackend be;
  // dx = dy · Wᵀ: dy = [1, 2], W = [[1, 2], [3, 4], [5, 6]] -> [5, 11, 17].
  OpCase gi(OpKind::dense_grad_input, {{Shape{1, 2}, DType::f32}, {Shape{3, 2}, DType::f32}},
            DenseGradAttrs{DType::f32, DType::f32});
  set_all(gi.input(0), {1, 2});
  set_all(gi.input(1), {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values(gi.run(be)[0]), (std::vector<float>{5, 11, 17}));
  // grad += xᵀ · dy: x = [[1], [2]], dy = [[3, 4], [5, 6]] -> [[1·3+2·5, 1·4+2·6]] = [[13, 16]],
  // added to grad = [[100, 200]], or stored when assigning in minibatch 0.
  for (bool assign : {false, true}) {
    OpCase gw(OpKind::dense_grad_weight,
              {{Shape{1, 2}, DType::f32}, {Shape{2, 1}, DType::f32}, {Shape{2, 2}, DType::f32}},
              DenseGradWeightAttrs{DType::f32, false, assign});
    set_all(gw.input(0), {100, 200});
    set_all(gw.input(1), {1, 2});
    set_all(gw.input(2), {3, 4, 5, 6});
    EXPECT_EQ(values(gw.run(be)[0]), assign ? (std::vector<float>{13, 16}) : (std::vector<float>{113, 216}));
  }
}

TEST(ReferenceBasics, SumLeading) {
  ReferenceBackend be;
  OpCase c(OpKind::sum_leading, {{Shape{2, 3}, DType::f32}}, ReduceAttrs{1, DType::f32});
  set_all(c.input(0), {1, 2, 3, 10, 20, 30});
  EXPECT_EQ(values(c.run(be)[0]), (std::vector<float>{11, 22, 33}));
  OpCase all(OpKind::sum_leading, {{Shape{2, 3}, DType::f32}}, ReduceAttrs{0, DType::f32});
  set_all(all.input(0), {1, 2, 3, 10, 20, 30});
  EXPECT_EQ(values(all.run(be)[0]), (std::vector<float>{66}));
}

TEST(ReferenceBasics, LayerNormOf1234) {
  ReferenceBackend be;
  OpCase c(OpKind::layer_norm, {{Shape{1, 4}, DType::f32}, {Shape{4}, DType::f32}, {Shape{4}, DType::f32}},
           LayerNormAttrs{1e-6f, DType::f32});
  set_all(c.input(0), {1, 2, 3, 4});
  set_all(c.input(1), {1, 1, 1, 2});
  set_all(c.input(2), {0, 0, 0, 0.5f});
  const auto out = c.run(be);
  // mean 2.5, var (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
  const double rstd = 1.0 / std::sqrt(1.25 + static_cast<double>(1e-6f));
  EXPECT_EQ(out[1].get(0), 2.5f);
  EXPECT_EQ(out[2].get(0), static_cast<float>(rstd));
  EXPECT_EQ(values(out[0]),
            (std::vector<float>{static_cast<float>(-1.5 * rstd), static_cast<float>(-0.5 * rstd),
                                static_cast<float>(0.5 * rstd), static_cast<float>(1.5 * rstd * 2 + 0.5)}));
}

// transformers' LlamaRMSNorm: y = x / sqrt(mean(x²) + eps) · weight.
TEST(ReferenceBasics, RmsNormOf1234) {
  ReferenceBackend be;
  OpCase c(OpKind::rms_norm, {{Shape{1, 4}, DType::f32}, {Shape{4}, DType::f32}}, LayerNormAttrs{1e-6f, DType::f32});
  set_all(c.input(0), {1, 2, 3, 4});
  set_all(c.input(1), {1, 1, 1, 2});
  const auto out = c.run(be);
  // mean(x²) = (1 + 4 + 9 + 16) / 4 = 7.5.
  const double rstd = 1.0 / std::sqrt(7.5 + static_cast<double>(1e-6f));
  EXPECT_EQ(out[1].get(0), static_cast<float>(rstd));
  EXPECT_EQ(values(out[0]), (std::vector<float>{static_cast<float>(rstd), static_cast<float>(2 * rstd),
                                                static_cast<float>(3 * rstd), static_cast<float>(8 * rstd)}));
}

TEST(ReferenceBasics, RmsNormGradOfOneRow) {
  // x = (3, 4), scale 1, rstd = 1/sqrt(12.5) (no eps): xhat = x·rstd, dy = (1, 0):
  // dx = rstd·(dy − xhat·mean(dy·xhat)) = rstd·((1, 0) − xhat·xhat₀/2); dscale = dy·xhat.
  ReferenceBackend be;
  OpCase c(OpKind::rms_norm_grad,
           {{Shape{1, 2}, DType::f32}, {Shape{1, 2}, DType::f32}, {Shape{2}, DType::f32}, {Shape{1}, DType::f32}},
           LayerNormAttrs{});
  const double rstd = 1.0 / std::sqrt(12.5);
  set_all(c.input(0), {1, 0});
  set_all(c.input(1), {3, 4});
  set_all(c.input(2), {1, 1});
  set_all(c.input(3), {static_cast<float>(rstd)});
  const auto out = c.run(be);
  const double r = static_cast<float>(rstd), x0 = 3 * r, x1 = 4 * r;
  EXPECT_FLOAT_EQ(out[0].get(0), static_cast<float>(r * (1 - x0 * x0 / 2)));
  EXPECT_FLOAT_EQ(out[0].get(1), static_cast<float>(r * (0 - x1 * x0 / 2)));
  EXPECT_FLOAT_EQ(out[1].get(0), static_cast<float>(x0));
  EXPECT_FLOAT_EQ(out[1].get(1), 0.f);
}

TEST(ReferenceBasics, LayerNormGradOfConstantDy) {
  // dy = 1 with scale 1: dx = rstd·(1 − 1 − xhat·mean(xhat)) = 0 (mean(xhat) = 0);
  // dbias = Σ_rows dy = rows; dscale = Σ_rows xhat.
  ReferenceBackend be;
  OpCase c(OpKind::layer_norm_grad,
           {{Shape{2, 4}, DType::f32},
            {Shape{2, 4}, DType::f32},
            {Shape{4}, DType::f32},
            {Shape{2}, DType::f32},
            {Shape{2}, DType::f32}},
           LayerNormAttrs{});
  set_all(c.input(0), {1, 1, 1, 1, 1, 1, 1, 1});
  set_all(c.input(1), {1, 2, 3, 4, 1, 2, 3, 4});
  set_all(c.input(2), {1, 1, 1, 1});
  set_all(c.input(3), {2.5f, 2.5f});
  set_all(c.input(4), {2, 2});
  const auto out = c.run(be);
  for (float v : values(out[0])) EXPECT_EQ(v, 0.f);
  EXPECT_EQ(values(out[1]), (std::vector<float>{-6, -2, 2, 6}));  // 2 rows · (x − 2.5)·2
  EXPECT_EQ(values(out[2]), (std::vector<float>{2, 2, 2, 2}));
}

TEST(ReferenceBasics, Activations) {
  ReferenceBackend be;
  OpCase s(OpKind::silu, {{Shape{3}, DType::f32}});
  set_all(s.input(0), {0, 1, -2});
  EXPECT_EQ(values(s.run(be)[0]), (std::vector<float>{0.f, static_cast<float>(1 / (1 + std::exp(-1.0))),
                                                      static_cast<float>(-2 / (1 + std::exp(2.0)))}));
  OpCase g(OpKind::gelu, {{Shape{2}, DType::f32}});
  set_all(g.input(0), {0, 1});
  const double u = kmath::kSqrt2OverPi * (1 + kmath::kGeluCoeff);
  EXPECT_EQ(values(g.run(be)[0]), (std::vector<float>{0.f, static_cast<float>(0.5 * (1 + std::tanh(u)))}));
  // silu'(0) = 1/2, gelu'(0) = 1/2.
  OpCase sg(OpKind::silu_grad, {{Shape{1}, DType::f32}, {Shape{1}, DType::f32}});
  set_all(sg.input(0), {0});
  set_all(sg.input(1), {3});
  EXPECT_EQ(values(sg.run(be)[0]), (std::vector<float>{1.5f}));
  OpCase gg(OpKind::gelu_grad, {{Shape{1}, DType::f32}, {Shape{1}, DType::f32}});
  set_all(gg.input(0), {0});
  set_all(gg.input(1), {3});
  EXPECT_EQ(values(gg.run(be)[0]), (std::vector<float>{1.5f}));
}

// The exact GELU at hand values of Φ: Φ(0) = 1/2, Φ(±1) = (1 ± erf(1/√2))/2; its slope at 0 is
// Φ(0) = 1/2 and at 1 it is Φ(1) + φ(1). silu_mul(g, u) = silu(g)·u with both cotangents.
TEST(ReferenceBasics, GeluErfAndSiluMul) {
  ReferenceBackend be;
  const double e1 = std::erf(1 / std::sqrt(2.0));
  OpCase g(OpKind::gelu_erf, {{Shape{3}, DType::f32}});
  set_all(g.input(0), {0, 1, -1});
  EXPECT_EQ(values(g.run(be)[0]),
            (std::vector<float>{0.f, static_cast<float>((1 + e1) / 2), static_cast<float>(-(1 - e1) / 2)}));
  OpCase gg(OpKind::gelu_erf_grad, {{Shape{2}, DType::f32}, {Shape{2}, DType::f32}});
  set_all(gg.input(0), {0, 1});
  set_all(gg.input(1), {3, 2});
  const double phi1 = std::exp(-0.5) / std::sqrt(2 * M_PI);
  EXPECT_EQ(values(gg.run(be)[0]), (std::vector<float>{1.5f, static_cast<float>(2 * ((1 + e1) / 2 + phi1))}));

  OpCase m(OpKind::silu_mul, {{Shape{2}, DType::f32}, {Shape{2}, DType::f32}});
  set_all(m.input(0), {0, 1});
  set_all(m.input(1), {5, -3});
  const double s1 = 1 / (1 + std::exp(-1.0));
  EXPECT_EQ(values(m.run(be)[0]), (std::vector<float>{0.f, static_cast<float>(-3 * s1)}));
  // silu'(0) = 1/2: dgate = dy·up/2 and dup = dy·silu(0) = 0 at gate 0; at gate 1, dup = dy·σ(1).
  OpCase mg(OpKind::silu_mul_grad, {{Shape{2}, DType::f32}, {Shape{2}, DType::f32}, {Shape{2}, DType::f32}});
  set_all(mg.input(0), {0, 1});
  set_all(mg.input(1), {5, -3});
  set_all(mg.input(2), {2, 4});
  const auto grads = mg.run(be);
  EXPECT_EQ(values(grads[0]), (std::vector<float>{5.f, static_cast<float>(4 * -3 * s1 * (1 + (1 - s1)))}));
  EXPECT_EQ(values(grads[1]), (std::vector<float>{0.f, static_cast<float>(4 * s1)}));
}

TEST(ReferenceBasics, DropoutMatchesTheCounterRng) {
  ReferenceBackend be;
  const RunCtx rc{42, 3, 1};
  OpCase c(OpKind::dropout, {{Shape{64}, DType::f32}}, DropoutAttrs{0.5f, 9});
  for (int64_t i = 0; i < 64; ++i) c.input(0).set(i, static_cast<float>(i + 1));
  const HostTensor y = c.run(be, rc)[0];
  const PhiloxKey key = rng_key(42, 3, 1, 9);
  int kept = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const bool keep = rng_uniform(key, static_cast<uint64_t>(i)) < 0.5f;
    kept += keep;
    EXPECT_EQ(y.get(i), keep ? 2.f * static_cast<float>(i + 1) : 0.f) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 64);
  // rate 0: an exact copy.
  OpCase z(OpKind::dropout, {{Shape{3}, DType::bf16}}, DropoutAttrs{0.f, 9});
  set_all(z.input(0), {1.5f, -2, 3});
  EXPECT_EQ(values(z.run(be, rc)[0]), (std::vector<float>{1.5f, -2, 3}));
}

TEST(ReferenceBasics, CastAndAdd) {
  ReferenceBackend be;
  OpCase c(OpKind::cast, {{Shape{3}, DType::f32}}, DTypeAttrs{DType::bf16});
  set_all(c.input(0), {1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, -7.f});  // ties: to even
  EXPECT_EQ(values(c.run(be)[0]), (std::vector<float>{1.f, 1.f + 0x1p-6f, -7.f}));
  OpCase a(OpKind::add, {{Shape{2, 2}, DType::f32}, {Shape{2}, DType::f32}});
  set_all(a.input(0), {1, 2, 3, 4});
  set_all(a.input(1), {10, 20});
  EXPECT_EQ(values(a.run(be)[0]), (std::vector<float>{11, 22, 13, 24}));
  OpCase ai(OpKind::add, {{Shape{2}, DType::i32}, {Shape{2}, DType::i32}});
  set_all_i32(ai.input(0), {16777217, -5});  // 2^24 + 1: not representable in f32, exact here
  set_all_i32(ai.input(1), {2, 7});
  const HostTensor yi = ai.run(be)[0];
  EXPECT_EQ(yi.get_i32(0), 16777219);
  EXPECT_EQ(yi.get_i32(1), 2);
}

TEST(ReferenceBasics, LogSoftmaxAndGrad) {
  ReferenceBackend be;
  OpCase c(OpKind::log_softmax, {{Shape{2, 2}, DType::f32}});
  set_all(c.input(0), {0, 0, 1000, 1000});  // stable: no overflow
  const float l2 = static_cast<float>(-std::log(2.0));
  EXPECT_EQ(values(c.run(be)[0]), (std::vector<float>{l2, l2, l2, l2}));
  // dx = dy − exp(y)·Σ dy with y = log(1/2): dy = [1, 3] -> [1 − 2, 3 − 2].
  OpCase g(OpKind::log_softmax_grad, {{Shape{1, 2}, DType::f32}, {Shape{1, 2}, DType::f32}});
  set_all(g.input(0), {l2, l2});
  set_all(g.input(1), {1, 3});
  const auto dx = values(g.run(be)[0]);
  EXPECT_NEAR(dx[0], -1.f, 1e-7);
  EXPECT_NEAR(dx[1], 1.f, 1e-7);
}

TEST(ReferenceBasics, CrossEntropyOfUniformLogitsIsLogV) {
  ReferenceBackend be;
  OpCase c(OpKind::cross_entropy, {{Shape{3, 5}, DType::f32}, {Shape{3}, DType::i32}});
  for (int64_t i = 0; i < 15; ++i) c.input(0).set(i, 0.25f);
  set_all_i32(c.input(1), {0, 4, 2});
  EXPECT_EQ(c.run(be)[0].get(0), static_cast<float>(3 * std::log(5.0)));
  // grad: dloss·(1/5 − onehot).
  OpCase g(OpKind::cross_entropy_grad, {{Shape{1, 5}, DType::f32}, {Shape{1}, DType::i32}, {Shape{}, DType::f32}});
  for (int64_t i = 0; i < 5; ++i) g.input(0).set(i, -3.f);
  set_all_i32(g.input(1), {3});
  set_all(g.input(2), {2});
  EXPECT_EQ(values(g.run(be)[0]), (std::vector<float>{0.4f, 0.4f, 0.4f, -1.6f, 0.4f}));
}

TEST(ReferenceBasics, AccuracyTiesGoToTheFirstMax) {
  ReferenceBackend be;
  OpCase c(OpKind::accuracy, {{Shape{4, 3}, DType::f32}, {Shape{4}, DType::i32}});
  set_all(c.input(0), {1, 3, 3, /**/ 2, 2, 0, /**/ 0, 0, 0, /**/ 5, 1, 5});
  set_all_i32(c.input(1), {1, 1, 0, 2});  // argmax rows: 1, 0, 0, 0 -> rows 0 and 2 match
  const HostTensor y = c.run(be)[0];
  EXPECT_EQ(y.dtype, DType::i32);
  EXPECT_EQ(y.get_i32(0), 2);
}

TEST(ReferenceBasics, GradAccumulate) {
  ReferenceBackend be;
  OpCase c(OpKind::grad_accumulate, {{Shape{2}, DType::f32}, {Shape{2}, DType::f32}}, GradAccumulateAttrs{});
  set_all(c.input(0), {1, 2});
  set_all(c.input(1), {0.5f, 0.25f});
  EXPECT_EQ(values(c.run(be)[0]), (std::vector<float>{1.5f, 2.25f}));
}

TEST(ReferenceBasics, GradSqNorm) {
  ReferenceBackend be;
  std::vector<float> g1{1, 2}, g2{3};
  const OptimTensor ts[] = {{nullptr, g1.data(), nullptr, nullptr, 2, 0}, {nullptr, g2.data(), nullptr, nullptr, 1, 0}};
  EXPECT_EQ(be.grad_sq_norm(ts), 14.0);
  std::vector<float> bad{INFINITY};
  const OptimTensor tb[] = {{nullptr, bad.data(), nullptr, nullptr, 1, 0}};
  EXPECT_FALSE(std::isfinite(be.grad_sq_norm(tb)));
}

TEST(ReferenceBasics, AdamFirstStep) {
  // First step from zero moments: mu = 0.1·g, nu = 0.001·g², the bias corrections undo both, so
  // u = g / (|g| + eps) = sign(g) (up to eps), and param −= lr·sign(g).
  ReferenceBackend be;
  std::vector<float> p{1.f, -2.f}, g{0.5f, -4.f}, mu{0, 0}, nu{0, 0};
  const OptimTensor t[] = {{p.data(), g.data(), mu.data(), nu.data(), 2, 0.f}};
  OptimHyper h;
  h.lr = 0.1f;
  h.eps = 1e-8f;
  be.optimizer_update(t, h);
  EXPECT_FLOAT_EQ(p[0], 0.9f);
  EXPECT_FLOAT_EQ(p[1], -1.9f);
  EXPECT_FLOAT_EQ(mu[0], 0.05f);
  EXPECT_FLOAT_EQ(mu[1], -0.4f);
  // 1 − b2 is 1 − double(0.999f) = 0.000999987..., not 0.001: the hyperparameters are floats.
  const double one_minus_b2 = 1.0 - static_cast<double>(0.999f);
  EXPECT_FLOAT_EQ(nu[0], static_cast<float>(one_minus_b2 * 0.25));
  EXPECT_FLOAT_EQ(nu[1], static_cast<float>(one_minus_b2 * 16));
}

TEST(ReferenceBasics, AdamWThirdStepWithScale) {
  // count 3, non-zero moments, grad_scale, weight decay and eps_root, worked by hand:
  //   g = −1·0.5 = −0.5; mu = 0.9·0.1 + 0.1·(−0.5) = 0.04; nu = 0.99·0.01 + 0.01·0.25 = 0.0124
  //   mhat = 0.04 / (1 − 0.9³) = 0.04 / 0.271;  vhat = 0.0124 / (1 − 0.99³) = 0.0124 / 0.029701
  //   u = mhat / (sqrt(vhat + 1e-4) + 1e-3) + 0.01·2 ; param = 2 − 0.05·u
  // (hyperparameters are floats, so the double computation below widens the same float values).
  ReferenceBackend be;
  std::vector<float> p{2.f}, g{-1.f}, mu{0.1f}, nu{0.01f};
  const OptimTensor t[] = {{p.data(), g.data(), mu.data(), nu.data(), 1, 0.01f}};
  OptimHyper h;
  h.lr = 0.05f;
  h.b1 = 0.9f;
  h.b2 = 0.99f;
  h.eps = 1e-3f;
  h.eps_root = 1e-4f;
  h.count = 3;
  h.grad_scale = 0.5f;
  be.optimizer_update(t, h);
  EXPECT_FLOAT_EQ(mu[0], 0.04f);
  EXPECT_FLOAT_EQ(nu[0], 0.0124f);
  const double mhat = 0.04 / 0.271, vhat = 0.0124 / 0.029701;
  const double u = mhat / (std::sqrt(vhat + 1e-4) + 1e-3) + 0.01 * 2;
  EXPECT_NEAR(p[0], 2 - 0.05 * u, 2e-6);
  EXPECT_NEAR(p[0], 1.9875972, 2e-6);  // the same number, written out
}

}  // namespace
}  // namespace loom
