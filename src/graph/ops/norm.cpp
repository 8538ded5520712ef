// Layer normalisation: shape rules and VJP.
#include "graph/ops/rules.h"

namespace loom {

void infer_layer_norm(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<LayerNormAttrs>(n);
  const Value& x = in_val(g, n, 0);
  if (x.shape.rank < 1) op_fail(g, n, "x must have rank >= 1 (normalised over its last dim)");
  const Shape c{x.shape.last()};
  if (!dtype_is_float(x.dtype) || !dtype_is_float(a.dtype)) op_fail(g, n, "float dtypes only");
  if (!(a.eps > 0.f)) op_fail(g, n, "eps must be positive");
  for (int i = 1; i <= 2; ++i)
    if (in_val(g, n, i).shape != c || in_val(g, n, i).dtype != DType::f32)
      op_fail(g, n, "scale and bias must be [C] float32 parameters");
  out[0] = {x.shape, a.dtype};
  out[1] = {x.shape.drop_last(), DType::f32};  // mean
  out[2] = {x.shape.drop_last(), DType::f32};  // rstd = 1/sqrt(var + eps)
}

// Per element: mean and variance sums (3), normalise (2), scale and shift (2), the cast (1): ~8.
OpCost cost_layer_norm(const Graph& g, const Node& n) { return elementwise_cost(g, n, 8); }

// Only y carries a cotangent: mean and rstd are saved statistics for the backward, not model outputs.
void vjp_layer_norm(VjpCtx& c) {
  if (c.out_ct[0] == kNoValue) return;
  const auto outs =
      c.emit(OpKind::layer_norm_grad, {c.out_ct[0], c.in_id(0), c.in_id(1), c.out_id(1), c.out_id(2)}, c.node.attrs);
  for (int i = 0; i < 3; ++i) c.in_ct[i] = outs[i];
}

void infer_layer_norm_grad(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& dy = in_val(g, n, 0);
  const Value& x = in_val(g, n, 1);
  if (x.shape.rank < 1) op_fail(g, n, "x must have rank >= 1");
  if (dy.shape != x.shape) op_fail(g, n, "dy and x must have the same shape");
  if (!dtype_is_float(dy.dtype) || !dtype_is_float(x.dtype)) op_fail(g, n, "float dtypes only");
  const Value& scale = in_val(g, n, 2);
  if (scale.shape != Shape{x.shape.last()} || scale.dtype != DType::f32) op_fail(g, n, "scale must be [C] float32");
  for (int i = 3; i <= 4; ++i)
    if (in_val(g, n, i).shape != x.shape.drop_last() || in_val(g, n, i).dtype != DType::f32)
      op_fail(g, n, "mean and rstd must be float32 with x's shape minus the last dim");
  out[0] = {x.shape, x.dtype};
  out[1] = {Shape{x.shape.last()}, DType::f32};
  out[2] = {Shape{x.shape.last()}, DType::f32};
}

// Per element: x̂ (2), g·dy (1), the two row sums (3), dx (4), dscale and dbias (2): ~12.
OpCost cost_layer_norm_grad(const Graph& g, const Node& n) {
  return OpCost{.flops = 12 * in_val(g, n, 1).shape.numel(), .bytes = io_bytes(g, n)};
}

}  // namespace loom
