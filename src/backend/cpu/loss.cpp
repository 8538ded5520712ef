// CPU kernels for log_softmax, softmax cross-entropy and accuracy (graph/ops/loss.cpp). One row
// per iteration in f32, OpenMP over rows, each thread's row buffers in the node's workspace
// (workspace.h); the scalar outputs are summed in a fixed order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend/cpu/cpu_util.h"
#include "backend/cpu/softmax_rows.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// Rows whose work (C elements each) is worth a thread.
bool par_rows(int64_t R, int64_t C) { return R > 1 && R * C >= kParallelMin / 4; }

// Per thread of a loop over the rows of `rows` (R rows of C): rows of `in` (and `in2`) widened to
// f32 when they are not f32, and an f32 row of results when `result` says one is needed.
struct RowSpans {
  PerThread<float> in, in2, result;
  int team;
};
RowSpans row_spans(Bump& ws, const TensorArg& rows, const TensorArg* in2, bool result) {
  const int64_t C = rows.shape.last(), R = rows.shape.rows();
  const int team = ws.team(par_rows(R, C), R);
  return {.in = ws.per_thread<float>(row_floats(rows, C), team),
          .in2 = ws.per_thread<float>(in2 ? row_floats(*in2, C) : 0, team),
          .result = ws.per_thread<float>(result ? C : 0, team),
          .team = team};
}

RowSpans log_softmax_spans(Bump& ws, const KernelArgs& a) { return row_spans(ws, a.in[0], nullptr, true); }
RowSpans log_softmax_grad_spans(Bump& ws, const KernelArgs& a) { return row_spans(ws, a.in[0], &a.in[1], true); }
// The per-row losses [R] (summed in row order afterwards), then the row buffers.
struct CrossEntropySpans {
  float* loss;
  RowSpans rows;
};
CrossEntropySpans cross_entropy_spans(Bump& ws, const KernelArgs& a) {
  float* loss = ws.take<float>(a.in[0].shape.rows());
  return {loss, row_spans(ws, a.in[0], nullptr, true)};
}
// dlogits rows are formed in place when they are f32.
RowSpans cross_entropy_grad_spans(Bump& ws, const KernelArgs& a) {
  return row_spans(ws, a.in[0], nullptr, a.out[0].dtype != DType::f32);
}
RowSpans accuracy_spans(Bump& ws, const KernelArgs& a) { return row_spans(ws, a.in[0], nullptr, false); }

}  // namespace

// y = (x − max) − log Σ exp(x − max) over the last dim.
void cpu_log_softmax(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(y.shape == x.shape);
  Bump ws(a.workspace);
  const RowSpans s = log_softmax_spans(ws, a);
#pragma omp parallel for schedule(static) num_threads(s.team)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = row_f32(x, r * C, C, s.in.mine());
    float* e = s.result.mine();
    const RowExp s = row_exp(xr, C, e);
    const float log_sum = std::log(s.sum);
    for (int64_t c = 0; c < C; ++c) e[c] = (xr[c] - s.max) - log_sum;
    store_f32(e, y.data, y.dtype, r * C, C);
  }
}

// (y, dy) -> dx = dy − exp(y)·Σ_row dy; dx has y's dtype.
void cpu_log_softmax_grad(const KernelArgs& a) {
  const TensorArg& y = a.in[0];
  const TensorArg& dy = a.in[1];
  const TensorArg& dx = a.out[0];
  const int64_t C = y.shape.last(), R = y.shape.rows();
  LOOM_ASSERT(dy.shape == y.shape && dx.shape == y.shape);
  Bump ws(a.workspace);
  const RowSpans s = log_softmax_grad_spans(ws, a);
#pragma omp parallel for schedule(static) num_threads(s.team)
  for (int64_t r = 0; r < R; ++r) {
    const float* yr = row_f32(y, r * C, C, s.in.mine());
    const float* dyr = row_f32(dy, r * C, C, s.in2.mine());
    float* t = s.result.mine();
    const float s = sum_f32(dyr, C);
    for (int64_t c = 0; c < C; ++c) t[c] = dyr[c] - exp_f32(yr[c]) * s;
    store_f32(t, dx.data, dx.dtype, r * C, C);
  }
}

// Σ_rows (logsumexp(row) − row[label]) over rows with a label >= 0, an f32 scalar: per-row
// losses (max − x[label]) + log Σ exp(x − max) in f32 (0 for an ignored row), then summed in row
// order in double.
void cpu_cross_entropy(const KernelArgs& a) {
  const TensorArg& logits = a.in[0];
  const TensorArg& labels = a.in[1];
  const int64_t V = logits.shape.last(), R = logits.shape.rows();
  LOOM_ASSERT(labels.shape.numel() == R && a.out[0].shape.numel() == 1);
  Bump ws(a.workspace);
  const CrossEntropySpans sp = cross_entropy_spans(ws, a);
  float* loss = sp.loss;
#pragma omp parallel for schedule(static) num_threads(sp.rows.team)
  for (int64_t r = 0; r < R; ++r) {
    const int32_t l = label_at(labels, r, V);
    if (l < 0) {
      loss[r] = 0;
      continue;
    }
    const float* xr = row_f32(logits, r * V, V, sp.rows.in.mine());
    const RowExp s = row_exp(xr, V, sp.rows.result.mine());
    loss[r] = (s.max - xr[l]) + std::log(s.sum);
  }
  double total = 0;
  for (int64_t r = 0; r < R; ++r) total += static_cast<double>(loss[r]);
  a.out[0].as<float>()[0] = static_cast<float>(total);
}

// (logits, labels, dloss) -> dloss·(softmax(row) − onehot(label)), in f32, stored in the logits'
// dtype; zero rows where label < 0.
void cpu_cross_entropy_grad(const KernelArgs& a) {
  const TensorArg& logits = a.in[0];
  const TensorArg& labels = a.in[1];
  const TensorArg& dl = a.out[0];
  const int64_t V = logits.shape.last(), R = logits.shape.rows();
  LOOM_ASSERT(dl.dtype == logits.dtype);
  LOOM_ASSERT(labels.shape.numel() == R && a.in[2].shape.numel() == 1 && dl.shape == logits.shape);
  const float dloss = load_as_f32(a.in[2].data, a.in[2].dtype, 0);
  const bool f32 = dl.dtype == DType::f32;
  Bump ws(a.workspace);
  const RowSpans sp = cross_entropy_grad_spans(ws, a);
#pragma omp parallel for schedule(static) num_threads(sp.team)
  for (int64_t r = 0; r < R; ++r) {
    float* out = f32 ? dl.as<float>() + r * V : sp.result.mine();
    const int32_t l = label_at(labels, r, V);
    if (l < 0) {
      std::fill(out, out + V, 0.f);
      if (!f32) store_f32(out, dl.data, dl.dtype, r * V, V);
      continue;
    }
    const float* xr = row_f32(logits, r * V, V, sp.in.mine());
    const RowExp s = row_exp(xr, V, out);  // out holds exp(x − max) until scaled
    const float p_label = out[l] / s.sum;
    for (int64_t c = 0; c < V; ++c) out[c] = dloss * (out[c] / s.sum);
    out[l] = dloss * (p_label - 1.f);
    if (!f32) store_f32(out, dl.data, dl.dtype, r * V, V);
  }
}

// Number of rows whose argmax equals the label, an i32 scalar (rows with a negative label are
// skipped). The first maximum wins ties; a NaN counts as the maximum (numpy / jnp.argmax
// semantics), the first NaN winning.
void cpu_accuracy(const KernelArgs& a) {
  const TensorArg& logits = a.in[0];
  const TensorArg& labels = a.in[1];
  const int64_t V = logits.shape.last(), R = logits.shape.rows();
  LOOM_ASSERT(labels.shape.numel() == R && a.out[0].shape.numel() == 1);
  const int32_t* lab = labels.as<const int32_t>();
  int64_t correct = 0;
  Bump ws(a.workspace);
  const RowSpans s = accuracy_spans(ws, a);
  if (V > 0) {
#pragma omp parallel for schedule(static) reduction(+ : correct) num_threads(s.team)
    for (int64_t r = 0; r < R; ++r) {
      if (lab[r] < 0) continue;
      const float* xr = row_f32(logits, r * V, V, s.in.mine());
      const int64_t best = argmax_row(xr, V);
      if (best == lab[r]) ++correct;
    }
  }
  const auto c32 = static_cast<int32_t>(correct);
  std::memcpy(a.out[0].data, &c32, 4);
}

KernelScratch cpu_workspace_log_softmax(const KernelArgs& a) { return workspace_of<log_softmax_spans>(a); }
KernelScratch cpu_workspace_log_softmax_grad(const KernelArgs& a) { return workspace_of<log_softmax_grad_spans>(a); }
KernelScratch cpu_workspace_cross_entropy(const KernelArgs& a) { return workspace_of<cross_entropy_spans>(a); }
KernelScratch cpu_workspace_cross_entropy_grad(const KernelArgs& a) {
  return workspace_of<cross_entropy_grad_spans>(a);
}
KernelScratch cpu_workspace_accuracy(const KernelArgs& a) { return workspace_of<accuracy_spans>(a); }

}  // namespace loom
