// CPU kernels for the elementwise activations and the constant scale (graph/ops/activation.cpp): the shared kmath
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

// The kernel's NO outputs from its NI inputs, element by element: f(x, y, i) reads element i of
// the input blocks x[0..NI) and writes element i of the output blocks y[0..NO). The ops are
// kOpInplace, so output 0 may be an input: `omp simd` states what GCC cannot prove, that element i
// is read before it is written and by nothing else.
template <size_t NI, size_t NO, class F>
void map_elements(const KernelArgs& a, F f) {
  LOOM_ASSERT(a.in.size() == NI && a.out.size() == NO);
  const int64_t n = a.in[0].shape.numel();
  for (const TensorArg& t : a.in) LOOM_ASSERT(t.shape.numel() == n);
  for (const TensorArg& t : a.out) LOOM_ASSERT(t.shape.numel() == n);
  for_blocks(n, [&](int64_t off, int64_t len) {
    float ib[NI][kBlock], ob[NO][kBlock];
    const float* x[NI];
    float* y[NO];
    for (size_t k = 0; k < NI; ++k) x[k] = block_in(a.in[k], off, len, ib[k]);
    for (size_t k = 0; k < NO; ++k) y[k] = block_dst(a.out[k], off, ob[k]);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) f(x, y, i);
    for (size_t k = 0; k < NO; ++k) block_out(a.out[k], off, len, y[k]);
  });
}

// y = f(x)
template <class F>
void unary(const KernelArgs& a, F f) {
  map_elements<1, 1>(a, [&](const float* const* x, float* const* y, int64_t i) { y[0][i] = f(x[0][i]); });
}
// z = f(x, y): (x, dy) -> dx of the gradients, (gate, up) -> silu(gate)·up.
template <class F>
void binary(const KernelArgs& a, F f) {
  map_elements<2, 1>(a, [&](const float* const* x, float* const* y, int64_t i) { y[0][i] = f(x[0][i], x[1][i]); });
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
  binary(a, [](float x, float dy) { return kmath::silu_grad<float, FastMath>(x, dy); });
}
void cpu_gelu_grad(const KernelArgs& a) {
  binary(a, [](float x, float dy) { return kmath::gelu_grad<float, FastMath>(x, dy); });
}
void cpu_gelu_erf(const KernelArgs& a) {
  unary(a, [](float x) { return kmath::gelu_erf<float, FastMath>(x); });
}
void cpu_gelu_erf_grad(const KernelArgs& a) {
  binary(a, [](float x, float dy) { return kmath::gelu_erf_grad<float, FastMath>(x, dy); });
}
void cpu_silu_mul(const KernelArgs& a) {
  binary(a, [](float gate, float up) { return kmath::silu_mul<float, FastMath>(gate, up); });
}
// (gate, up, dy) -> dgate, dup
void cpu_silu_mul_grad(const KernelArgs& a) {
  map_elements<3, 2>(a, [](const float* const* x, float* const* y, int64_t i) {
    kmath::silu_mul_grad<float, FastMath>(x[0][i], x[1][i], x[2][i], y[0][i], y[1][i]);
  });
}

void cpu_gelu_mul(const KernelArgs& a) {
  binary(a, [](float gate, float up) { return kmath::gelu_mul<float, FastMath>(gate, up); });
}
// (gate, up, dy) -> dgate, dup
void cpu_gelu_mul_grad(const KernelArgs& a) {
  map_elements<3, 2>(a, [](const float* const* x, float* const* y, int64_t i) {
    kmath::gelu_mul_grad<float, FastMath>(x[0][i], x[1][i], x[2][i], y[0][i], y[1][i]);
  });
}

// x·round_d(factor) in float, rounded once (a float product is the correctly rounded one).
void cpu_scale(const KernelArgs& a) {
  const float factor = round_to(a.in[0].dtype, std::get<ScaleAttrs>(a.node.attrs).factor);
  unary(a, [factor](float x) { return x * factor; });
}

LOOM_CPU_NO_WORKSPACE(scale)
LOOM_CPU_NO_WORKSPACE(silu)
LOOM_CPU_NO_WORKSPACE(gelu)
LOOM_CPU_NO_WORKSPACE(silu_grad)
LOOM_CPU_NO_WORKSPACE(gelu_grad)
LOOM_CPU_NO_WORKSPACE(gelu_erf)
LOOM_CPU_NO_WORKSPACE(gelu_erf_grad)
LOOM_CPU_NO_WORKSPACE(silu_mul)
LOOM_CPU_NO_WORKSPACE(silu_mul_grad)
LOOM_CPU_NO_WORKSPACE(gelu_mul)
LOOM_CPU_NO_WORKSPACE(gelu_mul_grad)

}  // namespace loom
