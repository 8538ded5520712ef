// The tiled GEMM behind the dense family (dense.cpp), for CPU kernels that run products of their
// own (linear_cross_entropy.cpp): one product C[M, N] = op(A)·op(B) on operands rounded to the
// compute dtype, split into a tile grid fixed by the shape and the machine, each tile finished
// by an epilogue while it is in cache. Its workspace comes from gemm_spans (workspace.h).
#pragma once
#include <cstdint>

#include "backend/cpu/cpu_util.h"

namespace loom::cpuk {

// What happens to each tile of C right after its GEMM, while it is still in cache: C = round_c(C)
// (when round_first), + bias[n] (when bias), round_c(C) again (when round_last), then a store to out
// (out's dtype, one more rounding), or with accumulate out += C (out f32, [M, N] like C) — unless the
// tile is out's own memory (the GEMM wrote an f32 out directly). The same per-element operations as
// a separate pass, without the pass.
struct Epilogue {
  DType c = DType::f32;
  bool round_first = false;
  const float* bias = nullptr;  // [N] f32, already round_c'd
  // An f32 out holding compute-dtype values (the fused head's biased logits): the rounding a store
  // to the compute dtype would give.
  bool round_last = false;
  const TensorArg* out = nullptr;
  bool accumulate = false;
  int64_t out_ld = 0;  // out's row stride in elements when it is a column block of a wider matrix; 0: N
  // Tile rows [m0, m1) × columns [n0, n1) of C, at t with row stride ldt (in out itself when
  // in_place); C is N wide.
  void operator()(bool in_place, float* t, int64_t ldt, int64_t N, int64_t m0, int64_t m1, int64_t n0,
                  int64_t n1) const {
    const bool store = !in_place;
    const int64_t ld = out_ld > 0 ? out_ld : N;
    if (!store && !round_first && !bias && !round_last) return;
    for (int64_t m = m0; m < m1; ++m) {
      float* row = t + (m - m0) * ldt;
      if (round_first) round_inplace(row, n1 - n0, c);
      if (bias)
        for (int64_t n = n0; n < n1; ++n) row[n - n0] += bias[n];
      if (round_last) round_inplace(row, n1 - n0, c);
      if (accumulate) {
        float* o = out->as<float>() + m * ld + n0;
        for (int64_t n = 0; n < n1 - n0; ++n) o[n] += row[n];
      } else if (store) {
        store_f32(row, out->data, out->dtype, m * ld + n0, n1 - n0);
      }
    }
  }
};

// One dense-family product C[M, N] = op(A)·op(B) (A is [M, K], or [K, M] when ta; B is [K, N], or
// [N, K] when tb), A's elements rounded to ra and B's to rb (f32: as they are), compute dtype c,
// finished tile by tile into `out` by an epilogue.
//
// The operands are multiplied as bfloat16 bits through oneDNN's matmul (`native`) when c is bf16,
// both operands hold bf16 values and the CPU has the bf16 dot products (about twice the f32 rate);
// as f32 through sgemm otherwise. Both are exact "fp32 accumulation of the compute-dtype products".
//
// C is split into a grid of tiles chosen from the shape and the machine (tile_grid), never from the
// thread count, and each tile is one single-threaded GEMM call from our own OpenMP loop: a BLAS's
// own threading is not bitwise reproducible across thread counts (its partition and kernel choice
// depend on them), so each element's result depends only on the shape, the machine and the values.
// When C is out itself (`in_place`: out is f32 and the GEMM assigns it) the calls write out, in
// row blocks of about kEpilogueRows when the epilogue adds a bias (Tiles::epilogue_blocks);
// otherwise each thread forms its tile in a tile buffer of its own and the epilogue converts or adds
// it into out, so no [M, N] f32 buffer exists. When op(A) is A itself, a tile goes through its
// buffer in blocks of at most kBlockRows rows, one GEMM call each, so the buffer's size does not
// grow with the batch; when A is transposed the tile is one call (a row block of a TN product sums
// in another order). A tile buffer keeps the density of a tile inside a whole [M, N] C: rows exactly
// as wide as the tile when the grid has one column of tiles, wider otherwise. oneDNN's bf16 matmul
// picks its kernel by whether C's rows are dense, and the two give different summation orders; the
// strided ones all agree, and so do row blocks of an NN or NT product and the whole
// (CpuOps.DenseGemmTileBuffersAgree checks both). A row vector split along K (tile_grid) is the
// exception: its tiles write partial rows, summed and finished after them, and it has no tile
// buffer.
struct Gemm {
  bool ta, tb;
  int64_t M, N, K;
  const TensorArg& A;
  DType ra;
  const TensorArg& B;
  DType rb;
  DType c;
  const TensorArg& out;
  bool in_place;
  // Whether the epilogue adds a bias (Epilogue::bias): a float32 product in place then runs in row
  // blocks, and its sgemm calls are smaller (sizes the plan from the layout, gemm_spans).
  bool bias = false;

  bool native() const {
    const auto bf16_valued = [](const TensorArg& t, DType r) {
      return r == DType::bf16 || (r == DType::f32 && t.dtype == DType::bf16);
    };
    return c == DType::bf16 && bf16_valued(A, ra) && bf16_valued(B, rb) && bf16_gemm_available();
  }
  int64_t lda() const { return ta ? M : K; }
  int64_t ldb() const { return tb ? K : N; }
  bool gemv() const { return M == 1 && !ta; }  // the whole product is one row (simd::gemv)
};

// The workspace of a Gemm (workspace.h): each operand's converted copy when it needs one (bf16 bits
// when native, rounded f32 otherwise), and per thread of the tile loop a tile buffer of one row
// block (unless in_place) and, when native, oneDNN's scratchpad for the largest of its calls; for a
// row vector split along K, its partial rows instead of tile buffers. Through sgemm, the largest of
// its calls' own buffers per thread goes to ws.library (sgemm_call_bytes). `either`:
// the product runs in place on some runs and not on others (dense_grad_weight assigns in minibatch
// 0 and accumulates after), so the workspace serves both.
struct GemmSpans {
  void* a = nullptr;  // uint16_t when native, float otherwise
  void* b = nullptr;
  PerThread<float> tile;
  PerThread<std::byte> pad;
  float* partial = nullptr;  // [tk, N] a split row vector's partial rows (tile_grid)
  int team = 1;
};

// The spans g needs (see GemmSpans), taken from ws.
GemmSpans gemm_spans(Bump& ws, const Gemm& g, bool either = false);
// Converts g's operands into their spans (as bf16 bits when native, as rounded f32 otherwise) and
// runs it, each tile finished by epi.
void run_gemm(const Gemm& g, const GemmSpans& s, const Epilogue& epi);

}  // namespace loom::cpuk
