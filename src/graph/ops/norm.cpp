// Layer normalisation and RMS normalisation (layer_norm without the centring and the bias): shape
// rules and VJPs.
#include "graph/ops/rules.h"

namespace loom {

namespace {

// The forward's checks: x of rank >= 1 normalised over its last dim C; inputs 1.. (scale, and bias
// for layer_norm) [C] float32 parameters. Output 0 is y; the rest are per-row f32 statistics.
void infer_norm(const Graph& g, const Node& n, ValueDesc* out, int num_outputs) {
  const auto& a = attrs_of<LayerNormAttrs>(n);
  const Value& x = in_val(g, n, 0);
  if (x.shape.rank < 1) op_fail(g, n, "x must have rank >= 1 (normalised over its last dim)");
  const Shape c{x.shape.last()};
  if (!dtype_is_float(x.dtype) || !dtype_is_float(a.dtype)) op_fail(g, n, "float dtypes only");
  if (!(a.eps > 0.f)) op_fail(g, n, "eps must be positive");
  if (a.unit_offset && n.op == OpKind::layer_norm) op_fail(g, n, "unit_offset is rms_norm's");
  for (size_t i = 1; i < n.in.size(); ++i)
    if (in_val(g, n, static_cast<int>(i)).shape != c || in_val(g, n, static_cast<int>(i)).dtype != DType::f32)
      op_fail(g, n, "scale (and bias) must be [C] float32 parameters");
  out[0] = {x.shape, a.dtype};
  for (int i = 1; i < num_outputs; ++i) out[i] = {x.shape.drop_last(), DType::f32};
}

// The backward's checks: (dy, x, scale, stats...) with dy like x, scale [C] f32 and each statistic
// f32 with x's shape minus the last dim. Outputs dx (x's dtype), then [C] f32 parameter gradients.
void infer_norm_grad(const Graph& g, const Node& n, ValueDesc* out, int num_outputs) {
  const Value& dy = in_val(g, n, 0);
  const Value& x = in_val(g, n, 1);
  if (x.shape.rank < 1) op_fail(g, n, "x must have rank >= 1");
  if (dy.shape != x.shape) op_fail(g, n, "dy and x must have the same shape");
  if (!dtype_is_float(dy.dtype) || !dtype_is_float(x.dtype)) op_fail(g, n, "float dtypes only");
  const Value& scale = in_val(g, n, 2);
  if (scale.shape != Shape{x.shape.last()} || scale.dtype != DType::f32) op_fail(g, n, "scale must be [C] float32");
  for (size_t i = 3; i < n.in.size(); ++i)
    if (in_val(g, n, static_cast<int>(i)).shape != x.shape.drop_last() ||
        in_val(g, n, static_cast<int>(i)).dtype != DType::f32)
      op_fail(g, n, "the statistics must be float32 with x's shape minus the last dim");
  out[0] = {x.shape, x.dtype};
  for (int i = 1; i < num_outputs; ++i) out[i] = {Shape{x.shape.last()}, DType::f32};
}

// Only y carries a cotangent: the statistics are saved for the backward, not model outputs. The
// backward reads (dy, x, scale, the statistics) and gives (dx, dscale[, dbias]).
void vjp_norm(VjpCtx& c, OpKind grad) {
  if (c.out_ct[0] == kNoValue) return;
  std::vector<ValueId> in = {c.out_ct[0], c.in_id(0), c.in_id(1)};
  for (size_t i = 1; i < c.node.out.size(); ++i) in.push_back(c.out_id(static_cast<int>(i)));
  const auto outs = c.emit(grad, in, c.node.attrs);
  for (size_t i = 0; i < c.node.in.size(); ++i) c.in_ct[i] = outs[i];
}

}  // namespace

void infer_layer_norm(const Graph& g, const Node& n, ValueDesc* out) { infer_norm(g, n, out, 3); }  // y, mean, rstd
void infer_rms_norm(const Graph& g, const Node& n, ValueDesc* out) { infer_norm(g, n, out, 2); }    // y, rstd
void infer_layer_norm_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_norm_grad(g, n, out, 3); }
void infer_rms_norm_grad(const Graph& g, const Node& n, ValueDesc* out) { infer_norm_grad(g, n, out, 2); }

// Per element: mean and variance sums (3), normalise (2), scale and shift (2), the cast (1): ~8.
OpCost cost_layer_norm(const Graph& g, const Node& n) { return elementwise_cost(g, n, 8); }
// Per element: the sum of squares (2), normalise (1), scale (1), the cast (1): ~5.
OpCost cost_rms_norm(const Graph& g, const Node& n) { return elementwise_cost(g, n, 5); }

void vjp_layer_norm(VjpCtx& c) { vjp_norm(c, OpKind::layer_norm_grad); }
void vjp_rms_norm(VjpCtx& c) { vjp_norm(c, OpKind::rms_norm_grad); }

// Per element: x̂ (2), g·dy (1), the two row sums (3), dx (4), dscale and dbias (2): ~12.
OpCost cost_layer_norm_grad(const Graph& g, const Node& n) {
  return OpCost{.flops = 12 * in_val(g, n, 1).shape.numel(), .bytes = io_bytes(g, n)};
}
// Per element: x̂ (1), g·dy (1), the row sum of g·x̂ (2), dx (3), dscale (2): ~9.
OpCost cost_rms_norm_grad(const Graph& g, const Node& n) {
  return OpCost{.flops = 9 * in_val(g, n, 1).shape.numel(), .bytes = io_bytes(g, n)};
}

// qk_norm's checks: qkv [B, T, S, (G+2)·D] float, q_scale and k_scale [D] f32; returns D.
namespace {
int64_t check_qk_norm(const Graph& g, const Node& n, const Value& qkv, int first_scale) {
  const auto& a = attrs_of<QkNormAttrs>(n);
  if (a.group < 1) op_fail(g, n, "attrs.group (query heads per key/value head) must be >= 1");
  if (!(a.eps > 0.f)) op_fail(g, n, "eps must be positive");
  if (!dtype_is_float(qkv.dtype)) op_fail(g, n, "qkv must be a float dtype");
  if (qkv.shape.rank != 4) op_fail(g, n, "qkv must have rank 4: [batch, length, kv heads, (group+2)·head_dim]");
  const int64_t parts = a.group + 2;
  if (qkv.shape[3] == 0 || qkv.shape[3] % parts != 0)
    op_fail(g, n,
            "qkv's last dim (" + std::to_string(qkv.shape[3]) +
                ") must be (group+2)·head_dim with group = " + std::to_string(a.group));
  const int64_t D = qkv.shape[3] / parts;
  for (int i = first_scale; i < first_scale + 2; ++i)
    if (in_val(g, n, i).shape != Shape{D} || in_val(g, n, i).dtype != DType::f32)
      op_fail(g, n, "q_scale and k_scale must be [head_dim] float32 parameters");
  return D;
}
// The statistics' shape: one per normalised head, [B, T, S, G+1].
Shape qk_norm_stats(const Shape& qkv, int32_t group) { return Shape{qkv[0], qkv[1], qkv[2], group + 1}; }
}  // namespace

void infer_qk_norm(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& x = in_val(g, n, 0);
  check_qk_norm(g, n, x, 1);
  out[0] = {x.shape, x.dtype};
  out[1] = {qk_norm_stats(x.shape, attrs_of<QkNormAttrs>(n).group), DType::f32};
}

void infer_qk_norm_grad(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& dy = in_val(g, n, 0);
  const Value& x = in_val(g, n, 1);
  const int64_t D = check_qk_norm(g, n, x, 2);
  if (dy.shape != x.shape || dy.dtype != x.dtype) op_fail(g, n, "dy must have qkv's shape and dtype");
  const Value& rstd = in_val(g, n, 4);
  if (rstd.shape != qk_norm_stats(x.shape, attrs_of<QkNormAttrs>(n).group) || rstd.dtype != DType::f32)
    op_fail(g, n, "rstd must be float32 [batch, length, kv heads, group+1]");
  out[0] = {x.shape, x.dtype};
  out[1] = {Shape{D}, DType::f32};
  out[2] = {Shape{D}, DType::f32};
}

// rms_norm's per element, on the normalised (G+1)/(G+2) of qkv (the copy of v costs bytes only).
OpCost cost_qk_norm(const Graph& g, const Node& n) {
  const int64_t parts = attrs_of<QkNormAttrs>(n).group + 2;
  return OpCost{.flops = 5 * in_val(g, n, 0).shape.numel() / parts * (parts - 1), .bytes = io_bytes(g, n)};
}
OpCost cost_qk_norm_grad(const Graph& g, const Node& n) {
  const int64_t parts = attrs_of<QkNormAttrs>(n).group + 2;
  return OpCost{.flops = 9 * in_val(g, n, 1).shape.numel() / parts * (parts - 1), .bytes = io_bytes(g, n)};
}

// The backward reads (dy, qkv, q_scale, k_scale, rstd) and gives (dqkv, dq_scale, dk_scale).
void vjp_qk_norm(VjpCtx& c) {
  if (c.out_ct[0] == kNoValue) return;
  const auto outs =
      c.emit(OpKind::qk_norm_grad, {c.out_ct[0], c.in_id(0), c.in_id(1), c.in_id(2), c.out_id(1)}, c.node.attrs);
  for (int i = 0; i < 3; ++i) c.in_ct[static_cast<size_t>(i)] = outs[static_cast<size_t>(i)];
}

}  // namespace loom
