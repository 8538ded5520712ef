// Scalar formulas shared by every backend's kernels, templated on the arithmetic type (double in
// the reference backend, float in the CPU backend) and on the elementary function M::exp (std's by
// default; the CPU backend passes a branch-free vectorisable one). One definition
// per formula, so the oracle and the fast kernels cannot drift apart in what they compute, only in
// how.
#pragma once
#include <cmath>

#include "core/rng.h"

namespace loom::kmath {

// sqrt(2/pi), the constant of the tanh approximation used by jax.nn.gelu(approximate=True).
inline constexpr double kSqrt2OverPi = 0.7978845608028654;
inline constexpr double kGeluCoeff = 0.044715;
// 1/√2 and 1/√(2π), of the exact GELU's normal distribution function Φ and density φ.
inline constexpr double kSqrtHalf = 0.7071067811865476;
inline constexpr double kInvSqrt2Pi = 0.3989422804014327;

struct StdMath {
  template <class T>
  static T exp(T x) {
    return std::exp(x);
  }
  template <class T>
  static T erfc(T x) {
    return std::erfc(x);
  }
};

template <class T, class M = StdMath>
T sigmoid(T x) {
  return T(1) / (T(1) + M::exp(-x));
}
template <class T, class M = StdMath>
T silu(T x) {
  return x * sigmoid<T, M>(x);
}
// d/dx [x·σ(x)] = σ(x)·(1 + x·(1 − σ(x)))
template <class T, class M = StdMath>
T silu_grad(T x, T dy) {
  const T s = sigmoid<T, M>(x);
  return dy * s * (T(1) + x * (T(1) - s));
}
// jax.nn.gelu(approximate=True) = 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³), evaluated
// as x·σ(2u) = x / (1 + exp(−2u)) — the same function (0.5·(1 + tanh(u)) = σ(2u)). One exp and a
// division instead of a tanh: half the time of the tanh form in the CPU kernels, and more
// accurate where gelu is tiny (1 + tanh(u) cancels for u ≪ 0). exp overflowing to +inf for large
// negative x gives −0, the true value rounded.
template <class T, class M = StdMath>
T gelu(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x);
  return x / (T(1) + M::exp(T(-2) * u));
}
// d/dx = σ(2u) + 2·x·σ(2u)·(1 − σ(2u))·u'(x), u' = √(2/π)·(1 + 3·0.044715·x²)
// (= 0.5·(1 + t) + 0.5·x·(1 − t²)·u' with t = tanh(u) = 2σ(2u) − 1).
template <class T, class M = StdMath>
T gelu_grad(T x, T dy) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x);
  const T s = T(1) / (T(1) + M::exp(T(-2) * u));
  const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCoeff) * x * x);
  return dy * (s + T(2) * x * s * (T(1) - s) * du);
}

// The exact GELU, transformers' "gelu" (torch.nn.functional.gelu, approximate="none"):
// x·Φ(x) with Φ(x) = erfc(−x/√2)/2. erfc rather than 1 + erf keeps Φ's relative accuracy in the
// left tail, where gelu is tiny.
template <class T, class M = StdMath>
T gelu_erf(T x) {
  return T(0.5) * x * M::erfc(-x * T(kSqrtHalf));
}
// d/dx [x·Φ(x)] = Φ(x) + x·φ(x), φ(x) = exp(−x²/2)/√(2π).
template <class T, class M = StdMath>
T gelu_erf_grad(T x, T dy) {
  // exp(−v²) rather than exp(−x²/2): the same value, and the exp that the CPU's erfc computes.
  const T v = -x * T(kSqrtHalf);
  return dy * (T(0.5) * M::erfc(v) + x * T(kInvSqrt2Pi) * M::exp(-(v * v)));
}

// SwiGLU's gate (transformers' LlamaMLP: act_fn(gate_proj(x)) * up_proj(x), act_fn = silu):
// silu(gate)·up, and its gradients for dy, sharing one sigmoid: dup = dy·silu(gate),
// dgate = dy·up·silu'(gate) with silu' as in silu_grad.
template <class T, class M = StdMath>
T silu_mul(T gate, T up) {
  return silu<T, M>(gate) * up;
}
template <class T, class M = StdMath>
void silu_mul_grad(T gate, T up, T dy, T& dgate, T& dup) {
  const T s = sigmoid<T, M>(gate);
  dup = dy * gate * s;
  dgate = dy * up * s * (T(1) + gate * (T(1) - s));
}

// GeGLU's gate (transformers' GemmaMLP with gelu_pytorch_tanh): gelu(gate)·up with the tanh GELU
// above, and its gradients for dy: dup = dy·gelu(gate), dgate = gelu_grad(gate, dy·up).
template <class T, class M = StdMath>
T gelu_mul(T gate, T up) {
  return gelu<T, M>(gate) * up;
}
template <class T, class M = StdMath>
void gelu_mul_grad(T gate, T up, T dy, T& dgate, T& dup) {
  dup = dy * gelu<T, M>(gate);
  dgate = gelu_grad<T, M>(gate, dy * up);
}

// Dropout keeps element i when its uniform draw is below keep = 1 − rate (Flax: bernoulli(keep)),
// and scales kept elements by 1/keep. The draw is rng_uniform(key, i) with
// key = rng_key(seed, step, minibatch, stream): identical on every backend and on recompute.
inline bool dropout_keep(float u, float keep) { return u < keep; }

}  // namespace loom::kmath
