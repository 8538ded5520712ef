// Reference kernels for the elementwise activations (graph/ops/activation.cpp): the shared kmath
// formulas evaluated in double, rounded once to the output dtype; and the constant scale.
#include "backend/kernel_math.h"
#include "backend/reference/util.h"
#include "graph/graph.h"

namespace loom {

using refk::ld;
using refk::st;

namespace {
template <class F>
void unary(const KernelArgs& a, F f) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  LOOM_ASSERT(x.shape.numel() == y.shape.numel());
  for (int64_t i = 0; i < x.shape.numel(); ++i) st(y, i, f(ld(x, i)));
}
// z = f(x, y) elementwise: (x, dy) -> dx of the gradients, (gate, up) -> silu(gate)·up.
template <class F>
void binary(const KernelArgs& a, F f) {
  const TensorArg& x = a.in[0];
  const TensorArg& dy = a.in[1];
  const TensorArg& dx = a.out[0];
  LOOM_ASSERT(x.shape.numel() == dy.shape.numel() && x.shape.numel() == dx.shape.numel());
  for (int64_t i = 0; i < x.shape.numel(); ++i) st(dx, i, f(ld(x, i), ld(dy, i)));
}
}  // namespace

void ref_silu(const KernelArgs& a) {
  unary(a, [](double x) { return kmath::silu(x); });
}
void ref_gelu(const KernelArgs& a) {
  unary(a, [](double x) { return kmath::gelu(x); });
}
void ref_silu_grad(const KernelArgs& a) {
  binary(a, [](double x, double dy) { return kmath::silu_grad(x, dy); });
}
void ref_gelu_grad(const KernelArgs& a) {
  binary(a, [](double x, double dy) { return kmath::gelu_grad(x, dy); });
}
void ref_gelu_erf(const KernelArgs& a) {
  unary(a, [](double x) { return kmath::gelu_erf(x); });
}
void ref_gelu_erf_grad(const KernelArgs& a) {
  binary(a, [](double x, double dy) { return kmath::gelu_erf_grad(x, dy); });
}
void ref_silu_mul(const KernelArgs& a) {
  binary(a, [](double gate, double up) { return kmath::silu_mul(gate, up); });
}
// (gate, up, dy) -> dgate, dup with `grad` (silu_mul's or gelu_mul's)
template <class Grad>
void gated_grad(const KernelArgs& a, Grad grad) {
  const int64_t n = a.in[0].shape.numel();
  for (const TensorArg& t : a.in) LOOM_ASSERT(t.shape.numel() == n);
  for (const TensorArg& t : a.out) LOOM_ASSERT(t.shape.numel() == n);
  for (int64_t i = 0; i < n; ++i) {
    double dgate, dup;
    grad(ld(a.in[0], i), ld(a.in[1], i), ld(a.in[2], i), dgate, dup);
    st(a.out[0], i, dgate);
    st(a.out[1], i, dup);
  }
}
void ref_silu_mul_grad(const KernelArgs& a) { gated_grad(a, kmath::silu_mul_grad<double>); }
void ref_gelu_mul(const KernelArgs& a) {
  binary(a, [](double gate, double up) { return kmath::gelu_mul(gate, up); });
}
void ref_gelu_mul_grad(const KernelArgs& a) { gated_grad(a, kmath::gelu_mul_grad<double>); }

// x·round_d(factor) in double, rounded once.
void ref_scale(const KernelArgs& a) {
  const double factor = refk::rnd(a.in[0].dtype, std::get<ScaleAttrs>(a.node.attrs).factor);
  unary(a, [factor](double x) { return x * factor; });
}

}  // namespace loom
