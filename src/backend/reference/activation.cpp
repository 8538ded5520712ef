// Reference kernels for the elementwise activations (graph/ops/activation.cpp): the shared kmath
// formulas evaluated in double, rounded once to the output dtype.
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
// (x, dy) -> dx
template <class F>
void unary_grad(const KernelArgs& a, F f) {
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
  unary_grad(a, [](double x, double dy) { return kmath::silu_grad(x, dy); });
}
void ref_gelu_grad(const KernelArgs& a) {
  unary_grad(a, [](double x, double dy) { return kmath::gelu_grad(x, dy); });
}

}  // namespace loom
