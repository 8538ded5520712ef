// The quantized kernel is never widened whole: C = A · op(W) runs as column tiles of C, each thread
// widening the tile's slice of W (core/quant.h's dequantize_tile, then rounded to the compute
// dtype) into its own buffer and multiplying it by sgemm, in row blocks of C formed in a second
// buffer and finished into the output while in cache. The workspace is the rounded float32 copy of
// A when it needs one, plus per thread one widened slice and one C block: it grows with K or N,
// never with K · N.
//
//   dense:            y[M, N]  = x[M, K] · W,  a tile is Wᵀ[n0:n1, 0:K] (whole rows of the stored
//                     Wᵀ, contiguous codes), multiplied transposed.
//   dense_grad_input: dx[M, K] = dy[M, N] · Wᵀ, a tile is Wᵀ[0:N, k0:k1].
//
// Each tile is one fixed-shape product whatever the thread count, so results depend on the shape
// and the values only; they are those of the float32 path on the widened W (the reference's).
// sgemm is used on every CPU: a bf16-native product would need the tile in bf16 bits, left for later.
#include "backend/cpu/dense_quant.h"

#include <algorithm>

#include "backend/cpu/cpu_util.h"
#include "core/quant.h"
#include "graph/graph.h"

namespace loom::cpuk {

namespace {

constexpr int64_t kTileCols = 64;     // columns of C per tile
constexpr int64_t kQuantBlockRows = 1024;  // rows of C per GEMM call

// C[M, J] = A[M, L] · B with B the widened W: [L, J] (Wᵀ's columns, grad) or transposed [J, L] (dense).
struct QuantGemm {
  const TensorArg& A;
  DType ra;  // A's elements rounded to this (f32: as they are)
  const TensorArg& w;
  int64_t K, N;  // W [K, N]
  bool grad;     // dense_grad_input: J = K, L = N; dense: J = N, L = K
  DType c;
  int64_t M() const { return A.shape.rows(); }
  int64_t J() const { return grad ? K : N; }
  int64_t L() const { return grad ? N : K; }
  int64_t tiles() const { return ceil_div(J(), kTileCols); }
};

struct QuantSpans {
  float* a = nullptr;
  PerThread<float> tile;  // [kTileCols · L] widened W
  PerThread<float> c;     // [min(M, kQuantBlockRows) · kTileCols]
  int team = 1;
};
QuantSpans quant_spans(Bump& ws, const QuantGemm& g) {
  QuantSpans s;
  if (g.M() == 0 || g.J() == 0) return s;
  if (needs_f32_copy(g.A, g.ra)) s.a = ws.take<float>(g.A.shape.numel());
  s.team = ws.team(true, g.tiles());
  s.tile = ws.per_thread<float>(kTileCols * g.L(), s.team);
  s.c = ws.per_thread<float>(std::min(g.M(), kQuantBlockRows) * kTileCols, s.team);
  // run_quant's sgemm calls: full and last row blocks × full and last column tiles.
  const int64_t L = g.L();
  int64_t call = 0;
  for (const int64_t m : {std::min(g.M(), kQuantBlockRows), (g.M() - 1) % kQuantBlockRows + 1})
    for (const int64_t jt : {std::min(g.J(), kTileCols), (g.J() - 1) % kTileCols + 1})
      call = std::max(call, sgemm_call_bytes(false, !g.grad, m, jt, L, L, g.grad ? jt : L, jt));
  ws.library(call, s.team);
  return s;
}

// Runs g, finishing row m's columns [j0, j1) of C (row, f32) by fin(m, j0, j1, row).
template <class Fin>
void run_quant(const QuantGemm& g, const QuantSpans& s, Fin&& fin) {
  const int64_t M = g.M(), J = g.J(), L = g.L();
  if (M == 0 || J == 0) return;
  const float* A = f32_rounded(g.A, g.ra, s.a);
#pragma omp parallel for schedule(dynamic, 1) num_threads(s.team)
  for (int64_t t = 0; t < g.tiles(); ++t) {
    omp_set_num_threads(1);  // sgemm single-threaded inside the region (dense.cpp's run_tiles)
    const int64_t j0 = t * kTileCols, j1 = std::min(J, j0 + kTileCols), jt = j1 - j0;
    float* B = s.tile.mine();
    if (g.grad)
      dequantize_tile(g.w.dtype, g.w.data, g.K, g.N, 0, g.N, j0, j1, B, jt);  // [N, jt]
    else
      dequantize_tile(g.w.dtype, g.w.data, g.K, g.N, j0, j1, 0, g.K, B, g.K);  // [jt, K]
    round_inplace(B, jt * L, g.c);
    float* C = s.c.mine();
    for (int64_t m0 = 0; m0 < M; m0 += kQuantBlockRows) {
      const int64_t m1 = std::min(M, m0 + kQuantBlockRows);
      if (L == 0)
        std::fill_n(C, (m1 - m0) * jt, 0.f);
      else
        gemm_rm(false, !g.grad, m1 - m0, jt, L, A + m0 * L, L, B, g.grad ? jt : L, C, jt, nullptr);
      for (int64_t m = m0; m < m1; ++m) fin(m, j0, j1, C + (m - m0) * jt);
    }
  }
}

QuantGemm dense_q(const KernelArgs& a) {
  const auto& at = std::get<DenseAttrs>(a.node.attrs);
  const TensorArg& w = a.in[1];
  LOOM_ASSERT(!at.transpose_w && a.in[0].shape.last() == w.shape[0] && a.out[0].dtype == at.compute);
  return QuantGemm{a.in[0], at.compute, w, w.shape[0], w.shape[1], false, at.compute};
}
QuantSpans dense_q_spans(Bump& ws, const KernelArgs& a) { return quant_spans(ws, dense_q(a)); }

QuantGemm grad_q(const KernelArgs& a) {
  const auto& at = std::get<DenseGradAttrs>(a.node.attrs);
  const TensorArg& w = a.in[1];
  LOOM_ASSERT(!at.transpose_w && a.in[0].shape.last() == w.shape[1] && a.out[0].dtype == at.out_dtype);
  return QuantGemm{a.in[0], DType::f32, w, w.shape[0], w.shape[1], true, at.compute};
}
QuantSpans grad_q_spans(Bump& ws, const KernelArgs& a) { return quant_spans(ws, grad_q(a)); }

}  // namespace

// y = round_c(Σ) (+ bias: round_c(round_c(Σ) + round_c(b))), as cpu_dense.
void dense_quant(const KernelArgs& a) {
  Bump ws(a.workspace);
  const QuantSpans s = dense_q_spans(ws, a);
  const QuantGemm g = dense_q(a);
  const TensorArg& y = a.out[0];
  const TensorArg* b = a.in.size() == 3 ? &a.in[2] : nullptr;
  run_quant(g, s, [&](int64_t m, int64_t j0, int64_t j1, float* row) {
    if (b) {
      round_inplace(row, j1 - j0, g.c);
      for (int64_t j = j0; j < j1; ++j) row[j - j0] += round_to(g.c, load_as_f32(b->data, b->dtype, j));
    }
    store_f32(row, y.data, y.dtype, m * g.N + j0, j1 - j0);
  });
}
KernelScratch dense_quant_workspace(const KernelArgs& a) { return workspace_of<dense_q_spans>(a); }

// dx = round_out(round_c(Σ)), as cpu_dense_grad_input.
void dense_quant_grad_input(const KernelArgs& a) {
  Bump ws(a.workspace);
  const QuantSpans s = grad_q_spans(ws, a);
  const QuantGemm g = grad_q(a);
  const TensorArg& dx = a.out[0];
  const bool round = rounding_changes(dx.dtype, g.c);
  run_quant(g, s, [&](int64_t m, int64_t j0, int64_t j1, float* row) {
    if (round) round_inplace(row, j1 - j0, g.c);
    store_f32(row, dx.data, dx.dtype, m * g.K + j0, j1 - j0);
  });
}
KernelScratch dense_quant_grad_input_workspace(const KernelArgs& a) { return workspace_of<grad_q_spans>(a); }

}  // namespace loom::cpuk
