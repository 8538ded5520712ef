// Dense (matmul + bias) and its backward ops: shape rules and VJP.
#include <stdexcept>

#include "graph/ops/rules.h"

namespace loom {

namespace {
void require_float(const Graph& g, const Node& n, int i, const char* what) {
  if (!dtype_is_float(in_val(g, n, i).dtype)) op_fail(g, n, std::string(what) + " must be a float dtype");
}
}  // namespace

void infer_dense(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<DenseAttrs>(n);
  const Value& x = in_val(g, n, 0);
  const Value& w = in_val(g, n, 1);
  if (!dtype_is_float(a.compute)) op_fail(g, n, "compute dtype must be a float dtype");
  require_float(g, n, 0, "x");
  // float32, or a parameter narrowed to the compute dtype (graph/passes/narrow_params.h).
  const auto stored = [&](const Value& v) { return v.dtype == DType::f32 || v.dtype == a.compute; };
  // A LoRA run's frozen base kernel may be stored in bfloat16 or a quantized format whatever the
  // compute dtype (lora.base_dtype; core/quant.h), a quantized one only as [K, N].
  const bool base = w.dtype == DType::bf16 || (dtype_is_quantized(w.dtype) && !a.transpose_w);
  if (w.shape.rank != 2 || !(stored(w) || base))
    op_fail(g, n,
            a.transpose_w ? "kernel must be an [N, K] float32 (or compute dtype) parameter"
                          : "kernel must be a [K, N] float32, compute dtype, bfloat16 or quantized parameter");
  const int64_t K = w.shape[a.transpose_w ? 1 : 0], N = w.shape[a.transpose_w ? 0 : 1];
  if (x.shape.rank < 1 || x.shape.last() != K) {
    std::string msg = "last dim of x (";
    msg += std::to_string(x.shape.last()) + ") must equal the kernel's K (" + std::to_string(K) + ")";
    op_fail(g, n, msg);
  }
  if (n.in.size() == 3) {
    const Value& b = in_val(g, n, 2);
    if (b.shape != Shape{N} || !stored(b)) op_fail(g, n, "bias must be a [N] float32 (or compute dtype) parameter");
  }
  out[0] = {x.shape.with_last(N), a.compute};
}

// 2·M·K·N (M = rows of x); the bias add and the roundings are not counted. Bytes: x, the kernel
// (and bias) as stored, y.
OpCost cost_dense(const Graph& g, const Node& n) {
  const Value& x = in_val(g, n, 0);
  return OpCost{.flops = 2 * x.shape.rows() * x.shape.last() * g.value(n.out[0]).shape.last(), .bytes = io_bytes(g, n)};
}

// The gradient buffer behind a kernel: its own when it is a parameter, or that of the parameter
// it is a chain of reshapes of (DenseGeneral's [H, D, C] kernels). A reshape keeps row-major
// order, so the [K, N] gradient is written into that buffer as it is. kNoValue otherwise.
ValueId kernel_grad(const Graph& g, ValueId w) {
  for (;;) {
    if (const ValueId grad = g.grad_of(w); grad != kNoValue) return grad;
    const NodeId p = g.value(w).producer;
    if (p < 0 || g.node(p).op != OpKind::reshape) return kNoValue;
    w = g.node(p).in[0];
  }
}

namespace {
// dW += xᵀ·dy (op(W) = Wᵀ when transpose): straight into the persistent gradient buffer behind
// kernel w (dense_grad_weight accumulates).
void emit_kernel_grad(VjpCtx& c, ValueId x, ValueId w, ValueId dy, DType compute, bool transpose) {
  const ValueId grad = kernel_grad(c.g, w);
  if (grad == kNoValue)
    throw std::invalid_argument(std::string(op_name(c.node.op)) + " at '" + c.node.scope +
                                "': only a parameter kernel (or a reshape of one) can be differentiated");
  c.emit(OpKind::dense_grad_weight, {grad, x, dy}, DenseGradWeightAttrs{.compute = compute, .transpose_w = transpose});
}
}  // namespace

// y = x·W + b  ⇒  dx = dy·Wᵀ (M×N · (K×N)ᵀ → M×K), dW = xᵀ·dy (K×M · M×N → K×N), db = Σ_rows dy.
void vjp_dense(VjpCtx& c) {
  const auto a = std::get<DenseAttrs>(c.node.attrs);
  const ValueId dy = c.out_ct[0];
  // dW first: it is the last reader of x, so x is freed before dx is allocated (x and dx have
  // the same size; in the other order both are live at once — a whole activation at the peak).
  // The kernel's gradient goes straight into its persistent buffer (dense_grad_weight accumulates).
  if (c.needs[1]) emit_kernel_grad(c, c.in_id(0), c.in_id(1), dy, a.compute, a.transpose_w);
  if (c.needs[0] && a.low_rank && c.in(0).dtype == a.compute) {
    // dx = dy·Wᵀ with W [K, r] (Wᵀ is add_low_rank's V stored [N, r]).
    c.in_low_rank[0] = {
        dy, c.in_id(1),
        ColumnsAttrs{.width = c.in(0).shape.last(), .compute = a.compute, .transpose_v = !a.transpose_w}};
  } else if (c.needs[0]) {
    c.in_ct[0] =
        c.emit1(OpKind::dense_grad_input, {dy, c.in_id(1)},
                DenseGradAttrs{.compute = a.compute, .out_dtype = c.in(0).dtype, .transpose_w = a.transpose_w});
  }
  if (c.node.in.size() == 3 && c.needs[2]) {
    // JAX reduces the bias cotangent in the compute dtype, then the f32 cast's VJP widens it.
    ValueId db = c.emit1(OpKind::sum_leading, {dy}, ReduceAttrs{.keep_dims = 1, .dtype = a.compute});
    if (a.compute != DType::f32) db = c.emit1(OpKind::cast, {db}, DTypeAttrs{DType::f32});
    c.in_ct[2] = db;
  }
}

void infer_add_low_rank(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<ColumnsAttrs>(n);
  const Value& y = in_val(g, n, 0);
  const Value& u = in_val(g, n, 1);
  const Value& v = in_val(g, n, 2);
  if (!dtype_is_float(a.compute) || y.dtype != a.compute || u.dtype != a.compute)
    op_fail(g, n, "y and u must be in the compute dtype, a float dtype");
  if (v.shape.rank != 2 || (v.dtype != DType::f32 && v.dtype != a.compute))
    op_fail(g, n, "V must be a rank-2 float32 (or compute dtype) parameter");
  const int64_t r = v.shape[a.transpose_v ? 1 : 0], N = v.shape[a.transpose_v ? 0 : 1];
  if (u.shape.rank < 1 || u.shape.last() != r) op_fail(g, n, "u's last dim must equal V's rank r");
  if (y.shape.rank < 1 || a.width < 1 || N % a.width != 0 || a.offset < 0 || a.offset + a.width > y.shape.last())
    op_fail(g, n, "columns [offset, offset + width) must lie in y's last dim, width dividing V's N");
  if (y.shape.numel() != u.shape.rows() * (N / a.width) * y.shape.last())
    op_fail(g, n, "y must hold u's rows times N / width rows of its last dim");
  out[0] = {y.shape, y.dtype};
}

// The product (2·M·r·N) and an add per element of it.
OpCost cost_add_low_rank(const Graph& g, const Node& n) {
  const Value& u = in_val(g, n, 1);
  const int64_t MN = g.value(n.out[0]).shape.numel() / g.value(n.out[0]).shape.last() * attrs_of<ColumnsAttrs>(n).width;
  return OpCost{.flops = 2 * MN * u.shape.last() + 2 * MN, .bytes = io_bytes(g, n)};
}

// y' = y + s·(u·V) in the columns  ⇒  dy' passes to y; g = s·dy'[columns] (take_columns, as
// u's rows × N) is the cotangent of u·V: du = g·Vᵀ, dV = uᵀ·g, as dense's VJP.
void vjp_add_low_rank(VjpCtx& c) {
  const auto a = std::get<ColumnsAttrs>(c.node.attrs);
  const ValueId dy = c.out_ct[0];
  if (c.needs[0]) c.in_ct[0] = dy;
  if (!c.needs[1] && !c.needs[2]) return;
  const Shape& us = c.in(1).shape;
  const int64_t N = c.in(2).shape[a.transpose_v ? 0 : 1];
  ValueId ct = c.emit1(OpKind::take_columns, {dy}, c.node.attrs);
  if (c.g.value(ct).shape != us.with_last(N)) ct = c.emit1(OpKind::reshape, {ct}, ShapeAttrs{us.with_last(N)});
  if (c.needs[2]) emit_kernel_grad(c, c.in_id(1), c.in_id(2), ct, a.compute, a.transpose_v);  // first: see vjp_dense
  if (c.needs[1])
    c.in_ct[1] =
        c.emit1(OpKind::dense_grad_input, {ct, c.in_id(2)},
                DenseGradAttrs{.compute = a.compute, .out_dtype = c.in(1).dtype, .transpose_w = a.transpose_v});
}

void infer_dense_grad_input(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<DenseGradAttrs>(n);
  const Value& dy = in_val(g, n, 0);
  const Value& w = in_val(g, n, 1);
  if (w.shape.rank != 2 || dy.shape.rank < 1) op_fail(g, n, "needs dy of rank >= 1 and a rank-2 kernel");
  const int64_t K = w.shape[a.transpose_w ? 1 : 0], N = w.shape[a.transpose_w ? 0 : 1];
  if (dy.shape.last() != N) op_fail(g, n, "dy's last dim must equal the kernel's N");
  if (dtype_is_quantized(w.dtype) && a.transpose_w) op_fail(g, n, "a quantized kernel is stored [K, N]");
  if (!dtype_is_float(a.out_dtype)) op_fail(g, n, "out_dtype must be a float dtype");
  out[0] = {dy.shape.with_last(K), a.out_dtype};
}

// dx[M, K] = dy[M, N]·Wᵀ: 2·M·K·N.
OpCost cost_dense_grad_input(const Graph& g, const Node& n) {
  const Value& dy = in_val(g, n, 0);
  return OpCost{.flops = 2 * dy.shape.rows() * dy.shape.last() * g.value(n.out[0]).shape.last(),
                .bytes = io_bytes(g, n)};
}

void infer_dense_grad_weight(const Graph& g, const Node& n, ValueDesc*) {
  const Value& grad = in_val(g, n, 0);
  const Value& x = in_val(g, n, 1);
  const Value& dy = in_val(g, n, 2);
  if (grad.kind != ValueKind::grad) op_fail(g, n, "input 0 must be a persistent gradient buffer");
  if (x.shape.rank < 1 || dy.shape.rank < 1 || x.shape.rows() != dy.shape.rows())
    op_fail(g, n, "x and dy must have the same number of rows");
  const bool t = attrs_of<DenseGradWeightAttrs>(n).transpose_w;
  // The buffer may have the shape of a parameter the kernel is a reshape of: only its size counts.
  const Shape want = t ? Shape{dy.shape.last(), x.shape.last()} : Shape{x.shape.last(), dy.shape.last()};
  if (grad.shape.numel() != want.numel() || grad.dtype != DType::f32)
    op_fail(g, n, "the gradient must be float32 with the kernel's " + want.str() + " elements");
}

// grad += xᵀ[K, M]·dy[M, N]: 2·M·K·N; bytes: x, dy and the gradient read and written back.
OpCost cost_dense_grad_weight(const Graph& g, const Node& n) {
  const Value& x = in_val(g, n, 1);
  return OpCost{.flops = 2 * x.shape.rows() * x.shape.last() * in_val(g, n, 2).shape.last(),
                .bytes = io_bytes(g, n) + in_val(g, n, 0).bytes()};
}

void infer_sum_leading(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<ReduceAttrs>(n);
  const Value& x = in_val(g, n, 0);
  if (a.keep_dims < 0 || a.keep_dims > x.shape.rank) op_fail(g, n, "keep_dims out of range");
  if (!dtype_is_float(a.dtype) || !dtype_is_float(x.dtype)) op_fail(g, n, "float dtypes only");
  Shape s;
  for (int i = x.shape.rank - a.keep_dims; i < x.shape.rank; ++i) s.push_back(x.shape[i]);
  out[0] = {s, a.dtype};
}

// One add per input element.
OpCost cost_sum_leading(const Graph& g, const Node& n) {
  return OpCost{.flops = in_val(g, n, 0).shape.numel(), .bytes = io_bytes(g, n)};
}

}  // namespace loom
