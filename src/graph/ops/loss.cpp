// log_softmax, softmax cross-entropy with integer labels, and accuracy.
#include "graph/ops/rules.h"

namespace loom {

void infer_log_softmax(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& x = in_val(g, n, 0);
  if (!dtype_is_float(x.dtype) || x.shape.rank < 1) op_fail(g, n, "x must be a float tensor of rank >= 1");
  out[0] = {x.shape, x.dtype};
}

// Per element: max, subtract, exp, sum (the per-row log is not counted).
OpCost cost_log_softmax(const Graph& g, const Node& n) { return elementwise_cost(g, n, 4); }

// y = x − logsumexp(x)  ⇒  dx = dy − exp(y)·Σ dy (per row).
void vjp_log_softmax(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::log_softmax_grad, {c.out_id(0), c.out_ct[0]}); }

void infer_log_softmax_grad(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& y = in_val(g, n, 0);
  if (y.shape != in_val(g, n, 1).shape) op_fail(g, n, "y and dy must have the same shape");
  out[0] = {y.shape, y.dtype};
}

// dx = dy − exp(y)·Σdy: sum, exp, multiply, subtract per element.
OpCost cost_log_softmax_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 4); }

namespace {
// Logits of any float dtype: bfloat16/float16 logits are widened (exactly) to float32 inside the
// kernels, which is the tutorial's logits.astype(float32) without a float32 copy of [..., V].
void check_logits_labels(const Graph& g, const Node& n) {
  const Value& logits = in_val(g, n, 0);
  const Value& labels = in_val(g, n, 1);
  if (!dtype_is_float(logits.dtype) || logits.shape.rank < 1) op_fail(g, n, "logits must be a float tensor [..., V]");
  if (labels.dtype != DType::i32 || labels.shape != logits.shape.drop_last())
    op_fail(g, n, "labels must be int32 with the logits' shape minus the last dim");
}
}  // namespace

void infer_cross_entropy(const Graph& g, const Node& n, ValueDesc* out) {
  check_logits_labels(g, n);
  out[0] = {Shape{}, DType::f32};
}

// A log-sum-exp per row: max, subtract, exp, sum per logit.
OpCost cost_cross_entropy(const Graph& g, const Node& n) {
  return OpCost{.flops = 4 * in_val(g, n, 0).shape.numel(), .bytes = io_bytes(g, n)};
}

// The gradient has the logits' dtype: computed in f32 and rounded once on the store, which is what
// the VJP of the tutorial's logits.astype(float32) does to the f32 loss's gradient.
void vjp_cross_entropy(VjpCtx& c) {
  c.in_ct[0] = c.emit1(OpKind::cross_entropy_grad, {c.in_id(0), c.in_id(1), c.out_ct[0]});
}

void infer_cross_entropy_grad(const Graph& g, const Node& n, ValueDesc* out) {
  check_logits_labels(g, n);
  const Value& d = in_val(g, n, 2);
  if (d.shape.numel() != 1 || d.dtype != DType::f32) op_fail(g, n, "dloss must be a float32 scalar");
  out[0] = {in_val(g, n, 0).shape, in_val(g, n, 0).dtype};
}

// The softmax again (4 per logit) and dloss·(p − onehot) (1).
OpCost cost_cross_entropy_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 5); }

void infer_accuracy(const Graph& g, const Node& n, ValueDesc* out) {
  check_logits_labels(g, n);
  out[0] = {Shape{}, DType::i32};
}

// One compare per logit (argmax).
OpCost cost_accuracy(const Graph& g, const Node& n) {
  return OpCost{.flops = in_val(g, n, 0).shape.numel(), .bytes = io_bytes(g, n)};
}

}  // namespace loom
