// linear_cross_entropy: the output layer and the softmax cross-entropy fused, so that the
// [rows, V] logits (and their gradient) are never held whole; its backward.
#include "graph/ops/linear_cross_entropy.h"

#include <vector>

#include "graph/ops/rules.h"

namespace loom {

namespace {
// x [..., C], w [C, V] ([V, C] transposed), labels [...] int32, from input x_at on; the bias b [V]
// at input bias_at (float32 or the compute dtype, as dense's) when the node has that many inputs.
void check_head(const Graph& g, const Node& n, int x_at, int bias_at) {
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
  if (static_cast<int>(n.in.size()) > bias_at) {
    const Value& b = in_val(g, n, bias_at);
    if (b.shape != Shape{w.shape[a.transpose_w ? 0 : 1]} || (b.dtype != DType::f32 && b.dtype != a.compute))
      op_fail(g, n, "the bias must be [V] (the kernel's vocabulary), float32 or in the compute dtype");
  }
}

// The logits' product 2·rows·C·V and, per logit, the softmax's max, exp and sum (4, as cross_entropy).
int64_t logits_flops(const Graph& g, const Node& n, int x_at) {
  const Value& x = in_val(g, n, x_at);
  const Value& w = in_val(g, n, x_at + 1);
  return 2 * x.shape.rows() * w.shape.numel() + 4 * x.shape.rows() * (w.shape.numel() / x.shape.last());
}
}  // namespace

void infer_linear_cross_entropy(const Graph& g, const Node& n, ValueDesc* out) {
  check_head(g, n, 0, 3);
  out[0] = {Shape{}, DType::f32};
  out[1] = {Shape{}, DType::i32};
  out[2] = {Shape{in_val(g, n, 0).shape.rows()}, DType::f32};
}

OpCost cost_linear_cross_entropy(const Graph& g, const Node& n) {
  return OpCost{.flops = logits_flops(g, n, 0), .bytes = io_bytes(g, n)};
}

// Only the loss has a cotangent (correct is a count, lse a saved statistic). A trainable kernel's
// gradient goes straight into its persistent buffer, as dense_grad_weight's does: no [C, V]
// cotangent; a frozen one (a LoRA run) has none, and its backward forms dx alone. A bias's
// cotangent is an output of the backward ([V], as layer_norm_grad's dbias), which autodiff
// accumulates like any other (a frozen bias beside a trainable kernel leaves it unread).
void vjp_linear_cross_entropy(VjpCtx& c) {
  if (c.out_ct[0] == kNoValue) return;
  const bool biased = c.node.in.size() == 4;
  std::vector<ValueId> in = {c.in_id(0), c.in_id(1), c.in_id(2), c.out_id(2), c.out_ct[0]};
  if (biased) in.push_back(c.in_id(3));
  const ValueId grad = c.param_grad(1);
  if (grad == kNoValue) {
    if (c.needs[1] || (biased && c.needs[3]))
      throw std::invalid_argument("linear_cross_entropy at '" + c.node.scope +
                                  "': a kernel that needs a gradient, or a bias beside a frozen kernel that needs "
                                  "one, must be a trainable parameter kernel's (use the unfused head otherwise)");
    if (c.needs[0]) c.in_ct[0] = c.emit1(OpKind::linear_cross_entropy_grad_input, in, c.node.attrs);
    return;
  }
  in.insert(in.begin(), grad);
  if (!biased) {
    c.in_ct[0] = c.emit1(OpKind::linear_cross_entropy_grad, in, c.node.attrs);
    return;
  }
  const std::vector<ValueId> out = c.emit(OpKind::linear_cross_entropy_grad_with_bias, in, c.node.attrs);
  c.in_ct[0] = out[0];
  c.in_ct[3] = out[1];
}

namespace {
// The backward's inputs after the head's (x at x_at): lse [rows], the loss's cotangent, then the bias.
void check_backward(const Graph& g, const Node& n, int x_at, ValueDesc* out) {
  check_head(g, n, x_at, x_at + 5);
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

void infer_linear_cross_entropy_grad_with_bias(const Graph& g, const Node& n, ValueDesc* out) {
  infer_linear_cross_entropy_grad(g, n, out);
  out[1] = {in_val(g, n, 6).shape, DType::f32};
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

// The same, and a sum per logit (the bias's cotangent).
OpCost cost_linear_cross_entropy_grad_with_bias(const Graph& g, const Node& n) {
  OpCost cost = cost_linear_cross_entropy_grad(g, n);
  cost.flops += in_val(g, n, 1).shape.rows() * in_val(g, n, 6).shape.numel();
  return cost;
}

// The logits again, then dx's product.
OpCost cost_linear_cross_entropy_grad_input(const Graph& g, const Node& n) {
  const Value& x = in_val(g, n, 0);
  return OpCost{.flops = logits_flops(g, n, 0) + 2 * x.shape.rows() * in_val(g, n, 1).shape.numel(),
                .bytes = io_bytes(g, n)};
}

int64_t linear_cross_entropy_recomputed_flops(const Graph& g, const Node& n) {
  if (n.op == OpKind::linear_cross_entropy_grad || n.op == OpKind::linear_cross_entropy_grad_with_bias)
    return logits_flops(g, n, 1);
  if (n.op == OpKind::linear_cross_entropy_grad_input) return logits_flops(g, n, 0);
  return 0;
}

}  // namespace loom
