// Reference kernels for dense and its backward ops (graph/ops/dense.cpp).
#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/reference/reference.h"
#include "backend/reference/util.h"
#include "core/quant.h"
#include "graph/graph.h"

namespace loom {

using refk::ld;
using refk::rnd;
using refk::st;

namespace {
// W[k, n] (W stored [N, K] when wt): its element, or for a quantized kernel the exact product
// code · scale, which the callers' rnd rounds to float32 once before the compute dtype (core/quant.h).
double weight(const TensorArg& w, bool wt, int64_t K, int64_t N, int64_t k, int64_t n) {
  if (dtype_is_quantized(w.dtype)) return dequantize_exact(w.dtype, w.data, K, N, k, n);
  return ld(w, wt ? n * K + k : k * N + n);
}
}  // namespace

// y[m, n] = round_c(Σ_k round_c(x[m, k]) · round_c(W[k, n]))  (+ bias: round_c(y + round_c(b[n]))).
void ref_dense(const KernelArgs& a) {
  const DType c = std::get<DenseAttrs>(a.node.attrs).compute;
  const bool wt = std::get<DenseAttrs>(a.node.attrs).transpose_w;  // W stored [N, K]
  const TensorArg& x = a.in[0];
  const TensorArg& w = a.in[1];
  const TensorArg& y = a.out[0];
  const int64_t K = w.shape[wt ? 1 : 0], N = w.shape[wt ? 0 : 1], M = x.shape.rows();
  LOOM_ASSERT(x.shape.last() == K && y.shape.rows() == M && y.shape.last() == N);
  LOOM_ASSERT(y.dtype == c);
  const bool has_bias = a.in.size() == 3;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += rnd(c, ld(x, m * K + k)) * rnd(c, weight(w, wt, K, N, k, n));
      double v = rnd(c, acc);
      if (has_bias) v = rnd(c, v + rnd(c, ld(a.in[2], n)));
      st(y, m * N + n, v);
    }
}

// dx[m, k] = round_out(round_c(Σ_n dy[m, n] · round_c(W[k, n]))).
void ref_dense_grad_input(const KernelArgs& a) {
  const auto& at = std::get<DenseGradAttrs>(a.node.attrs);
  const TensorArg& dy = a.in[0];
  const TensorArg& w = a.in[1];
  const TensorArg& dx = a.out[0];
  const bool wt = at.transpose_w;
  const int64_t K = w.shape[wt ? 1 : 0], N = w.shape[wt ? 0 : 1], M = dy.shape.rows();
  LOOM_ASSERT(dy.shape.last() == N && dx.shape.rows() == M && dx.shape.last() == K);
  LOOM_ASSERT(dx.dtype == at.out_dtype);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += ld(dy, m * N + n) * rnd(at.compute, weight(w, wt, K, N, k, n));
      st(dx, m * K + k, rnd(at.compute, acc));
    }
}

// grad[k, n] += round_c(Σ_m round_c(x[m, k]) · dy[m, n]) in f32 (= instead of += in minibatch 0
// when the attrs say so); grad is [N, K] with transpose_w.
void ref_dense_grad_weight(const KernelArgs& a) {
  const auto& at = std::get<DenseGradWeightAttrs>(a.node.attrs);
  const bool wt = at.transpose_w;
  const bool assign = at.assign_in_first_minibatch && a.run.minibatch == a.run.first_minibatch;
  const TensorArg& grad = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& dy = a.in[2];
  const int64_t K = x.shape.last(), N = dy.shape.last(), M = x.shape.rows();
  LOOM_ASSERT(dy.shape.rows() == M && grad.shape.numel() == K * N && grad.dtype == DType::f32);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t m = 0; m < M; ++m) acc += rnd(at.compute, ld(x, m * K + k)) * ld(dy, m * N + n);
      const int64_t i = wt ? n * K + k : k * N + n;
      const double dw = rnd(at.compute, acc);
      st(grad, i, assign ? dw : ld(grad, i) + dw);  // one f32 rounding of the exact sum
    }
}

// out[j] = round_dtype(Σ_i x[i·J + j]) where J = numel of the kept trailing dims.
void ref_sum_leading(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t J = y.shape.numel();
  LOOM_ASSERT(J > 0 ? x.shape.numel() % J == 0 : x.shape.numel() == 0);
  const int64_t I = J > 0 ? x.shape.numel() / J : 0;
  for (int64_t j = 0; j < J; ++j) {
    double acc = 0;
    for (int64_t i = 0; i < I; ++i) acc += ld(x, i * J + j);
    st(y, j, acc);
  }
}

namespace {
volatile double g_matmul_sink = 0;
}  // namespace

// The profiler's yardstick for this backend: a naive triple loop accumulating in double, as its
// dense kernel does for every dtype (192³, best of 3).
double ReferenceBackend::measure_matmul_gflops(DType) {
  constexpr int64_t n = 192;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 17) - 8.f;
    b[i] = static_cast<float>(i % 13) - 6.f;
  }
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < n; ++k) acc += static_cast<double>(a[i * n + k]) * b[k * n + j];
        c[i * n + j] = static_cast<float>(acc);
      }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    double sum = 0;  // keeps the loop observable
    for (float v : c) sum += v;
    g_matmul_sink = sum;
  }
  return 2.0 * n * n * static_cast<double>(n) / best * 1e-9;
}

}  // namespace loom
