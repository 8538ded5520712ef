// Reference kernels for log_softmax, softmax cross-entropy and accuracy (graph/ops/loss.cpp).
#include <cmath>
#include <limits>

#include "backend/reference/util.h"
#include "graph/graph.h"

namespace loom {

using refk::label_at;
using refk::ld;
using refk::st;

namespace {
// max and log Σ exp(x − max) of row r (C elements) of t, in double.
struct RowLse {
  double max, lse;  // lse = max + log Σ exp(x − max)
};
RowLse row_lse(const TensorArg& t, int64_t r, int64_t C) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < C; ++c) mx = std::fmax(mx, ld(t, r * C + c));
  double s = 0;
  for (int64_t c = 0; c < C; ++c) s += std::exp(ld(t, r * C + c) - mx);
  return {mx, mx + std::log(s)};
}
}  // namespace

// y = x − (max + log Σ exp(x − max)) over the last dim.
void ref_log_softmax(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(y.shape == x.shape);
  for (int64_t r = 0; r < R; ++r) {
    const double lse = row_lse(x, r, C).lse;
    for (int64_t c = 0; c < C; ++c) st(y, r * C + c, ld(x, r * C + c) - lse);
  }
}

// (y, dy) -> dx = dy − exp(y)·Σ_row dy.
void ref_log_softmax_grad(const KernelArgs& a) {
  const TensorArg& y = a.in[0];
  const TensorArg& dy = a.in[1];
  const TensorArg& dx = a.out[0];
  const int64_t C = y.shape.last(), R = y.shape.rows();
  LOOM_ASSERT(dy.shape == y.shape && dx.shape == y.shape);
  for (int64_t r = 0; r < R; ++r) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += ld(dy, r * C + c);
    for (int64_t c = 0; c < C; ++c) st(dx, r * C + c, ld(dy, r * C + c) - std::exp(ld(y, r * C + c)) * s);
  }
}

// Σ_rows (logsumexp(row) − row[label]) over rows with a label >= 0, an f32 scalar.
void ref_cross_entropy(const KernelArgs& a) {
  const TensorArg& logits = a.in[0];
  const TensorArg& labels = a.in[1];
  const int64_t V = logits.shape.last(), R = logits.shape.rows();
  LOOM_ASSERT(labels.shape.numel() == R && a.out[0].shape.numel() == 1);
  double total = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t l = label_at(labels, r, V);
    if (l < 0) continue;
    total += row_lse(logits, r, V).lse - ld(logits, r * V + l);
  }
  st(a.out[0], 0, total);
}

// (logits, labels, dloss) -> dloss·(softmax(row) − onehot(label)); zero rows where label < 0.
void ref_cross_entropy_grad(const KernelArgs& a) {
  const TensorArg& logits = a.in[0];
  const TensorArg& labels = a.in[1];
  const TensorArg& dl = a.out[0];
  const int64_t V = logits.shape.last(), R = logits.shape.rows();
  LOOM_ASSERT(labels.shape.numel() == R && a.in[2].shape.numel() == 1 && dl.shape == logits.shape);
  const double dloss = ld(a.in[2], 0);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t l = label_at(labels, r, V);
    if (l < 0) {
      for (int64_t c = 0; c < V; ++c) st(dl, r * V + c, 0.0);
      continue;
    }
    const double lse = row_lse(logits, r, V).lse;
    for (int64_t c = 0; c < V; ++c) {
      const double p = std::exp(ld(logits, r * V + c) - lse);
      st(dl, r * V + c, dloss * (p - (c == l ? 1.0 : 0.0)));
    }
  }
}

// Number of rows whose argmax equals the label, an i32 scalar (a negative label never does). The
// first maximum wins ties; a NaN counts as the maximum (numpy / jnp.argmax semantics), the first
// NaN winning.
void ref_accuracy(const KernelArgs& a) {
  const TensorArg& logits = a.in[0];
  const TensorArg& labels = a.in[1];
  const int64_t V = logits.shape.last(), R = logits.shape.rows();
  LOOM_ASSERT(labels.shape.numel() == R && a.out[0].shape.numel() == 1);
  int32_t correct = 0;
  for (int64_t r = 0; r < R && V > 0; ++r) {
    int64_t best = 0;
    double best_v = ld(logits, r * V);
    for (int64_t c = 1; c < V && !std::isnan(best_v); ++c) {
      const double v = ld(logits, r * V + c);
      if (std::isnan(v) || v > best_v) {
        best = c;
        best_v = v;
      }
    }
    if (best == refk::ld_i32(labels, r)) ++correct;
  }
  refk::st_i32(a.out[0], 0, correct);
}

}  // namespace loom
