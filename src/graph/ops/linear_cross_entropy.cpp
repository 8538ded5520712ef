// linear_cross_entropy: the output layer and the softmax cross-entropy fused, so that the
// [rows, V] logits (and their gradient) are never held whole; its backward.
#include "graph/ops/linear_cross_entropy.h"

#include "graph/ops/rules.h"

namespace loom {

namespace {
// x [..., C], w [C, V] ([V, C] transposed), labels [...] int32, from input x_at on.
void check_head(const Graph& g, const Node& n, int x_at) {
  const auto& a = attrs_of<LinearCrossEntropyAttrs>(n);
  const Value& x = in_val(g, n, x_at);
  const Value& w = in_val(g, n, x_at + 1);
  const Value& labels = in_val(g, n, x_at + 2);
  if (!dtype_is_float(a.compute) || !dtype_is_float(x.dtype) || !dtype_is_float(w.dtype))
    op_fail(g, n, "x, w and the compute dtype must be float");
  if (a.chunk < 1) op_fail(g, n, "chunk must be >= 1 (vocabulary columns per chunk)");
  if (w.shape.rank != 2 || x.shape.rank < 1) op_fail(g, n, "needs x of rank >= 1 and a rank-2 kernel");
  if (x.shape.last() != w.shape[a.transpose_w ? 1 : 0]) op_fail(g, n, "x's last dim must equal the kernel's C");
  if (labels.dtype != DType::i32 || labels.shape != x.shape.drop_last())
    op_fail(g, n, "labels must be int32 with x's shape minus the last dim");
}

// The logits' product 2·rows·C·V and, per logit, the softmax's max, exp and sum (4, as cross_entropy).
int64_t logits_flops(const Graph& g, const Node& n, int x_at) {
  const Value& x = in_val(g, n, x_at);
  const Value& w = in_val(g, n, x_at + 1);
  return 2 * x.shape.rows() * w.shape.numel() + 4 * x.shape.rows() * (w.shape.numel() / x.shape.last());
}
}  // namespace

void infer_linear_cross_entropy(const Graph& g, const Node& n, ValueDesc* out) {
  check_head(g, n, 0);
  out[0] = {Shape{}, DType::f32};
  out[1] = {Shape{}, DType::i32};
  out[2] = {Shape{in_val(g, n, 0).shape.rows()}, DType::f32};
}

OpCost cost_linear_cross_entropy(const Graph& g, const Node& n) {
  return OpCost{.flops = logits_flops(g, n, 0), .bytes = io_bytes(g, n)};
}

// Only the loss has a cotangent (correct is a count, lse a saved statistic). A trainable kernel's
// gradient goes straight into its persistent buffer, as dense_grad_weight's does: no [C, V]
// cotangent; a frozen one (a LoRA run) has none, and its backward forms dx alone.
void vjp_linear_cross_entropy(VjpCtx& c) {
  if (c.out_ct[0] == kNoValue) return;
  const ValueId grad = c.param_grad(1);
  if (grad == kNoValue) {
    if (c.needs[1])
      throw std::invalid_argument("linear_cross_entropy at '" + c.node.scope +
                                  "': a kernel that needs a gradient must be a trainable parameter (use the "
                                  "unfused head otherwise)");
    if (c.needs[0])
      c.in_ct[0] = c.emit1(OpKind::linear_cross_entropy_grad_input,
                           {c.in_id(0), c.in_id(1), c.in_id(2), c.out_id(2), c.out_ct[0]}, c.node.attrs);
    return;
  }
  c.in_ct[0] = c.emit1(OpKind::linear_cross_entropy_grad,
                       {grad, c.in_id(0), c.in_id(1), c.in_id(2), c.out_id(2), c.out_ct[0]}, c.node.attrs);
}

namespace {
// The backward's inputs after the head's (x at x_at): lse [rows] and the loss's cotangent.
void check_backward(const Graph& g, const Node& n, int x_at, ValueDesc* out) {
  check_head(g, n, x_at);
  const Value& x = in_val(g, n, x_at);
  const Value& lse = in_val(g, n, x_at + 3);
  if (lse.dtype != DType::f32 || lse.shape != Shape{x.shape.rows()}) op_fail(g, n, "lse must be float32 [rows]");
  const Value& dloss = in_val(g, n, x_at + 4);
  if (dloss.dtype != DType::f32 || dloss.shape.numel() != 1) op_fail(g, n, "dloss must be a float32 scalar");
  out[0] = {x.shape, x.dtype};
}
}  // namespace

void infer_linear_cross_entropy_grad(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& grad = in_val(g, n, 0);
  if (grad.kind != ValueKind::grad || grad.dtype != DType::f32 || grad.shape.numel() != in_val(g, n, 2).shape.numel())
    op_fail(g, n, "input 0 must be the kernel's persistent float32 gradient");
  check_backward(g, n, 1, out);
}

void infer_linear_cross_entropy_grad_input(const Graph& g, const Node& n, ValueDesc* out) {
  check_backward(g, n, 0, out);
}

// The logits again, then two products of the same size (dx and the kernel's gradient).
OpCost cost_linear_cross_entropy_grad(const Graph& g, const Node& n) {
  const Value& x = in_val(g, n, 1);
  return OpCost{.flops = logits_flops(g, n, 1) + 4 * x.shape.rows() * in_val(g, n, 2).shape.numel(),
                .bytes = io_bytes(g, n) + in_val(g, n, 0).bytes()};
}

// The logits again, then dx's product.
OpCost cost_linear_cross_entropy_grad_input(const Graph& g, const Node& n) {
  const Value& x = in_val(g, n, 0);
  return OpCost{.flops = logits_flops(g, n, 0) + 2 * x.shape.rows() * in_val(g, n, 1).shape.numel(),
                .bytes = io_bytes(g, n)};
}

int64_t linear_cross_entropy_recomputed_flops(const Graph& g, const Node& n) {
  if (n.op == OpKind::linear_cross_entropy_grad) return logits_flops(g, n, 1);
  if (n.op == OpKind::linear_cross_entropy_grad_input) return logits_flops(g, n, 0);
  return 0;
}

}  // namespace loom
