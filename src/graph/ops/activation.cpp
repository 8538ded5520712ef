// Elementwise activations (SiLU, tanh-GELU): shape rules and VJPs.
#include "graph/ops/rules.h"

namespace loom {

namespace {
void infer_unary_float(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& x = in_val(g, n, 0);
  if (!dtype_is_float(x.dtype)) op_fail(g, n, "x must be a float dtype");
  out[0] = {x.shape, x.dtype};
}
void infer_unary_grad(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& x = in_val(g, n, 0);
  const Value& dy = in_val(g, n, 1);
  if (x.shape != dy.shape || x.dtype != dy.dtype) op_fail(g, n, "x and dy must match in shape and dtype");
  out[0] = {x.shape, x.dtype};
}
}  // namespace

void infer_silu(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_float(g, n, out); }
void infer_gelu(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_float(g, n, out); }
void infer_silu_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_grad(g, n, out); }
void infer_gelu_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_unary_grad(g, n, out); }

// FLOPs per element (exp and tanh counted as one): silu x·σ(x) 4; its grad dy·σ·(1 + x·(1 − σ)) 8;
// tanh-GELU 0.5·x·(1 + tanh(c·(x + 0.044715·x³))) 10; its grad 18.
OpCost cost_silu(const Graph& g, const Node& n) { return elementwise_cost(g, n, 4); }
OpCost cost_silu_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 8); }
OpCost cost_gelu(const Graph& g, const Node& n) { return elementwise_cost(g, n, 10); }
OpCost cost_gelu_grad(const Graph& g, const Node& n) { return elementwise_cost(g, n, 18); }

void vjp_silu(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::silu_grad, {c.in_id(0), c.out_ct[0]}); }
void vjp_gelu(VjpCtx& c) { c.in_ct[0] = c.emit1(OpKind::gelu_grad, {c.in_id(0), c.out_ct[0]}); }

}  // namespace loom
