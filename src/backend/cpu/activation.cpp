// CPU kernels for the elementwise activations (graph/ops/activation.cpp): the shared kmath
// formulas evaluated in float with the branch-free exp/tanh of cpu_util.h, one rounding to the
// output dtype. Blocks of kBlock elements are
// widened to f32 on the stack, mapped and narrowed back; OpenMP over blocks.
#include <algorithm>

#include "backend/cpu/cpu_util.h"
#include "backend/kernel_math.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

template <class F>
void unary(const KernelArgs& a, F f) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t n = x.shape.numel();
  LOOM_ASSERT(y.shape.numel() == n);
  const int64_t nb = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kBlock, len = std::min(kBlock, n - off);
    float buf[kBlock];
    load_f32(x.data, x.dtype, off, buf, len);
    for (int64_t i = 0; i < len; ++i) buf[i] = f(buf[i]);
    store_f32(buf, y.data, y.dtype, off, len);
  }
}

// (x, dy) -> dx
template <class F>
void unary_grad(const KernelArgs& a, F f) {
  const TensorArg& x = a.in[0];
  const TensorArg& dy = a.in[1];
  const TensorArg& dx = a.out[0];
  const int64_t n = x.shape.numel();
  LOOM_ASSERT(dy.shape.numel() == n && dx.shape.numel() == n);
  const int64_t nb = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kBlock, len = std::min(kBlock, n - off);
    float xb[kBlock], gb[kBlock];
    load_f32(x.data, x.dtype, off, xb, len);
    load_f32(dy.data, dy.dtype, off, gb, len);
    for (int64_t i = 0; i < len; ++i) gb[i] = f(xb[i], gb[i]);
    store_f32(gb, dx.data, dx.dtype, off, len);
  }
}

}  // namespace

// FastMath: libm's scalar tanhf/expf made these ops a third of a training step (docs/profiling.md).
void cpu_silu(const KernelArgs& a) { unary(a, [](float x) { return kmath::silu<float, FastMath>(x); }); }
void cpu_gelu(const KernelArgs& a) { unary(a, [](float x) { return kmath::gelu<float, FastMath>(x); }); }
void cpu_silu_grad(const KernelArgs& a) {
  unary_grad(a, [](float x, float dy) { return kmath::silu_grad<float, FastMath>(x, dy); });
}
void cpu_gelu_grad(const KernelArgs& a) {
  unary_grad(a, [](float x, float dy) { return kmath::gelu_grad<float, FastMath>(x, dy); });
}

}  // namespace loom
