// Reference kernels for linear_cross_entropy and its backward (graph/ops/linear_cross_entropy.cpp):
// whole rows of logits in double, with dense's and the loss ops' rounding points. The oracle
// needs no chunks: the chunking is the CPU kernel's, and its results must not depend on it.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/reference/util.h"
#include "graph/graph.h"

namespace loom {

using refk::label_at;
using refk::ld;
using refk::rnd;
using refk::st;

namespace {

struct Head {
  DType c;
  bool wt;  // w stored [V, C]
  int64_t R, C, V;
  const TensorArg* b;  // the bias [V], or null
  // x at input x_at; the bias, when the node has one, at input bias_at.
  Head(const KernelArgs& a, int x_at, int bias_at) {
    const auto& at = std::get<LinearCrossEntropyAttrs>(a.node.attrs);
    const TensorArg& x = a.in[x_at];
    c = at.compute;
    wt = at.transpose_w;
    C = x.shape.last();
    R = x.shape.rows();
    V = a.in[x_at + 1].shape.numel() / C;
    b = static_cast<int>(a.in.size()) > bias_at ? &a.in[bias_at] : nullptr;
  }
  double w_at(const TensorArg& w, int64_t k, int64_t v) const { return rnd(c, ld(w, wt ? v * C + k : k * V + v)); }
};

// Row r's logits, round_c(Σ_k round_c(x[r, k])·round_c(w[k, v])) (+ bias: round_c(z + round_c(b[v])))
// as dense gives them.
void row_logits(const Head& h, const TensorArg& x, const TensorArg& w, int64_t r, std::vector<double>& out) {
  out.assign(static_cast<size_t>(h.V), 0.0);
  for (int64_t v = 0; v < h.V; ++v) {
    double acc = 0;
    for (int64_t k = 0; k < h.C; ++k) acc += rnd(h.c, ld(x, r * h.C + k)) * h.w_at(w, k, v);
    double z = rnd(h.c, acc);
    if (h.b) z = rnd(h.c, z + rnd(h.c, ld(*h.b, v)));
    out[static_cast<size_t>(v)] = z;
  }
}

// log Σ exp(z) (max + log Σ exp(z − max), as the loss ops' reference) and the first argmax (a NaN
// counting as the maximum, the first one winning, as jnp.argmax) of a row of logits.
struct RowStats {
  double lse;
  int64_t best;
};
RowStats row_stats(const std::vector<double>& z) {
  double mx = -std::numeric_limits<double>::infinity();
  int64_t best = 0;
  for (size_t v = 0; v < z.size() && !std::isnan(mx); ++v)
    if (std::isnan(z[v]) || z[v] > mx) {
      mx = z[v];
      best = static_cast<int64_t>(v);
    }
  double s = 0;
  for (double zv : z) s += std::exp(zv - mx);
  return {mx + std::log(s), best};
}

}  // namespace

// Per row with a label >= 0: lse = log Σ exp(logit), loss += lse − logit[label], and a hit when the
// first argmax (a NaN counting as the maximum, as jnp.argmax) is the label.
void ref_linear_cross_entropy(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& labels = a.in[2];
  const Head h(a, 0, 3);
  std::vector<double> z;
  double total = 0;
  int32_t correct = 0;
  for (int64_t r = 0; r < h.R; ++r) {
    const int32_t l = label_at(labels, r, h.V);
    if (l < 0) {
      st(a.out[2], r, 0.0);
      continue;
    }
    row_logits(h, x, a.in[1], r, z);
    const auto [lse, best] = row_stats(z);
    st(a.out[2], r, lse);
    total += lse - z[static_cast<size_t>(l)];
    if (best == l) ++correct;
  }
  st(a.out[0], 0, total);
  refk::st_i32(a.out[1], 0, correct);
}

namespace {

// (x, w, labels, lse, dloss from input x_at on, then the bias if any) -> dx; *grad += dW unless grad
// is null (a frozen kernel); db (when not null) = the bias's cotangent. The oracle takes each row's
// lse in double from its logits, not the saved float32 one, as cross_entropy_grad's reference does.
// dlogits = round_c(dloss·(exp(logit − lse) − onehot)) (zero rows for ignored labels), dW[k, v] =
// round_c(Σ_r round_c(x[r, k])·dlogits[r, v]) (= instead of += in minibatch 0 when the attrs say
// so), dx[r, k] = round_c(Σ_v dlogits[r, v]·round_c(w[k, v])) stored in x's dtype, db[v] =
// round_c(Σ_r dlogits[r, v]) (sum_leading's in the compute dtype).
void head_grad(const KernelArgs& a, int x_at, const TensorArg* grad, const TensorArg* db) {
  const auto& at = std::get<LinearCrossEntropyAttrs>(a.node.attrs);
  const bool assign = at.assign_in_first_minibatch && a.run.minibatch == a.run.first_minibatch;
  const TensorArg& x = a.in[x_at];
  const TensorArg& w = a.in[x_at + 1];
  const TensorArg& labels = a.in[x_at + 2];
  const Head h(a, x_at, x_at + 5);
  const double dloss = ld(a.in[x_at + 4], 0);
  std::vector<double> dl(static_cast<size_t>(h.R * h.V), 0.0), z;  // dlogits [R, V]
  for (int64_t r = 0; r < h.R; ++r) {
    const int32_t l = label_at(labels, r, h.V);
    if (l < 0) continue;
    row_logits(h, x, w, r, z);
    const double lse = row_stats(z).lse;
    for (int64_t v = 0; v < h.V; ++v) {
      const double p = std::exp(z[static_cast<size_t>(v)] - lse);
      dl[static_cast<size_t>(r * h.V + v)] = rnd(h.c, dloss * (p - (v == l ? 1.0 : 0.0)));
    }
  }
  if (grad)
    for (int64_t k = 0; k < h.C; ++k)
      for (int64_t v = 0; v < h.V; ++v) {
        double acc = 0;
        for (int64_t r = 0; r < h.R; ++r) acc += rnd(h.c, ld(x, r * h.C + k)) * dl[static_cast<size_t>(r * h.V + v)];
        const int64_t i = h.wt ? v * h.C + k : k * h.V + v;
        const double dw = rnd(h.c, acc);
        st(*grad, i, assign ? dw : ld(*grad, i) + dw);
      }
  for (int64_t r = 0; r < h.R; ++r)
    for (int64_t k = 0; k < h.C; ++k) {
      double acc = 0;
      for (int64_t v = 0; v < h.V; ++v) acc += dl[static_cast<size_t>(r * h.V + v)] * h.w_at(w, k, v);
      st(a.out[0], r * h.C + k, rnd(h.c, acc));
    }
  if (db)
    for (int64_t v = 0; v < h.V; ++v) {
      double acc = 0;
      for (int64_t r = 0; r < h.R; ++r) acc += dl[static_cast<size_t>(r * h.V + v)];
      st(*db, v, rnd(h.c, acc));
    }
}

}  // namespace

// (grad, x, w, labels, lse, dloss) -> dx; grad += dW.
void ref_linear_cross_entropy_grad(const KernelArgs& a) { head_grad(a, 1, &a.in[0], nullptr); }

// (grad, x, w, labels, lse, dloss, b) -> dx, db; grad += dW.
void ref_linear_cross_entropy_grad_with_bias(const KernelArgs& a) { head_grad(a, 1, &a.in[0], &a.out[1]); }

// (x, w, labels, lse, dloss[, b]) -> dx, the kernel frozen.
void ref_linear_cross_entropy_grad_input(const KernelArgs& a) { head_grad(a, 0, nullptr, nullptr); }

}  // namespace loom
