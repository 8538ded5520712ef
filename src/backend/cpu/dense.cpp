// CPU kernels for dense and its backward ops (graph/ops/dense.cpp): fp32 sgemm (oneDNN), or
// oneDNN's bf16 matmul for bfloat16 compute on CPUs with AVX512-BF16.
//
// Operands are rounded to the compute dtype. With bfloat16 compute on a CPU that has the bf16
// dot-product instructions they are multiplied as bf16 (gemm_bf16.cpp); otherwise 16-bit values
// are widened to f32 first: bf16/f16 values are exact in f32 and their products exact too, so
// sgemm on the widened copies is exactly "fp32 accumulation of the compute-dtype products", and
// so is the bf16 matmul (up to summation order and subnormals). The f32 result is then rounded to
// the compute dtype, as the reference backend does in double.
#include <algorithm>

#include "backend/cpu/cpu_util.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// Tiles per GEMM: the machine's processor count rounded up to a power of two, 4 to 16. Each tile
// packs its own A rows and B columns, so tiles beyond what the cores need only add packing: on a
// 2-core machine 4 tiles were within 3 % of the best of 4, 8 and 16 on 12 of the 13 benchmark
// GEMMs, and 4-15 % faster than the earlier rows-first grid on 8 (bench/blas/tiles.cpp).
int64_t tile_count() {
  static const int64_t n = [] {
    int64_t t = 4;
    while (t < 16 && t < omp_get_num_procs()) t *= 2;
    return t;
  }();
  return n;
}

// The grid for C[M, N]: the most tiles (up to tile_count(), powers of two per side) whose tiles
// are at least 64 × 128, arranged to pack the least: tr row tiles each pack all of B's columns
// they use and tc column tiles all of A's rows, so the packed volume is K·(tc·M + tr·N). GEMMs
// under 2^21 multiply-adds stay whole.
void tile_grid(int64_t M, int64_t N, int64_t K, int64_t& tr, int64_t& tc) {
  constexpr int64_t kMinRows = 64, kMinCols = 128, kMinMacs = int64_t{1} << 21;
  tr = tc = 1;
  if (M * N * K < kMinMacs) return;
  for (int64_t t = tile_count(); t > 1; t /= 2) {
    int64_t best = -1;
    for (int64_t r = 1; r <= t; r *= 2) {
      const int64_t c = t / r;
      if ((r > 1 && M / r < kMinRows) || (c > 1 && N / c < kMinCols)) continue;
      const int64_t packed = c * M + r * N;
      if (best < 0 || packed < best) {
        best = packed;
        tr = r;
        tc = c;
      }
    }
    if (best >= 0) return;
  }
}

// What happens to each tile of C right after its sgemm, while it is still in cache: C = round_c(C)
// (when round_first), + bias[n] (when bias), then a store to out (out's dtype, one more rounding)
// unless out is C itself, or with accumulate out += C (out f32, laid out like C). The same
// per-element operations as a separate pass, without the pass.
struct Epilogue {
  DType c = DType::f32;
  bool round_first = false;
  const float* bias = nullptr;  // [N] f32, already round_c'd
  const TensorArg* out = nullptr;
  bool accumulate = false;
  void operator()(float* C, int64_t N, int64_t m0, int64_t m1, int64_t n0, int64_t n1) const {
    const bool store = !(out->dtype == DType::f32 && out->data == C);
    if (!store && !round_first && !bias) return;
    for (int64_t m = m0; m < m1; ++m) {
      float* row = C + m * N + n0;
      if (round_first) round_inplace(row, n1 - n0, c);
      if (bias)
        for (int64_t n = n0; n < n1; ++n) row[n - n0] += bias[n];
      if (accumulate) {
        float* o = out->as<float>() + m * N + n0;
        for (int64_t n = 0; n < n1 - n0; ++n) o[n] += row[n];
      } else if (store) {
        store_f32(row, out->data, out->dtype, m * N + n0, n1 - n0);
      }
    }
  }
};

// C[M, N] = op(A) · op(B) in row-major f32 (A is [M, K], or [K, M] when ta; B is [K, N], or
// [N, K] when tb; T = float, or uint16_t for bfloat16 bits), each tile finished by `epi`;
// K == 0 gives zeros (sgemm rejects ld 0).
//
// A BLAS's own threading is not bitwise reproducible across thread counts (its partition and
// kernel choice depend on the thread count), so we split C into a grid of tiles chosen from the
// shape and the machine (tile_grid), never from the `threads` setting, and call a single-threaded
// GEMM per tile from our own OpenMP loop. Each element's result then depends only on the shape,
// the machine and the values.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, const T* B, float* C, const Epilogue& epi) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    std::fill(C, C + M * N, 0.f);
    epi(C, N, 0, M, 0, N);
    return;
  }
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  int64_t tr, tc;
  tile_grid(M, N, K, tr, tc);
  const int64_t ntiles = tr * tc;
#pragma omp parallel for schedule(dynamic, 1) if (ntiles > 1)
  for (int64_t t = 0; t < ntiles; ++t) {
    // Inside the region nthreads-var is this implicit task's own copy: the GEMM reads it and
    // runs single-threaded, whatever the team size.
    omp_set_num_threads(1);
    const int64_t i = t / tc, j = t % tc;
    const int64_t m0 = i * M / tr, m1 = (i + 1) * M / tr, n0 = j * N / tc, n1 = (j + 1) * N / tc;
    const T* a = ta ? A + m0 : A + m0 * lda;
    const T* b = tb ? B + n0 * ldb : B + n0;
    gemm_rm(ta, tb, m1 - m0, n1 - n0, K, a, lda, b, ldb, C + m0 * N + n0, N);
    epi(C, N, m0, m1, n0, n1);
  }
}

// Calls f(A', B') with the two GEMM operands of a dense-family op: A rounded to dtype ra and B to
// rb (f32: as they are). As bfloat16 bits when the compute dtype c is bf16, both operands then
// hold bf16 values and the CPU multiplies bf16 natively (about twice the f32 rate); as f32
// otherwise. Both are exact "fp32 accumulation of the compute-dtype products".
template <class F>
void with_operands(DType c, const TensorArg& A, DType ra, const TensorArg& B, DType rb, F&& f) {
  const auto bf16_valued = [](const TensorArg& t, DType r) {
    return r == DType::bf16 || (r == DType::f32 && t.dtype == DType::bf16);
  };
  if (c == DType::bf16 && bf16_valued(A, ra) && bf16_valued(B, rb) && bf16_gemm_available())
    f(bf16_rounded(A, kOuterSlot + 0), bf16_rounded(B, kOuterSlot + 1));
  else
    f(f32_rounded(A, ra, kOuterSlot + 0), f32_rounded(B, rb, kOuterSlot + 1));
}

}  // namespace

// y[m, n] = round_c(Σ_k round_c(x[m, k]) · round_c(W[k, n]))  (+ bias: round_c(y + round_c(b[n]))).
void cpu_dense(const KernelArgs& a) {
  const DType c = std::get<DenseAttrs>(a.node.attrs).compute;
  const bool wt = std::get<DenseAttrs>(a.node.attrs).transpose_w;  // W stored [N, K]
  const TensorArg& x = a.in[0];
  const TensorArg& w = a.in[1];
  const TensorArg& y = a.out[0];
  const int64_t K = w.shape[wt ? 1 : 0], N = w.shape[wt ? 0 : 1], M = x.shape.rows();
  LOOM_ASSERT(x.shape.last() == K && y.shape.rows() == M && y.shape.last() == N && y.dtype == c);
  float* acc = y.dtype == DType::f32 ? y.as<float>() : scratch(kOuterSlot + 2, M * N);
  // With a bias: round_c(Σ) (a no-op for f32), + round_c(b), and the final round_c by the store.
  const float* bs = a.in.size() < 3 ? nullptr : f32_rounded(a.in[2], c, kOuterSlot + 3);
  with_operands(c, x, c, w, c, [&](const auto* xs, const auto* ws) {
    gemm(false, wt, M, N, K, xs, ws, acc, Epilogue{c, bs != nullptr, bs, &y});
  });
}

// dx[m, k] = round_out(round_c(Σ_n dy[m, n] · round_c(W[k, n]))): sgemm NT.
void cpu_dense_grad_input(const KernelArgs& a) {
  const auto& at = std::get<DenseGradAttrs>(a.node.attrs);
  const TensorArg& dy = a.in[0];
  const TensorArg& w = a.in[1];
  const TensorArg& dx = a.out[0];
  const bool wt = at.transpose_w;
  const int64_t K = w.shape[wt ? 1 : 0], N = w.shape[wt ? 0 : 1], M = dy.shape.rows();
  LOOM_ASSERT(dy.shape.last() == N && dx.shape.rows() == M && dx.shape.last() == K && dx.dtype == at.out_dtype);
  float* acc = dx.dtype == DType::f32 ? dx.as<float>() : scratch(kOuterSlot + 2, M * K);
  // dy[M, N] · Wᵀ, or · W when W is stored [N, K], with dy as is (normally in c already); round_c
  // first unless the store to out_dtype is that same rounding (or c is f32).
  with_operands(at.compute, dy, DType::f32, w, at.compute, [&](const auto* dys, const auto* ws) {
    gemm(false, !wt, M, K, N, dys, ws, acc,
         Epilogue{at.compute, rounding_changes(at.out_dtype, at.compute), nullptr, &dx});
  });
}

// grad[k, n] += round_c(Σ_m round_c(x[m, k]) · dy[m, n]): a TN GEMM. When this assigns (the
// buffer's first writer, minibatch 0) the GEMM writes the gradient buffer itself; otherwise into
// scratch, each tile added to the gradient by the epilogue while it is in cache. Either way the
// values are those of the unfused dW followed by grad_accumulate, bit for bit.
// grad is [K, N] ([N, K] with transpose_w) in row-major order, whatever its shape.
void cpu_dense_grad_weight(const KernelArgs& a) {
  const auto& at = std::get<DenseGradWeightAttrs>(a.node.attrs);
  const DType c = at.compute;
  const bool wt = at.transpose_w;  // grad stored [N, K]
  const bool assign = at.assign_in_first_minibatch && a.run.minibatch == a.run.first_minibatch;
  const TensorArg& grad = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& dy = a.in[2];
  const int64_t K = x.shape.last(), N = dy.shape.last(), M = x.shape.rows();
  LOOM_ASSERT(dy.shape.rows() == M && grad.shape.numel() == K * N && grad.dtype == DType::f32);
  float* acc = assign ? grad.as<float>() : scratch(kOuterSlot + 2, K * N);
  const Epilogue epi{c, c != DType::f32, nullptr, &grad, !assign};
  with_operands(c, x, c, dy, DType::f32, [&](const auto* xs, const auto* dys) {
    if (wt)
      gemm(true, false, N, K, M, dys, xs, acc, epi);  // dyᵀ · x
    else
      gemm(true, false, K, N, M, xs, dys, acc, epi);  // xᵀ · dy
  });
}

// out[j] = round_dtype(Σ_i x[i·J + j]), J = numel of the kept trailing dims, f32 accumulation.
// The rows are split into a number of chunks that depends only on I (the row count); each chunk
// sums its rows in order into its own partial row, and the partials are added in chunk order.
// Columns are processed in fixed blocks so the row reads stay contiguous.
void cpu_sum_leading(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t J = y.shape.numel();
  if (J == 0) return;
  const int64_t I = x.shape.numel() / J;
  LOOM_ASSERT(I * J == x.shape.numel());
  constexpr int64_t kColBlock = 512;
  constexpr int64_t kRowsPerChunk = 256, kMaxChunks = 32;
  const int64_t nchunks = std::clamp<int64_t>(I / kRowsPerChunk, 1, kMaxChunks);
  const int64_t ncb = ceil_div(J, kColBlock);
  float* part = scratch(kOuterSlot + 0, nchunks * J);
#pragma omp parallel for schedule(static) collapse(2) if (I * J >= kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch)
    for (int64_t cb = 0; cb < ncb; ++cb) {
      const int64_t i0 = ch * I / nchunks, i1 = (ch + 1) * I / nchunks;
      const int64_t j0 = cb * kColBlock, w = std::min(kColBlock, J - j0);
      float acc[kColBlock];
      float buf[kColBlock];
      std::fill(acc, acc + w, 0.f);
      for (int64_t i = i0; i < i1; ++i) {
        const float* r;
        if (x.dtype == DType::f32) {
          r = x.as<float>() + i * J + j0;
        } else {
          load_f32(x.data, x.dtype, i * J + j0, buf, w);
          r = buf;
        }
        for (int64_t j = 0; j < w; ++j) acc[j] += r[j];
      }
      std::copy(acc, acc + w, part + ch * J + j0);
    }
  for (int64_t ch = 1; ch < nchunks; ++ch)
    for (int64_t j = 0; j < J; ++j) part[j] += part[ch * J + j];
  store_f32(part, y.data, y.dtype, 0, J);
}

}  // namespace loom
