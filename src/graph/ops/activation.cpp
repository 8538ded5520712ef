// Elementwise activations (SiLU, tanh and exact GELU, SwiGLU's silu·mul) and the constant scale:
// shape rules, costs and VJPs.
#include <cmath>

#include "graph/ops/rules.h"

namespace loom {

namespace {
void infer_unary_float(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& x = in_val(g, n, 0);
  if (!dtype_is_float(x.dtype)) op_fail(g, n, "x must be a float dtype");
  out[0] = {x.shape, x.dtype};
}
// Every input like input 0 (a float tensor); `num_outputs` outputs like it.
void infer_alike(const Graph& g, const Node& n, ValueDesc* out, int num_outputs, const char* what) {
  const Value& x = in_val(g, n, 0);
  if (!dtype_is_float(x.dtype)) op_fail(g, n, "inputs must be a float dtype");
  for (size_t i = 1; i < n.in.size(); ++i)
    if (in_val(g, n, static_cast<int>(i)).shape != x.shape || in_val(g, n, static_cast<int>(i)).dtype != x.dtype)
      op_fail(g, n, what);
  for (int i = 0; i < num_outputs; ++i) out[i] = {x.shape, x.dtype};
}
void infer_unary_grad(const Graph& g, const Node& n, ValueDesc* out) {
  infer_alike(g, n, out, 1, "x and dy must match in shape and dtype");
}
}  // namespace

void infer_silu(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_float(g, n, out); }
void infer_gelu(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_float(g, n, out); }
void infer_silu_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_grad(g, n, out); }
void infer_gelu_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_grad(g, n, out); }
void infer_gelu_erf(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_float(g, n, out); }
void infer_gelu_erf_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_grad(g, n, out); }
void infer_silu_mul(const Graph& g, const Node& n, ValueDesc* out) {
  infer_alike(g, n, out, 1, "gate and up must match in shape and dtype");
}
void infer_silu_mul_grad(const Graph& g, const Node& n, ValueDesc* out) {
  infer_alike(g, n, out, 2, "gate, up and dy must match in shape and dtype");
}
void infer_gelu_mul(const Graph& g, const Node& n, ValueDesc* out) { infer_silu_mul(g, n, out); }
void infer_gelu_mul_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_silu_mul_grad(g, n, out); }

// FLOPs per element (exp and tanh counted as one): silu x·σ(x) 4; its grad dy·σ·(1 + x·(1 − σ)) 8;
// tanh-GELU 0.5·x·(1 + tanh(c·(x + 0.044715·x³))) 10; its grad 18; exact GELU 0.5·x·erfc(−x/√2)
// with erfc ~ an exp and a degree-9 polynomial 24, its grad (also exp(−x²/2)) 30; silu(g)·u 5,
// its grad (dgate and dup from one sigmoid) 10; gelu(g)·u 11, its grad (gelu and gelu_grad) 30.
OpCost cost_silu(const Graph& g, const Node& n) { return elementwise_cost(g, n, 4); }
OpCost cost_silu_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 8); }
OpCost cost_gelu(const Graph& g, const Node& n) { return elementwise_cost(g, n, 10); }
OpCost cost_gelu_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 18); }
OpCost cost_gelu_erf(const Graph& g, const Node& n) { return elementwise_cost(g, n, 24); }
OpCost cost_gelu_erf_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 30); }
OpCost cost_silu_mul(const Graph& g, const Node& n) { return elementwise_cost(g, n, 5); }
OpCost cost_silu_mul_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 10); }
OpCost cost_gelu_mul(const Graph& g, const Node& n) { return elementwise_cost(g, n, 11); }
OpCost cost_gelu_mul_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 30); }

void vjp_silu(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::silu_grad, {c.in_id(0), c.out_ct[0]}); }
void vjp_gelu(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::gelu_grad, {c.in_id(0), c.out_ct[0]}); }
void vjp_gelu_erf(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::gelu_erf_grad, {c.in_id(0), c.out_ct[0]}); }
// One backward op gives both cotangents (they share silu(gate)'s sigmoid).
void vjp_silu_mul(VjpCtx& c) {
  const auto outs = c.emit(OpKind::silu_mul_grad, {c.in_id(0), c.in_id(1), c.out_ct[0]});
  c.in_ct[0] = outs[0];
  c.in_ct[1] = outs[1];
}
void vjp_gelu_mul(VjpCtx& c) {
  const auto outs = c.emit(OpKind::gelu_mul_grad, {c.in_id(0), c.in_id(1), c.out_ct[0]});
  c.in_ct[0] = outs[0];
  c.in_ct[1] = outs[1];
}

void infer_scale(const Graph& g, const Node& n, ValueDesc* out) {
  if (!std::isfinite(attrs_of<ScaleAttrs>(n).factor)) op_fail(g, n, "factor must be finite");
  infer_unary_float(g, n, out);
}
// One multiply per element.
OpCost cost_scale(const Graph& g, const Node& n) { return elementwise_cost(g, n, 1); }
// Linear: the cotangent is scaled by the same rounded factor.
void vjp_scale(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::scale, {c.out_ct[0]}, c.node.attrs); }

}  // namespace loom
