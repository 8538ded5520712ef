// Elementwise structure ops (dropout, cast, add) and in-place gradient accumulation.
#include "graph/ops/rules.h"

namespace loom {

void infer_dropout(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<DropoutAttrs>(n);
  const Value& x = in_val(g, n, 0);
  if (!(a.rate >= 0.f && a.rate < 1.f)) op_fail(g, n, "rate must be in [0, 1)");
  if (!dtype_is_float(x.dtype)) op_fail(g, n, "x must be a float dtype");
  out[0] = {x.shape, x.dtype};
}

// The mask depends only on (seed, step, minibatch, stream), so dropout of dy with the same
// attributes multiplies by the same mask / keep: the op is its own VJP.
void vjp_dropout(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::dropout, {c.out_ct[0]}, c.node.attrs); }
// A compare and a multiply per element (the integer Philox draws are not FLOPs).
OpCost cost_dropout(const Graph& g, const Node& n) { return elementwise_cost(g, n, 2); }

void infer_reshape(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<ShapeAttrs>(n);
  const Value& x = in_val(g, n, 0);
  if (a.shape.numel() != x.shape.numel())
    op_fail(g, n, "cannot reshape to " + a.shape.str() + ": element counts differ");
  out[0] = {a.shape, x.dtype};
}

void vjp_reshape(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::reshape, {c.out_ct[0]}, ShapeAttrs{c.in(0).shape}); }
// A view: no kernel work, no traffic.
OpCost cost_reshape(const Graph&, const Node&) { return OpCost{}; }

void infer_cast(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<DTypeAttrs>(n);
  out[0] = {in_val(g, n, 0).shape, a.dtype};
}

// A conversion per element: traffic only.
OpCost cost_cast(const Graph& g, const Node& n) { return elementwise_cost(g, n, 0); }

void vjp_cast(VjpCtx& c) {
  const Value& x = c.in(0);
  c.in_ct[0] =
      x.dtype == c.g.value(c.out_ct[0]).dtype ? c.out_ct[0] : c.emit1(OpKind::cast, {c.out_ct[0]}, DTypeAttrs{x.dtype});
}

void infer_add(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& a = in_val(g, n, 0);
  const Value& b = in_val(g, n, 1);
  if (a.dtype != b.dtype) op_fail(g, n, "a and b must have the same dtype");
  if (!a.shape.ends_with(b.shape)) op_fail(g, n, "b's shape must equal the trailing dims of a's");
  out[0] = {a.shape, a.dtype};
}

OpCost cost_add(const Graph& g, const Node& n) { return elementwise_cost(g, n, 1); }

void vjp_add(VjpCtx& c) {
  const ValueId dy = c.out_ct[0];
  if (c.needs[0]) c.in_ct[0] = dy;
  if (c.needs[1]) {
    const Value& b = c.in(1);
    c.in_ct[1] = b.shape == c.in(0).shape
                     ? dy
                     : c.emit1(OpKind::sum_leading, {dy}, ReduceAttrs{.keep_dims = b.shape.rank, .dtype = b.dtype});
  }
}

void infer_take_columns(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<ColumnsAttrs>(n);
  const Value& dy = in_val(g, n, 0);
  if (!dtype_is_float(dy.dtype)) op_fail(g, n, "dy must be a float dtype");
  if (dy.shape.rank < 1 || a.width < 1 || a.offset < 0 || a.offset + a.width > dy.shape.last())
    op_fail(g, n, "columns [offset, offset + width) must lie in dy's last dim");
  out[0] = {dy.shape.with_last(a.width), dy.dtype};
}

OpCost cost_take_columns(const Graph& g, const Node& n) { return elementwise_cost(g, n, 1); }

void infer_grad_accumulate(const Graph& g, const Node& n, ValueDesc*) {
  const Value& acc = in_val(g, n, 0);
  const Value& ct = in_val(g, n, 1);
  if (acc.kind != ValueKind::grad) op_fail(g, n, "input 0 must be a persistent gradient buffer");
  if (acc.shape != ct.shape || ct.dtype != DType::f32)
    op_fail(g, n, "cotangent must be float32 with the gradient's shape");
}

// grad += ct: reads both, writes grad back.
OpCost cost_grad_accumulate(const Graph& g, const Node& n) {
  const Value& acc = in_val(g, n, 0);
  return OpCost{.flops = acc.shape.numel(), .bytes = io_bytes(g, n) + acc.bytes()};
}

}  // namespace loom
