// Token embedding (a gather of table rows) and its scatter-add backward: shape rules and VJP.
#include "graph/ops/rules.h"

namespace loom {

void infer_embedding(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<DTypeAttrs>(n);
  const Value& ids = in_val(g, n, 0);
  const Value& table = in_val(g, n, 1);
  if (ids.dtype != DType::i32) op_fail(g, n, "ids must be int32");
  if (!dtype_is_float(a.dtype)) op_fail(g, n, "dtype must be a float dtype");
  // float32, or a parameter narrowed to the output dtype (graph/passes/narrow_params.h).
  if (table.shape.rank != 2 || (table.dtype != DType::f32 && table.dtype != a.dtype))
    op_fail(g, n, "table must be a [V, C] float32 (or output dtype) value");
  if (ids.shape.rank + 1 > kMaxRank) op_fail(g, n, "ids have too many dims for an output with one more");
  Shape s = ids.shape;
  s.push_back(table.shape[1]);
  out[0] = {s, a.dtype};
}

// A gather: the ids, the table rows they name (not the whole table), the output.
OpCost cost_embedding(const Graph& g, const Node& n) {
  const int64_t elems = g.value(n.out[0]).shape.numel();
  const auto row_bytes = static_cast<int64_t>(dtype_size(in_val(g, n, 1).dtype));
  return OpCost{.flops = 0, .bytes = in_val(g, n, 0).bytes() + elems * row_bytes + g.value(n.out[0]).bytes()};
}

// out = take(cast(table), ids) ⇒ dtable = scatter-add of dy rows at ids. The dense [V, C]
// cotangent would cost a vocabulary-sized buffer per use, so the rule accumulates straight into
// the table's persistent gradient (VjpCtx::param_grad) and reports no cotangent for it.
// Ids are integers: never differentiable.
void vjp_embedding(VjpCtx& c) {
  if (!c.needs[1]) return;
  const ValueId grad = c.param_grad(1);
  if (grad == kNoValue) {
    std::string msg = "[embedding] at '";
    msg += c.node.scope;
    msg +=
        "': the table must be a parameter to be differentiated (embedding_grad scatter-adds into its "
        "gradient buffer); it is a value computed from one";
    throw std::invalid_argument(msg);
  }
  c.emit(OpKind::embedding_grad, {grad, c.in_id(0), c.out_ct[0]});
}

void infer_embedding_grad(const Graph& g, const Node& n, ValueDesc*) {
  const Value& acc = in_val(g, n, 0);
  const Value& ids = in_val(g, n, 1);
  const Value& dy = in_val(g, n, 2);
  if (acc.kind != ValueKind::grad || acc.shape.rank != 2 || acc.dtype != DType::f32)
    op_fail(g, n, "input 0 must be a persistent [V, C] float32 gradient buffer");
  if (ids.dtype != DType::i32) op_fail(g, n, "ids must be int32");
  if (!dtype_is_float(dy.dtype)) op_fail(g, n, "dy must be a float dtype");
  if (ids.shape.rank + 1 > kMaxRank) op_fail(g, n, "ids have too many dims");
  Shape s = ids.shape;
  s.push_back(acc.shape[1]);
  if (dy.shape != s) {
    std::string msg = "dy must have shape ";
    msg += s.str();
    msg += " (ids' shape + [C])";
    op_fail(g, n, msg);
  }
}

// A scatter-add: the ids and dy, and a read-modify-write of the f32 gradient rows they name.
OpCost cost_embedding_grad(const Graph& g, const Node& n) {
  const Value& dy = in_val(g, n, 2);
  return OpCost{.flops = dy.shape.numel(), .bytes = in_val(g, n, 1).bytes() + dy.bytes() + 2 * dy.shape.numel() * 4};
}

}  // namespace loom
