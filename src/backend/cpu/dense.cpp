// CPU kernels for dense and its backward ops (graph/ops/dense.cpp): fp32 sgemm (oneDNN), or
// oneDNN's bf16 matmul for bfloat16 compute on CPUs with AVX512-BF16 or AMX.
//
// Operands are rounded to the compute dtype. With bfloat16 compute on a CPU that has the bf16
// dot-product instructions they are multiplied as bf16 (gemm_bf16.cpp); otherwise 16-bit values
// are widened to f32 first: bf16/f16 values are exact in f32 and their products exact too, so
// sgemm on the widened copies is exactly "fp32 accumulation of the compute-dtype products", and
// so is the bf16 matmul (up to summation order and subnormals). The f32 result is then rounded to
// the compute dtype, as the reference backend does in double.
//
// A single row of C (M = 1 with op(A) = A: a decoded token) is a row vector times a matrix and goes
// to simd::gemv, which streams B once instead of packing it, in column tiles or K chunks of whole
// rows (tile_grid); the same rounding applies.
//
// Workspace (workspace.h): the converted operands, per thread one tile of C when C is not the
// output itself, oneDNN's bf16 scratchpad, and a split row vector's partial rows; each kernel's
// layout function sizes it for the plan.
#include <malloc.h>

#include <algorithm>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_util.h"
#include "backend/cpu/dense_quant.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/simd/gemv.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// Tiles per GEMM: the machine's processor count rounded up to a power of two, 4 to 16. Each tile
// packs its own A rows and B columns, so tiles beyond what the cores need only add packing; a few
// more tiles than cores balance the dynamic schedule (bench/blas/tiles.cpp measures the grids).
int64_t tile_count() {
  static const int64_t n = [] {
    int64_t t = 4;
    while (t < 16 && t < omp_get_num_procs()) t *= 2;
    return t;
  }();
  return n;
}

int64_t& processors() {
  static int64_t n = omp_get_num_procs();
  return n;
}

}  // namespace

// oneDNN's sgemm mallocs a packing buffer in every call and frees it before returning (cpu_util.h
// gemm_rm; up to 16 MB per thread at a GPT-2 head tile). glibc's default mmap threshold rises to
// the size of each mmapped chunk freed (up to 32 MiB), so after the first large call these
// buffers, and every host block below that size, come from the malloc heaps, which keep freed
// chunks resident and fragment: a run's RSS then grows tens of MB past its plan over the steps
// (docs/memory-study-notes.md). Setting the threshold turns that rise off; at glibc's default of
// 128 KiB every large block is mapped on malloc and unmapped on free.
CpuBackend::CpuBackend() : HostBackend(kCpuKernels, kCpuWorkspace) {
  static const int pinned = mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  (void)pinned;
}

int64_t cpuk::row_vector_processors() { return processors(); }
void cpuk::set_row_vector_processors(int64_t n) { processors() = n; }

namespace {

// The grid for C[M, N]: the most tiles (up to tile_count(), powers of two per side) whose tiles
// are at least 64 × 128, arranged to pack the least: tr row tiles each pack all of B's columns
// they use and tc column tiles all of A's rows, so the packed volume is K·(tc·M + tr·N). GEMMs
// under 2^21 multiply-adds stay whole. With `rows_only` (bf16 on AMX with op(A) = A and C at
// least as tall as wide) the tiles are whole rows of C: A's row blocks, all of B and C's row
// blocks are dense, which the AMX kernel needs (gemm_bf16.cpp would copy a column tile's B and C).
// Each row tile packs all of B, so a wide C (GPT-2's head: 256 × 50257 at shape a) keeps the grid
// that packs the least and has its column tiles copied instead.
//
// A row vector (`gemv`: M = 1 with op(A) = A, decoding) packs nothing (simd::gemv) and runs at the
// speed B streams from memory, so every core's bandwidth should help. With B [K, N] it is split
// along K into tk chunks of whole rows of B, each one contiguous stream into a partial row, the
// partial rows then summed in chunk order: column tiles of B [K, N] read a short strided segment of
// every row, which the prefetchers follow badly (GPT-2's four projections streamed 23 GB/s in
// column halves and 29 GB/s in row halves on a 2-core Zen 4 whose plain read reaches 33). tk is a
// power of two, up to 16, with chunks of at least 256 rows and 2^16 multiply-adds: fixed by the
// shape, as it sets the summation order. Column tiles (at least 256 columns and 2^16 multiply-adds
// each; they leave the order alone) are added while the tiles are fewer than the processors — with
// Bᵀ stored [N, K] (the tied head) they are the only split, whole rows of Bᵀ each, up to tile_count().
void tile_grid(int64_t M, int64_t N, int64_t K, bool gemv, bool tb, bool rows_only, int64_t& tr, int64_t& tc,
               int64_t& tk) {
  constexpr int64_t kMinRows = 64, kMinCols = 128, kMinMacs = int64_t{1} << 21;
  tr = tc = tk = 1;
  if (gemv) {
    constexpr int64_t kMinGemvRows = 256, kMinGemvCols = 256, kMinGemvMacs = int64_t{1} << 16;
    if (!tb)
      while (tk < 16 && K / (2 * tk) >= kMinGemvRows && N * K / (2 * tk) >= kMinGemvMacs) tk *= 2;
    const int64_t tiles = tb ? tile_count() : processors();
    while (tk * tc < tiles && N / (2 * tc) >= kMinGemvCols && N * K / (2 * tk * tc) >= kMinGemvMacs) tc *= 2;
    return;
  }
  if (M * N * K < kMinMacs) return;
  for (int64_t t = tile_count(); t > 1; t /= 2) {
    int64_t best = -1;
    for (int64_t r = rows_only ? t : 1; r <= t; r *= 2) {
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

// Rows of a tile formed in its buffer per GEMM call (see Gemm). Each call packs the tile's columns
// of B again, so blocks are kept long enough for that to cost little next to the block's product.
constexpr int64_t kBlockRows = 4096;
// Rows per sgemm call of a float32 dense's tile, which the GEMM writes into out itself and the
// epilogue then adds the bias to: the epilogue finds the block in L2 instead of reading the whole
// tile back from L3 or memory (64 rows; 32 and 128 measured within two percent of it at the
// benchmark shapes, docs/performance.md's appendix). A tile's last block takes the rows left when fewer than 2 · kEpilogueRows
// remain, so no call has fewer rows than this unless the whole tile does (oneDNN's sgemm sums
// differently for a few rows).
constexpr int64_t kEpilogueRows = 64;

// The tile grid of a Gemm, the shape of each of its tiles and, for a tile formed in a tile buffer,
// its row blocks.
struct Tiles {
  int64_t tr = 1, tc = 1;
  int64_t tk = 1;  // K chunks of a split row vector (tile_grid): tiles are then chunk-major, tk · tc
  int64_t M, N, K;
  int64_t block;  // rows per GEMM call into a tile buffer
  explicit Tiles(const Gemm& g) : M(g.M), N(g.N), K(g.K) {
    tile_grid(g.M, g.N, g.K, g.gemv(), g.tb, g.native() && !g.ta && g.M >= g.N && bf16_gemm_amx(), tr, tc, tk);
    block = g.ta ? max_rows() : std::min(max_rows(), kBlockRows);
  }
  int64_t count() const { return tr * tc * tk; }
  // Whether a tile written into out itself goes in row blocks of kEpilogueRows (see there), each
  // finished by epi before the next: a float32 dense with a bias, whose blocks are row blocks of
  // one sgemm product (op(A) is A: on AVX-512 they give the whole call's bits,
  // CpuOps.DenseGemmTileBuffersAgree; with AVX2, results that depend on the shape alone too).
  bool epilogue_blocks(const Gemm& g) const { return g.in_place && !g.ta && !g.native() && tk == 1 && g.bias; }
  // f(b0, b1) for the row blocks of tile t written into out (see epilogue_blocks).
  template <class F>
  void epilogue_row_blocks(int64_t t, F&& f) const {
    for (int64_t b0 = m0(t); b0 < m1(t);) {
      const int64_t b1 = m1(t) - b0 < 2 * kEpilogueRows ? m1(t) : b0 + kEpilogueRows;
      f(b0, b1);
      b0 = b1;
    }
  }
  // A split row vector's K chunk of tile t; its tiles have no row range (m0, m1, blocks).
  int64_t k0(int64_t t) const { return t / tc * K / tk; }
  int64_t k1(int64_t t) const { return (t / tc + 1) * K / tk; }
  int64_t m0(int64_t t) const {
    LOOM_ASSERT(tk == 1, "a split row vector's tiles have no row range");
    return t / tc * M / tr;
  }
  int64_t m1(int64_t t) const {
    LOOM_ASSERT(tk == 1, "a split row vector's tiles have no row range");
    return (t / tc + 1) * M / tr;
  }
  int64_t n0(int64_t t) const { return t % tc * N / tc; }
  int64_t n1(int64_t t) const { return (t % tc + 1) * N / tc; }
  // Row stride of a tile buffer for tile t (see Gemm): dense when C's rows are, else strided.
  int64_t ld(int64_t t) const { return tc == 1 ? N : (n1(t) - n0(t) + 16) / 16 * 16; }
  int64_t max_rows() const { return ceil_div(M, tr); }
  int64_t max_ld() const { return tc == 1 ? N : (ceil_div(N, tc) + 16) / 16 * 16; }
  // f(b0, b1) for the row blocks [b0, b1) of tile t that go through its buffer.
  template <class F>
  void blocks(int64_t t, F&& f) const {
    for (int64_t b0 = m0(t); b0 < m1(t); b0 += block) f(b0, std::min(m1(t), b0 + block));
  }
};

}  // namespace

GemmSpans cpuk::gemm_spans(Bump& ws, const Gemm& g, bool either) {
  GemmSpans s;
  if (g.M == 0 || g.N == 0) return s;
  const bool native = g.native();
  const auto operand = [&](const TensorArg& t, DType r) -> void* {
    if (native) return t.dtype == DType::bf16 ? nullptr : ws.take<uint16_t>(t.shape.numel());
    return needs_f32_copy(t, r) ? ws.take<float>(t.shape.numel()) : nullptr;
  };
  s.a = operand(g.A, g.ra);
  s.b = operand(g.B, g.rb);
  const Tiles tl(g);
  s.team = ws.team(true, tl.count());
  if (tl.tk > 1) {
    LOOM_ASSERT(!either, "a split row vector always assigns its output");
    s.partial = ws.take<float>(tl.tk * g.N);
  } else if (!g.in_place || either) {
    s.tile = ws.per_thread<float>(tl.block * tl.max_ld(), s.team);
  }
  if (g.K == 0 || g.gemv()) return s;  // no GEMM calls; simd::gemv needs no scratchpad
  // The largest call of the tile loop (run_tiles): oneDNN's bf16 scratchpad when native, which
  // the workspace holds, else sgemm's own buffers.
  int64_t call = 0;
  const auto need = [&](int64_t rows, int64_t cols, int64_t ldc) {
    call = std::max(call, native ? bf16_gemm_scratchpad(g.ta, g.tb, rows, cols, g.K, g.lda(), g.ldb(), ldc, 1)
                                 : sgemm_call_bytes(g.ta, g.tb, rows, cols, g.K, g.lda(), g.ldb(), ldc));
  };
  for (int64_t t = 0; t < tl.count(); ++t) {
    const int64_t cols = tl.n1(t) - tl.n0(t);
    if (tl.epilogue_blocks(g))
      tl.epilogue_row_blocks(t, [&](int64_t b0, int64_t b1) { need(b1 - b0, cols, g.N); });
    else if (g.in_place || either)
      need(tl.m1(t) - tl.m0(t), cols, g.N);
    if (!g.in_place || either) tl.blocks(t, [&](int64_t b0, int64_t b1) { need(b1 - b0, cols, tl.ld(t)); });
  }
  if (native)
    s.pad = ws.per_thread<std::byte>(call, s.team);
  else
    ws.library(call, s.team);
  return s;
}

namespace {

// A row vector split into K chunks (tile_grid; B is [K, N]): each tile streams its chunk's whole
// rows (or a column tile of them) into that chunk's partial row, then column blocks are summed and
// finished by the epilogue.
template <class T>
void run_split_gemv(const Gemm& g, const Tiles& tl, const GemmSpans& s, const T* A, const T* B, const Epilogue& epi) {
  constexpr int64_t kSumCols = 512;  // columns per work item of the sum
  const int64_t N = g.N;
#pragma omp parallel num_threads(s.team)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tl.count(); ++t) {
      const int64_t k0 = tl.k0(t), n0 = tl.n0(t);
      simd::gemv(false, tl.n1(t) - n0, tl.k1(t) - k0, A + k0, B + k0 * N + n0, N, s.partial + t / tl.tc * N + n0);
    }
    // The partial rows summed in chunk order into row 0 of the partials (or out itself), then the
    // epilogue.
#pragma omp for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += kSumCols) {
      const int64_t n1 = std::min(N, n0 + kSumCols);
      float* C = g.in_place ? g.out.as<float>() : s.partial;
      if (C != s.partial) std::copy(s.partial + n0, s.partial + n1, C + n0);
      for (int64_t k = 1; k < tl.tk; ++k)  // row by row: each element still sums chunks 0, 1, … in order
        for (int64_t n = n0; n < n1; ++n) C[n] += s.partial[k * N + n];
      epi(g.in_place, C + n0, N, N, 0, 1, n0, n1);
    }
  }
}

// Runs g with element type T (float, or uint16_t for bfloat16 bits) on operands A and B as
// converted, each tile finished by epi. K == 0 gives zeros (sgemm rejects ld 0).
template <class T>
void run_tiles(const Gemm& g, const GemmSpans& s, const T* A, const T* B, const Epilogue& epi) {
  const Tiles tl(g);
  if (tl.tk > 1) return run_split_gemv(g, tl, s, A, B, epi);
  const int64_t lda = g.lda(), ldb = g.ldb();
#pragma omp parallel for schedule(dynamic, 1) num_threads(s.team)
  for (int64_t t = 0; t < tl.count(); ++t) {
    // Inside the region nthreads-var is this implicit task's own copy: the GEMM reads it and
    // runs single-threaded, whatever the team size.
    omp_set_num_threads(1);
    const int64_t n0 = tl.n0(t), n1 = tl.n1(t);
    // Rows [m0, m1) of the tile into C (row stride ldc), then the epilogue.
    const auto rows = [&](int64_t m0, int64_t m1, float* C, int64_t ldc) {
      if (g.K == 0) {
        for (int64_t m = 0; m < m1 - m0; ++m) std::fill_n(C + m * ldc, n1 - n0, 0.f);
      } else {
        const T* a = g.ta ? A + m0 : A + m0 * lda;
        const T* b = g.tb ? B + n0 * ldb : B + n0;
        if (g.gemv())  // the whole product is one row (a block of 1 row of a bigger C is not)
          simd::gemv(g.tb, n1 - n0, g.K, a, b, ldb, C);
        else
          gemm_rm(g.ta, g.tb, m1 - m0, n1 - n0, g.K, a, lda, b, ldb, C, ldc, s.pad.mine());
      }
      epi(g.in_place, C, ldc, g.N, m0, m1, n0, n1);
    };
    const auto in_out = [&](int64_t m0, int64_t m1) { rows(m0, m1, g.out.as<float>() + m0 * g.N + n0, g.N); };
    if (tl.epilogue_blocks(g))
      tl.epilogue_row_blocks(t, in_out);
    else if (g.in_place)
      in_out(tl.m0(t), tl.m1(t));
    else
      tl.blocks(t, [&](int64_t b0, int64_t b1) { rows(b0, b1, s.tile.mine(), tl.ld(t)); });
  }
}

}  // namespace

void cpuk::run_gemm(const Gemm& g, const GemmSpans& s, const Epilogue& epi) {
  if (g.M == 0 || g.N == 0) return;
  LOOM_ASSERT(g.bias == (epi.bias != nullptr), "a Gemm's bias flag must say whether its epilogue adds a bias");
  if (g.native())
    run_tiles(g, s, bf16_rounded(g.A, static_cast<uint16_t*>(s.a)), bf16_rounded(g.B, static_cast<uint16_t*>(s.b)),
              epi);
  else
    run_tiles(g, s, f32_rounded(g.A, g.ra, static_cast<float*>(s.a)), f32_rounded(g.B, g.rb, static_cast<float*>(s.b)),
              epi);
}

namespace {

// ---- dense ----

// y[m, n] = round_c(Σ_k round_c(x[m, k]) · round_c(W[k, n]))  (+ bias: round_c(y + round_c(b[n]))).
Gemm dense_gemm(const KernelArgs& a) {
  const auto& at = std::get<DenseAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& w = a.in[1];
  const TensorArg& y = a.out[0];
  const bool wt = at.transpose_w;  // W stored [N, K]
  const int64_t K = w.shape[wt ? 1 : 0], N = w.shape[wt ? 0 : 1], M = x.shape.rows();
  LOOM_ASSERT(x.shape.last() == K && y.shape.rows() == M && y.shape.last() == N && y.dtype == at.compute);
  return Gemm{.ta = false,
              .tb = wt,
              .M = M,
              .N = N,
              .K = K,
              .A = x,
              .ra = at.compute,
              .B = w,
              .rb = at.compute,
              .c = at.compute,
              .out = y,
              .in_place = y.dtype == DType::f32,
              .bias = a.in.size() == 3};
}
struct DenseSpans {
  GemmSpans gemm;
  float* bias = nullptr;  // round_c(b) [N], when the bias needs a copy
};
DenseSpans dense_spans(Bump& ws, const KernelArgs& a) {
  const Gemm g = dense_gemm(a);
  DenseSpans s{gemm_spans(ws, g)};
  if (a.in.size() == 3 && needs_f32_copy(a.in[2], g.c)) s.bias = ws.take<float>(a.in[2].shape.numel());
  return s;
}

}  // namespace

void cpu_dense(const KernelArgs& a) {
  if (dtype_is_quantized(a.in[1].dtype)) return dense_quant(a);
  Bump ws(a.workspace);
  const DenseSpans s = dense_spans(ws, a);
  const Gemm g = dense_gemm(a);
  // With a bias: round_c(Σ) (a no-op for f32), + round_c(b), and the final round_c by the store.
  const float* bs = a.in.size() < 3 ? nullptr : f32_rounded(a.in[2], g.c, s.bias);
  run_gemm(g, s.gemm, Epilogue{.c = g.c, .round_first = bs != nullptr, .bias = bs, .out = &g.out});
}
KernelScratch cpu_workspace_dense(const KernelArgs& a) {
  return dtype_is_quantized(a.in[1].dtype) ? dense_quant_workspace(a) : workspace_of<dense_spans>(a);
}

// dx[m, k] = round_out(round_c(Σ_n dy[m, n] · round_c(W[k, n]))): dy[M, N] · Wᵀ, or · W when W is
// stored [N, K], with dy as is (normally in c already).
namespace {
Gemm dense_grad_input_gemm(const KernelArgs& a) {
  const auto& at = std::get<DenseGradAttrs>(a.node.attrs);
  const TensorArg& dy = a.in[0];
  const TensorArg& w = a.in[1];
  const TensorArg& dx = a.out[0];
  const bool wt = at.transpose_w;
  const int64_t K = w.shape[wt ? 1 : 0], N = w.shape[wt ? 0 : 1], M = dy.shape.rows();
  LOOM_ASSERT(dy.shape.last() == N && dx.shape.rows() == M && dx.shape.last() == K && dx.dtype == at.out_dtype);
  // dy as is (normally in c already): dy[M, N] · Wᵀ, or · W when W is stored [N, K].
  return Gemm{.ta = false,
              .tb = !wt,
              .M = M,
              .N = K,
              .K = N,
              .A = dy,
              .ra = DType::f32,
              .B = w,
              .rb = at.compute,
              .c = at.compute,
              .out = dx,
              .in_place = dx.dtype == DType::f32};
}
GemmSpans dense_grad_input_spans(Bump& ws, const KernelArgs& a) { return gemm_spans(ws, dense_grad_input_gemm(a)); }
}  // namespace

void cpu_dense_grad_input(const KernelArgs& a) {
  if (dtype_is_quantized(a.in[1].dtype)) return dense_quant_grad_input(a);
  Bump ws(a.workspace);
  const GemmSpans s = dense_grad_input_spans(ws, a);
  const Gemm g = dense_grad_input_gemm(a);
  // round_c first unless the store to out_dtype is that same rounding (or c is f32).
  run_gemm(g, s, Epilogue{.c = g.c, .round_first = rounding_changes(g.out.dtype, g.c), .out = &g.out});
}
KernelScratch cpu_workspace_dense_grad_input(const KernelArgs& a) {
  return dtype_is_quantized(a.in[1].dtype) ? dense_quant_grad_input_workspace(a)
                                           : workspace_of<dense_grad_input_spans>(a);
}

// grad[k, n] += round_c(Σ_m round_c(x[m, k]) · dy[m, n]): a TN GEMM. When this assigns (the
// buffer's first writer, minibatch 0) the GEMM writes the gradient buffer itself; otherwise each
// tile is formed in a tile buffer and added to the gradient by the epilogue while it is in cache.
// Either way the values are those of the unfused dW followed by grad_accumulate, bit for bit.
// grad is [K, N] ([N, K] with transpose_w) in row-major order, whatever its shape. The workspace
// serves both ways (the plan is the same every minibatch), unless the node assigns on every run
// (assigns_always: one minibatch per step), which needs no tile buffers.
namespace {
Gemm dense_grad_weight_gemm(const KernelArgs& a, bool assign) {
  const auto& at = std::get<DenseGradWeightAttrs>(a.node.attrs);
  const TensorArg& grad = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& dy = a.in[2];
  const int64_t K = x.shape.last(), N = dy.shape.last(), M = x.shape.rows();
  LOOM_ASSERT(dy.shape.rows() == M && grad.shape.numel() == K * N && grad.dtype == DType::f32);
  // xᵀ · dy, or dyᵀ · x for a gradient stored [N, K].
  const bool t = at.transpose_w;
  return Gemm{.ta = true,
              .tb = false,
              .M = t ? N : K,
              .N = t ? K : N,
              .K = M,
              .A = t ? dy : x,
              .ra = t ? DType::f32 : at.compute,
              .B = t ? x : dy,
              .rb = t ? at.compute : DType::f32,
              .c = at.compute,
              .out = grad,
              .in_place = assign};
}
GemmSpans dense_grad_weight_spans(Bump& ws, const KernelArgs& a) {
  const bool always = std::get<DenseGradWeightAttrs>(a.node.attrs).assigns_always;
  return gemm_spans(ws, dense_grad_weight_gemm(a, /*assign=*/always), /*either=*/!always);
}
}  // namespace

void cpu_dense_grad_weight(const KernelArgs& a) {
  const auto& at = std::get<DenseGradWeightAttrs>(a.node.attrs);
  const bool assign = at.assign_in_first_minibatch && a.run.minibatch == a.run.first_minibatch;
  LOOM_ASSERT(assign || !at.assigns_always, "dense_grad_weight planned for one minibatch per step ran a later one");
  Bump ws(a.workspace);
  const GemmSpans s = dense_grad_weight_spans(ws, a);
  const Gemm g = dense_grad_weight_gemm(a, assign);
  run_gemm(g, s,
           Epilogue{.c = at.compute, .round_first = at.compute != DType::f32, .out = &g.out, .accumulate = !assign});
}
KernelScratch cpu_workspace_dense_grad_weight(const KernelArgs& a) { return workspace_of<dense_grad_weight_spans>(a); }

// out[j] = round_dtype(Σ_i x[i·J + j]), J = numel of the kept trailing dims, f32 accumulation.
// The rows are split into a number of chunks that depends only on I (the row count); each chunk
// sums its rows in order into its own partial row (workspace: the [chunks, J] partials), and the
// partials are added in chunk order. Columns are processed in fixed blocks so the row reads stay
// contiguous.
namespace {
struct SumLeading {
  int64_t I, J, nchunks;
  explicit SumLeading(const KernelArgs& a) : I(0), J(a.out[0].shape.numel()), nchunks(0) {
    constexpr int64_t kRowsPerChunk = 256, kMaxChunks = 32;
    if (J == 0) return;
    I = a.in[0].shape.numel() / J;
    LOOM_ASSERT(I * J == a.in[0].shape.numel());
    nchunks = std::clamp<int64_t>(I / kRowsPerChunk, 1, kMaxChunks);
  }
};
float* sum_leading_partials(Bump& ws, const KernelArgs& a) {
  const SumLeading p(a);
  return ws.take<float>(p.nchunks * p.J);
}
}  // namespace

void cpu_sum_leading(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const SumLeading p(a);
  const int64_t I = p.I, J = p.J, nchunks = p.nchunks;
  if (J == 0) return;
  constexpr int64_t kColBlock = 512;
  const int64_t ncb = ceil_div(J, kColBlock);
  Bump ws(a.workspace);
  float* part = sum_leading_partials(ws, a);
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
KernelScratch cpu_workspace_sum_leading(const KernelArgs& a) { return workspace_of<sum_leading_partials>(a); }

}  // namespace loom
