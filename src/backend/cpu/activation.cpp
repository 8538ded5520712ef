// CPU kernels for the elementwise activations (graph/ops/activation.cpp): the shared kmath
// formulas evaluated in float with the branch-free exp of cpu_util.h, one rounding to the output
// dtype. OpenMP over blocks of kBlock elements; f32 tensors are read and written in place, 16-bit
// ones widened to f32 on the stack and narrowed back.
#include <algorithm>

#include "backend/cpu/cpu_util.h"
#include "backend/kernel_math.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// Elements [off, off + len) of t as f32: t's own memory when it is f32, else widened into buf.
const float* block_in(const TensorArg& t, int64_t off, int64_t len, float* buf) {
  if (t.dtype == DType::f32) return t.as<const float>() + off;
  load_f32(t.data, t.dtype, off, buf, len);
  return buf;
}
// Where the f32 results of block [off, ...) go: t's own memory when it is f32, else buf (then
// block_out narrows buf into t).
float* block_dst(const TensorArg& t, int64_t off, float* buf) {
  return t.dtype == DType::f32 ? t.as<float>() + off : buf;
}
void block_out(const TensorArg& t, int64_t off, int64_t len, const float* buf) {
  if (t.dtype != DType::f32) store_f32(buf, t.data, t.dtype, off, len);
}

// y = f(x) elementwise. The ops are kOpInplace, so y may be x: `omp simd` states what GCC cannot
// prove, that element i is read before it is written and by nothing else.
template <class F>
void unary(const KernelArgs& a, F f) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t n = x.shape.numel();
  LOOM_ASSERT(y.shape.numel() == n);
  for_blocks(n, [&](int64_t off, int64_t len) {
    float xb[kBlock], yb[kBlock];
    const float* xs = block_in(x, off, len, xb);
    float* ys = block_dst(y, off, yb);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) ys[i] = f(xs[i]);
    block_out(y, off, len, ys);
  });
}

// (x, dy) -> dx, elementwise (dx may be x or dy).
template <class F>
void unary_grad(const KernelArgs& a, F f) {
  const TensorArg& x = a.in[0];
  const TensorArg& dy = a.in[1];
  const TensorArg& dx = a.out[0];
  const int64_t n = x.shape.numel();
  LOOM_ASSERT(dy.shape.numel() == n && dx.shape.numel() == n);
  for_blocks(n, [&](int64_t off, int64_t len) {
    float xb[kBlock], gb[kBlock], ob[kBlock];
    const float* xs = block_in(x, off, len, xb);
    const float* gs = block_in(dy, off, len, gb);
    float* os = block_dst(dx, off, ob);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) os[i] = f(xs[i], gs[i]);
    block_out(dx, off, len, os);
  });
}

}  // namespace

// FastMath: libm's scalar expf made these ops a third of a training step (docs/profiling.md).
void cpu_silu(const KernelArgs& a) {
  unary(a, [](float x) { return kmath::silu<float, FastMath>(x); });
}
void cpu_gelu(const KernelArgs& a) {
  unary(a, [](float x) { return kmath::gelu<float, FastMath>(x); });
}
void cpu_silu_grad(const KernelArgs& a) {
  unary_grad(a, [](float x, float dy) { return kmath::silu_grad<float, FastMath>(x, dy); });
}
void cpu_gelu_grad(const KernelArgs& a) {
  unary_grad(a, [](float x, float dy) { return kmath::gelu_grad<float, FastMath>(x, dy); });
}

LOOM_CPU_NO_WORKSPACE(silu)
LOOM_CPU_NO_WORKSPACE(gelu)
LOOM_CPU_NO_WORKSPACE(silu_grad)
LOOM_CPU_NO_WORKSPACE(gelu_grad)

}  // namespace loom
