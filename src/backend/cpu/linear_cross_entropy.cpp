// CPU kernels for linear_cross_entropy and its backward (graph/ops/linear_cross_entropy.cpp): the
// head's products run chunk by chunk of vocabulary columns through dense's tiled GEMM (gemm.h),
// so the workspace holds one chunk's logits [rows, chunk] f32, the kernel's chunk in the compute
// dtype (and the bias's, rounded, in f32), and the products' own spans — never [rows, V]. A bias
// goes in by the products' epilogue, as dense's; its cotangent is each chunk's column sums.
//
// Why chunks of columns, not of rows: a chunk holding every row gives each element of the
// kernel's gradient its whole sum over the rows, so it is rounded to the compute dtype once and
// added to the f32 gradient, as dense_grad_weight does; chunks of rows would round (bfloat16) or
// need a [V, C] f32 accumulator. dx sums over the chunks in an f32 [rows, C] accumulator, rounded
// once at the end, as dense_grad_input's single product rounds it. The forward merges the chunks'
// row statistics (max, Σ exp, target logit, first argmax), which costs only float32 rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend/cpu/cpu_util.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/softmax_rows.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// Where x is among the node's inputs: after the kernel's gradient in the trained kernel's backward.
int x_input(const KernelArgs& a) {
  const bool trains_w =
      a.node.op == OpKind::linear_cross_entropy_grad || a.node.op == OpKind::linear_cross_entropy_grad_with_bias;
  return trains_w ? 1 : 0;
}
// Where the bias is when the node has one: after the labels (forward), after lse and dloss (backward).
int bias_input(const KernelArgs& a) { return x_input(a) + (a.node.op == OpKind::linear_cross_entropy ? 3 : 5); }

// The shapes of a node (forward: x is input 0; backward: input 1, after the kernel's gradient).
struct Head {
  DType c;
  bool tied;  // w stored [V, C]
  int64_t R, C, V, chunk;
  const TensorArg* b = nullptr;  // the bias [V], or null
  explicit Head(const KernelArgs& a) {
    const int x_at = x_input(a);
    const auto& at = std::get<LinearCrossEntropyAttrs>(a.node.attrs);
    const TensorArg& x = a.in[x_at];
    c = at.compute;
    tied = at.transpose_w;
    C = x.shape.last();
    R = x.shape.rows();
    V = a.in[x_at + 1].shape.numel() / C;
    chunk = std::min(at.chunk, V);
    if (static_cast<int>(a.in.size()) > bias_input(a)) b = &a.in[bias_input(a)];
  }
  int64_t chunks() const { return ceil_div(V, chunk); }
  int64_t v0(int64_t j) const { return j * chunk; }
  int64_t width(int64_t j) const { return std::min(V, v0(j) + chunk) - v0(j); }
  // The widths chunks have: the full one and the last.
  int64_t last_width() const { return width(chunks() - 1); }
  // Whether the kernel's chunk is used where it lies: rows of a tied kernel already in the compute dtype.
  bool w_in_place(const TensorArg& w) const { return tied && w.dtype == c; }
};

// The kernel's columns [v0, v0 + n) in the compute dtype, dense: [n, C] when tied (rows of w), [C, n]
// otherwise; at `buf` unless they are usable where they lie. w is f32 or already in the compute
// dtype (a narrowed parameter).
TensorArg w_chunk(const Head& h, const TensorArg& w, int64_t v0, int64_t n, void* buf) {
  LOOM_ASSERT(w.dtype == DType::f32 || w.dtype == h.c, "the head's kernel must be float32 or in the compute dtype");
  const auto es = static_cast<int64_t>(dtype_size(h.c));
  if (h.w_in_place(w)) return TensorArg{static_cast<std::byte*>(w.data) + v0 * h.C * es, Shape{n, h.C}, h.c};
  // One run of `len` elements of w from element `from` to element `to` of buf.
  const auto put = [&](int64_t from, int64_t to, int64_t len) {
    if (w.dtype == h.c)
      std::memcpy(static_cast<std::byte*>(buf) + to * es, static_cast<const std::byte*>(w.data) + from * es, len * es);
    else
      store_f32(w.as<const float>() + from, buf, h.c, to, len);
  };
  if (h.tied) {
    put(v0 * h.C, 0, n * h.C);
    return TensorArg{buf, Shape{n, h.C}, h.c};
  }
#pragma omp parallel for schedule(static) if (n * h.C >= kParallelMin)
  for (int64_t k = 0; k < h.C; ++k) put(k * h.V + v0, k * n, n);
  return TensorArg{buf, Shape{h.C, n}, h.c};
}

// logits[R, n] = round_c(x · w_chunk) (dense's product and rounding) into z.
Gemm logits_gemm(const Head& h, const TensorArg& x, const TensorArg& wc, const TensorArg& z) {
  return Gemm{.ta = false,
              .tb = h.tied,
              .M = h.R,
              .N = z.shape.last(),
              .K = h.C,
              .A = x,
              .ra = h.c,
              .B = wc,
              .rb = h.c,
              .c = h.c,
              .out = z,
              .in_place = true,
              .bias = h.b != nullptr};
}
// The kernel's gradient for the chunk's columns, round_c(round_c(x)ᵀ · dlogits): [n, C] rows of a
// tied kernel's [V, C] gradient, or [C, n] columns of an untied one's [C, V] (row stride V).
Gemm dw_gemm(const Head& h, const TensorArg& x, const TensorArg& dz, const TensorArg& gw) {
  const int64_t n = dz.shape.last();
  return Gemm{.ta = true,
              .tb = false,
              .M = h.tied ? n : h.C,
              .N = h.tied ? h.C : n,
              .K = h.R,
              .A = h.tied ? dz : x,
              .ra = h.c,
              .B = h.tied ? x : dz,
              .rb = h.c,
              .c = h.c,
              .out = gw,
              .in_place = false};
}
// dx[R, C] (+)= dlogits · w_chunkᵀ in f32 (assigned by the first chunk).
Gemm dx_gemm(const Head& h, const TensorArg& dz, const TensorArg& wc, const TensorArg& acc, bool first) {
  return Gemm{.ta = false,
              .tb = !h.tied,
              .M = h.R,
              .N = h.C,
              .K = dz.shape.last(),
              .A = dz,
              .ra = h.c,
              .B = wc,
              .rb = h.c,
              .c = h.c,
              .out = acc,
              .in_place = first};
}

// Per row, the statistics the chunks merge into.
struct RowStats {
  float *max, *sum, *target, *best;
  int64_t* best_at;
};

// The workspace: the kernel's chunk, one chunk of logits, (backward) dx's f32 accumulator, (forward)
// the row statistics and per-row losses, then the largest of the products' spans (gemm_spans for
// each product at both chunk widths), carved again for each product.
struct HeadSpans {
  void* wc = nullptr;    // [chunk · C] in the compute dtype
  float* bc = nullptr;   // [chunk] the bias's chunk, round_c'd, when it needs a copy
  float* z = nullptr;    // [R, chunk] logits, then (backward) dlogits
  float* acc = nullptr;  // [R, C] dx before its rounding, when dx is not f32
  RowStats rows{};
  float* loss = nullptr;  // [R]
  Workspace gemm{};
  int team = 1;
};
HeadSpans head_spans(Bump& ws, const KernelArgs& a, bool backward) {
  const int x_at = x_input(a);
  const bool trains_w = x_at == 1;
  const Head h(a);
  const TensorArg& x = a.in[x_at];
  const TensorArg& w = a.in[x_at + 1];
  HeadSpans s;
  s.team = ws.team(h.R > 1, h.R);
  if (!h.w_in_place(w)) s.wc = ws.take<std::byte>(h.chunk * h.C * static_cast<int64_t>(dtype_size(h.c)));
  if (h.b && needs_f32_copy(*h.b, h.c)) s.bc = ws.take<float>(h.chunk);
  s.z = ws.take<float>(h.R * h.chunk);
  if (backward) {
    if (a.out[0].dtype != DType::f32) s.acc = ws.take<float>(h.R * h.C);
  } else {
    s.rows = RowStats{ws.take<float>(h.R), ws.take<float>(h.R), ws.take<float>(h.R), ws.take<float>(h.R),
                      ws.take<int64_t>(h.R)};
    s.loss = ws.take<float>(h.R);
  }
  int64_t gemm_bytes = 0;
  for (const int64_t n : {h.chunk, h.last_width()}) {
    // Shapes and dtypes only: the counting Bump never touches data.
    const TensorArg wc{nullptr, h.tied ? Shape{n, h.C} : Shape{h.C, n}, h.c};
    const TensorArg z{nullptr, Shape{h.R, n}, DType::f32};
    const TensorArg out{nullptr, Shape{h.R, h.C}, DType::f32};
    const auto need = [&](const Gemm& g, bool either) {
      Bump b = Bump::counter(a.workspace.threads);
      gemm_spans(b, g, either);
      gemm_bytes = std::max(gemm_bytes, b.used());
      ws.library(b.library_used(), 1);  // the product's sgemm buffers, for all its threads
    };
    need(logits_gemm(h, x, wc, z), false);
    if (trains_w) need(dw_gemm(h, x, z, out), false);
    if (backward) need(dx_gemm(h, z, wc, out, false), true);
  }
  s.gemm = Workspace{ws.take<std::byte>(gemm_bytes), gemm_bytes, a.workspace.threads};
  return s;
}
HeadSpans forward_spans(Bump& ws, const KernelArgs& a) { return head_spans(ws, a, false); }
HeadSpans backward_spans(Bump& ws, const KernelArgs& a) { return head_spans(ws, a, true); }

// Runs g on the products' shared span.
void run_in(const HeadSpans& s, const Gemm& g, const Epilogue& epi, bool either = false) {
  Bump b(s.gemm);
  run_gemm(g, gemm_spans(b, g, either), epi);
}

// Chunk j's logits [R, n] into s.z (as f32 values of the compute dtype); returns them. With a bias,
// dense's epilogue: round_c(Σ), + round_c(b), and round_c again (dense's store to the compute dtype).
TensorArg chunk_logits(const Head& h, const HeadSpans& s, const TensorArg& x, const TensorArg& w, int64_t j,
                       TensorArg& wc) {
  const int64_t n = h.width(j);
  wc = w_chunk(h, w, h.v0(j), n, s.wc);
  const TensorArg z{s.z, Shape{h.R, n}, DType::f32};
  const float* bias = nullptr;
  if (h.b) {
    const auto es = static_cast<int64_t>(dtype_size(h.b->dtype));
    bias = f32_rounded(TensorArg{static_cast<std::byte*>(h.b->data) + h.v0(j) * es, Shape{n}, h.b->dtype}, h.c, s.bc);
  }
  run_in(s, logits_gemm(h, x, wc, z),
         Epilogue{.c = h.c, .round_first = h.c != DType::f32, .bias = bias, .round_last = bias != nullptr, .out = &z});
  return z;
}

// db[v] = round_c(Σ_r dz[r, v]) for the chunk's columns, each summed in row order in f32 (the same
// bits at any thread count), in blocks of columns so that the rows' reads stay contiguous.
void column_sums(const TensorArg& dz, DType c, float* db) {
  constexpr int64_t kCols = 256;
  const int64_t R = dz.shape.rows(), n = dz.shape.last();
  const float* z = dz.as<const float>();
#pragma omp parallel for schedule(static) if (R * n >= kParallelMin)
  for (int64_t c0 = 0; c0 < n; c0 += kCols) {
    const int64_t c1 = std::min(n, c0 + kCols);
    std::fill(db + c0, db + c1, 0.f);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t v = c0; v < c1; ++v) db[v] += z[r * n + v];
    round_inplace(db + c0, c1 - c0, c);
  }
}

}  // namespace

// Per chunk the logits, then per row its chunk merged into the row's statistics: max M and
// Σ exp(z − M) rescaled to the larger max, the target logit when it is in the chunk, and the
// chunk's first argmax when it beats the best so far (strictly: earlier columns win ties; a NaN
// wins once and stays). loss_r = (M − z[label]) + log Σ, summed in row order in double.
void cpu_linear_cross_entropy(const KernelArgs& a) {
  const Head h(a);
  const TensorArg& x = a.in[0];
  const TensorArg& labels = a.in[2];
  Bump ws(a.workspace);
  const HeadSpans s = forward_spans(ws, a);
  const RowStats st = s.rows;
  float* lse = a.out[2].as<float>();
  TensorArg wc;
  for (int64_t j = 0; j < h.chunks(); ++j) {
    const TensorArg z = chunk_logits(h, s, x, a.in[1], j, wc);
    const int64_t n = h.width(j), v0 = h.v0(j);
#pragma omp parallel for schedule(static) num_threads(s.team)
    for (int64_t r = 0; r < h.R; ++r) {
      const int32_t l = label_at(labels, r, h.V);
      if (l < 0) continue;
      float* zr = z.as<float>() + r * n;
      if (l >= v0 && l < v0 + n) st.target[r] = zr[l - v0];
      const int64_t b = argmax_row(zr, n);
      if (j == 0 || (!std::isnan(st.best[r]) && (std::isnan(zr[b]) || zr[b] > st.best[r]))) {
        st.best[r] = zr[b];
        st.best_at[r] = v0 + b;
      }
      const RowExp e = row_exp(zr, n, zr);
      if (j == 0) {
        st.max[r] = e.max;
        st.sum[r] = e.sum;
      } else {
        const float m = std::fmax(st.max[r], e.max);
        st.sum[r] = st.sum[r] * exp_f32(st.max[r] - m) + e.sum * exp_f32(e.max - m);
        st.max[r] = m;
      }
    }
  }
  int64_t correct = 0;
  for (int64_t r = 0; r < h.R; ++r) {
    const int32_t l = label_at(labels, r, h.V);
    if (l < 0) {
      s.loss[r] = lse[r] = 0;
      continue;
    }
    const float log_sum = std::log(st.sum[r]);
    s.loss[r] = (st.max[r] - st.target[r]) + log_sum;
    lse[r] = st.max[r] + log_sum;
    correct += st.best_at[r] == l;
  }
  double total = 0;
  for (int64_t r = 0; r < h.R; ++r) total += static_cast<double>(s.loss[r]);
  a.out[0].as<float>()[0] = static_cast<float>(total);
  const auto c32 = static_cast<int32_t>(correct);
  std::memcpy(a.out[1].data, &c32, 4);
}
KernelScratch cpu_workspace_linear_cross_entropy(const KernelArgs& a) { return workspace_of<forward_spans>(a); }

namespace {

// Per chunk: the logits again, dlogits = round_c(dloss·(exp(z − lse) − onehot)) in place (zero rows
// for ignored labels), the kernel's gradient for the chunk's columns into *grad unless it is null (a
// frozen kernel; assigned in the first minibatch when the attrs say so), the bias's cotangent for
// them into *db unless it is null, and dx's accumulator; dx = round_c(accumulator) at the end.
void head_grad(const KernelArgs& a, const TensorArg* grad, const TensorArg* db) {
  const auto& at = std::get<LinearCrossEntropyAttrs>(a.node.attrs);
  const bool assign = at.assign_in_first_minibatch && a.run.minibatch == a.run.first_minibatch;
  const int x_at = x_input(a);
  const Head h(a);
  const TensorArg& x = a.in[x_at];
  const TensorArg& labels = a.in[x_at + 2];
  const float* lse = a.in[x_at + 3].as<const float>();
  const float dloss = load_as_f32(a.in[x_at + 4].data, a.in[x_at + 4].dtype, 0);
  const TensorArg& dx = a.out[0];
  Bump ws(a.workspace);
  const HeadSpans s = backward_spans(ws, a);
  const TensorArg acc{s.acc ? s.acc : dx.data, Shape{h.R, h.C}, DType::f32};
  TensorArg wc;
  for (int64_t j = 0; j < h.chunks(); ++j) {
    const TensorArg z = chunk_logits(h, s, x, a.in[x_at + 1], j, wc);
    const int64_t n = h.width(j), v0 = h.v0(j);
#pragma omp parallel for schedule(static) num_threads(s.team)
    for (int64_t r = 0; r < h.R; ++r) {
      float* zr = z.as<float>() + r * n;
      const int32_t l = label_at(labels, r, h.V);
      if (l < 0) {
        std::fill(zr, zr + n, 0.f);
        continue;
      }
      for (int64_t c = 0; c < n; ++c) zr[c] = exp_f32(zr[c] - lse[r]);
      if (l >= v0 && l < v0 + n) zr[l - v0] -= 1.f;
      for (int64_t c = 0; c < n; ++c) zr[c] = dloss * zr[c];
      round_inplace(zr, n, h.c);
    }
    if (db) column_sums(z, h.c, db->as<float>() + v0);
    if (grad) {
      const TensorArg gw{grad->as<float>() + (h.tied ? v0 * h.C : v0), h.tied ? Shape{n, h.C} : Shape{h.C, n},
                         DType::f32};
      run_in(s, dw_gemm(h, x, z, gw),
             Epilogue{.c = h.c,
                      .round_first = h.c != DType::f32,
                      .out = &gw,
                      .accumulate = !assign,
                      .out_ld = h.tied ? 0 : h.V});
    }
    run_in(s, dx_gemm(h, z, wc, acc, j == 0), Epilogue{.c = h.c, .out = &acc, .accumulate = j > 0},
           /*either=*/true);
  }
  if (s.acc) {  // round_c, unless the store to dx's dtype is that same rounding
    for (int64_t r = 0; r < h.R; ++r) {
      if (rounding_changes(dx.dtype, h.c)) round_inplace(s.acc + r * h.C, h.C, h.c);
      store_f32(s.acc + r * h.C, dx.data, dx.dtype, r * h.C, h.C);
    }
  } else if (h.c != DType::f32) {
    round_inplace(dx.as<float>(), h.R * h.C, h.c);
  }
}

}  // namespace

void cpu_linear_cross_entropy_grad(const KernelArgs& a) { head_grad(a, &a.in[0], nullptr); }
KernelScratch cpu_workspace_linear_cross_entropy_grad(const KernelArgs& a) { return workspace_of<backward_spans>(a); }

// The same with a bias, and its cotangent.
void cpu_linear_cross_entropy_grad_with_bias(const KernelArgs& a) { head_grad(a, &a.in[0], &a.out[1]); }
KernelScratch cpu_workspace_linear_cross_entropy_grad_with_bias(const KernelArgs& a) {
  return workspace_of<backward_spans>(a);
}

// The same dx, the kernel frozen (a LoRA run's head): no gradient product.
void cpu_linear_cross_entropy_grad_input(const KernelArgs& a) { head_grad(a, nullptr, nullptr); }
KernelScratch cpu_workspace_linear_cross_entropy_grad_input(const KernelArgs& a) {
  return workspace_of<backward_spans>(a);
}

}  // namespace loom
