// Fused multi-head dot-product attention on the packed qkv projection: shape rules and VJP.
//
// Semantics: the tutorial's dot_product_attention(q, k, v, mask, softmax_dtype) applied to
// q, k, v = jnp.split(qkv, 3, axis=-1), qkv being the DenseGeneral output [B, T, H, 3D]. With
// d = qkv.dtype, s = softmax_dtype, round_x = round to nearest even to x, and
// scale = round_d(float(D^-0.5)) (attrs.scale when > 0; JAX casts the Python scalar D**-0.5 to the weakly typed
// operand's dtype: 0.353515625 for bf16 and D = 8; exact for D a power of 4):
//
//   qs[i] = round_s(round_d(q[i]·scale))            ks[j] = round_s(k[j])
//   logits[i, j] = round_s(Σ_d qs[i, d]·ks[j, d])   masked (causal and j > i, or a window W and
//                                                    j <= i − W, or with positions j < i − pos[i],
//                                                    another example): finfo(s).min
//   p[i, j] = softmax_j(logits[i, :])                computed in f32/double, round_s'd when s is 16-bit
//   w = round_d(p)                                   out[i] = round_d(Σ_j w[i, j]·v[j])
//   lse[i] = log Σ_j exp(logits[i, j])               f32, saved for the backward
//
// Backward (JAX's VJP of the above; the round_s steps are identities for s = f32, and are where
// JAX converts to s: the transposes of the astype(s) casts and the einsums in s):
//
//   p = round_s(exp(logits − lse)) (masked: 0)       w = round_d(p)
//   dv[j] = round_d(Σ_i w[i, j]·dout[i])             dp[i, j] = round_s(round_d(Σ_d dout[i, d]·v[j, d]))
//   ds[i, j] = round_s(p[i, j]·(dp[i, j] − Σ_j' p[i, j']·dp[i, j']))
//   dk[j] = round_d(round_s(Σ_i ds[i, j]·qs[i]))     dq[i] = round_d(round_d(round_s(Σ_j ds[i, j]·ks[j]))·scale)
//
// Grouped-query attention (attrs.group = G): qkv is [B, T, KV, (G+2)·D], each key/value head's G
// queries, then its key and value; query head h = j·G + i attends with key/value head j
// (transformers' repeat_kv, without the copy). dk and dv of a key/value head sum its G query
// heads' terms before the roundings above: dk[j] = round_d(round_s(Σ_heads Σ_i ds·qs)),
// dv[j] = round_d(Σ_heads Σ_i w·dout). G = 1 is the [B, T, H, 3D] layout above, unchanged.
//
// Memory: only out and lse are saved. The [T, T] logits / weights exist only inside a kernel's
// scratch (flash-attention style), so the plan never holds a B·H·T² buffer.
// FLOPs: forward 4·B·H·P·D (QKᵀ and PV); backward 8·B·H·P·D (dV, dP, dQ, dK) plus 2·B·H·P·D
// to recompute the logits, P the unmasked (query, key) pairs: T² in full, T·(T + 1)/2 causal, fewer
// with a window (unmasked_pairs, exact). With packed examples (positions) P is Σ n·(n + 1)/2 over
// each row's examples of n tokens, which the positions' values decide and a cost rule (shapes
// and attributes only) cannot see: it counts each row as one example (with the window, if any),
// an upper bound, reached when the examples fill their rows one each. The profiler's achieved
// FLOP/s and MFU of packed rows are overstated by that bound's ratio.
#include <algorithm>

#include "graph/ops/rules.h"

namespace loom {

namespace {

// The heads of a packed qkv [B, T, KV, (group+2)·D]: KV key/value heads, H = KV·group query heads.
struct Heads {
  int64_t B, T, KV, H, D;
};

Heads check_qkv(const Graph& g, const Node& n, const Value& qkv) {
  const auto& a = attrs_of<AttentionAttrs>(n);
  if (!dtype_is_float(a.softmax_dtype)) op_fail(g, n, "softmax_dtype must be a float dtype");
  if (a.group < 1) op_fail(g, n, "attrs.group (query heads per key/value head) must be >= 1");
  if (a.window < 0 || (a.window > 0 && !a.causal))
    op_fail(g, n, "attrs.window must be 0 (none) or, with attrs.causal, the keys a query sees (itself included)");
  if (!(a.scale >= 0.f && std::isfinite(a.scale))) op_fail(g, n, "attrs.scale must be 0 (head_dim^-0.5) or > 0");
  if (!dtype_is_float(qkv.dtype)) op_fail(g, n, "qkv must be a float dtype");
  if (qkv.shape.rank != 4) op_fail(g, n, "qkv must have rank 4: [batch, length, kv heads, (group+2)·head_dim]");
  const int64_t parts = a.group + 2;
  if (qkv.shape[3] % parts != 0 || qkv.shape[3] == 0) {
    std::string msg = "qkv's last dim (";
    msg += std::to_string(qkv.shape[3]);
    msg += ") must be (group+2)·head_dim, a positive multiple of ";
    msg += std::to_string(parts);
    op_fail(g, n, msg);
  }
  return {qkv.shape[0], qkv.shape[1], qkv.shape[2], qkv.shape[2] * a.group, qkv.shape[3] / parts};
}

// Inputs 1 and 2 of the cached ops: k_cache and v_cache [B, Tmax >= T, KV, D] in qkv's dtype, both
// persistent inputs (the ops write them).
void check_caches(const Graph& g, const Node& n, const Value& qkv, const Heads& h) {
  for (int i : {1, 2}) {
    const Value& c = in_val(g, n, i);
    if (c.shape.rank != 4 || c.shape[0] != h.B || c.shape[1] < h.T || c.shape[2] != h.KV || c.shape[3] != h.D ||
        c.dtype != qkv.dtype || c.shape != in_val(g, n, 1).shape)
      op_fail(g, n, "k_cache and v_cache must both be [batch, max_len >= tokens, kv heads, head_dim] in qkv's dtype");
    if (c.kind != ValueKind::input)
      op_fail(g, n, "k_cache and v_cache must be persistent inputs (the op updates them)");
  }
}

// Input `i`, when the node has it: the tokens' positions in their examples, int32 [B, T], which
// make the causal mask block-diagonal (ops.def).
void check_positions(const Graph& g, const Node& n, const Heads& h, size_t i) {
  if (n.in.size() <= i) return;
  if (!attrs_of<AttentionAttrs>(n).causal)
    op_fail(g, n, "positions (packed examples) need attrs.causal: attention within an example is causal");
  const Value& pos = in_val(g, n, static_cast<int>(i));
  if (pos.shape != Shape{h.B, h.T} || pos.dtype != DType::i32)
    op_fail(g, n, "positions must be int32 [batch, length], each token's position in its example");
}

}  // namespace

void infer_attention(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& qkv = in_val(g, n, 0);
  const Heads h = check_qkv(g, n, qkv);
  check_positions(g, n, h, 1);
  out[0] = {Shape{h.B, h.T, h.H, h.D}, qkv.dtype};
  out[1] = {Shape{h.B, h.H, h.T}, DType::f32};
}

namespace {
// The (query, key) pairs of T rows that are not masked: T² in full, T·(T+1)/2 causal, and with a
// window W each row's last min(i + 1, W) keys, W·(W+1)/2 + (T − W)·W for T >= W. Packed examples
// mask more, which only the positions' values say: these counts are their upper bound (above).
int64_t unmasked_pairs(const AttentionAttrs& a, int64_t T) {
  if (!a.causal) return T * T;
  if (a.window == 0 || a.window >= T) return T * (T + 1) / 2;
  const int64_t W = a.window;
  return W * (W + 1) / 2 + (T - W) * W;
}
// B·H·(query, key) pairs·D: the unit of attention's FLOPs (H query heads: the key/value heads are
// shared, the products are not), counting only the unmasked pairs.
int64_t attention_units(const Graph& g, const Node& n) {
  const Heads h = check_qkv(g, n, in_val(g, n, 0));
  return h.B * h.H * unmasked_pairs(attrs_of<AttentionAttrs>(n), h.T) * h.D;
}
}  // namespace

// QKᵀ and P·V: 2 FLOPs per pair and head dim each. The softmax (a few per pair) is not counted.
OpCost cost_attention(const Graph& g, const Node& n) {
  return OpCost{.flops = 4 * attention_units(g, n), .bytes = io_bytes(g, n)};
}

// lse is a saved statistic, not a model output: its cotangent is ignored, and when only lse has
// one there is nothing to emit.
void vjp_attention(VjpCtx& c) {
  if (c.out_ct[0] == kNoValue || !c.needs[0]) return;
  std::vector<ValueId> in{c.in_id(0), c.out_id(1), c.out_ct[0]};
  if (c.node.in.size() > 1) in.push_back(c.in_id(1));  // the positions: the same mask
  c.in_ct[0] = c.emit1(OpKind::attention_grad, in, c.node.attrs);
}

void infer_attention_grad(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& qkv = in_val(g, n, 0);
  const Value& lse = in_val(g, n, 1);
  const Value& dout = in_val(g, n, 2);
  const auto [B, T, KV, H, D] = check_qkv(g, n, qkv);
  if (lse.shape != Shape{B, H, T} || lse.dtype != DType::f32) op_fail(g, n, "lse must be [B, H, T] float32");
  if (dout.shape != Shape{B, T, H, D} || dout.dtype != qkv.dtype)
    op_fail(g, n, "dout must be [B, T, H, head_dim] in qkv's dtype");
  check_positions(g, n, {B, T, KV, H, D}, 3);
  out[0] = {qkv.shape, qkv.dtype};
}

// dV, dP, dQ, dK (8 per pair and head dim) plus QKᵀ again to recompute the probabilities (2).
OpCost cost_attention_grad(const Graph& g, const Node& n) {
  return OpCost{.flops = 10 * attention_units(g, n), .bytes = io_bytes(g, n)};
}

// qkv [B, 1, KV, (group+2)·D] (the current token), k_cache and v_cache [B, Tmax, KV, D] in qkv's
// dtype and persistent inputs (the op writes row pos of both), pos an int32 scalar. Causal by
// definition. out [B, 1, H, D].
void infer_attention_decode(const Graph& g, const Node& n, ValueDesc* out) {
  const Value& qkv = in_val(g, n, 0);
  const Heads h = check_qkv(g, n, qkv);
  if (!attrs_of<AttentionAttrs>(n).causal) op_fail(g, n, "decoding is causal: attrs.causal must be true");
  if (h.T != 1) op_fail(g, n, "qkv must be one token: [batch, 1, kv heads, (group+2)·head_dim]");
  check_caches(g, n, qkv, h);
  const Value& pos = in_val(g, n, 3);
  if (pos.shape.rank != 0 || pos.dtype != DType::i32) op_fail(g, n, "pos must be an int32 scalar");
  out[0] = {Shape{h.B, 1, h.H, h.D}, qkv.dtype};
}

// At the last position (pos = Tmax − 1, the most expensive step): 4·B·H·R·D, R = Tmax cache rows
// (or the window's, when shorter) against every query head of their group, and every cache row read.
OpCost cost_attention_decode(const Graph& g, const Node& n) {
  const Value& kc = in_val(g, n, 1);
  const auto& a = attrs_of<AttentionAttrs>(n);
  const int64_t rows = a.window > 0 ? std::min<int64_t>(a.window, kc.shape[1]) : kc.shape[1];
  return OpCost{.flops = 4 * kc.shape.numel() / kc.shape[1] * rows * a.group, .bytes = io_bytes(g, n)};
}

// qkv [B, T, KV, (group+2)·D], the caches as attention_decode's with Tmax >= T.
void infer_kv_cache_write(const Graph& g, const Node& n, ValueDesc*) {
  const Value& qkv = in_val(g, n, 0);
  check_caches(g, n, qkv, check_qkv(g, n, qkv));
}

// A copy: each token's k and v read from qkv and written into the caches.
OpCost cost_kv_cache_write(const Graph& g, const Node& n) {
  const Value& qkv = in_val(g, n, 0);
  const Heads h = check_qkv(g, n, qkv);
  return OpCost{.flops = 0, .bytes = 4 * h.B * h.T * h.KV * h.D * static_cast<int64_t>(dtype_size(qkv.dtype))};
}

}  // namespace loom

namespace loom {

// qkv [B, T, S, (G+2)·D] float with D even, positions [T] int32.
void infer_rope(const Graph& g, const Node& n, ValueDesc* out) {
  const auto& a = attrs_of<RopeAttrs>(n);
  const Value& x = in_val(g, n, 0);
  const Value& pos = in_val(g, n, 1);
  if (a.group < 1) op_fail(g, n, "attrs.group (query heads per key/value head) must be >= 1");
  if (!(a.theta > 0.f)) op_fail(g, n, "attrs.theta must be > 0");
  if (a.llama3_factor != 0.f && !(a.llama3_factor > 0.f && a.low_freq_factor > 0.f &&
                                  a.high_freq_factor > a.low_freq_factor && a.original_max_position > 0))
    op_fail(g, n, "llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor, original_max_position > 0");
  if (!dtype_is_float(x.dtype)) op_fail(g, n, "qkv must be a float dtype");
  if (x.shape.rank != 4) op_fail(g, n, "qkv must have rank 4: [batch, length, kv heads, (group+2)·head_dim]");
  const int64_t parts = a.group + 2;
  if (x.shape[3] == 0 || x.shape[3] % (2 * parts) != 0)
    op_fail(g, n,
            "qkv's last dim (" + std::to_string(x.shape[3]) +
                ") must be (group+2)·head_dim with group = " + std::to_string(a.group) + " and an even head_dim");
  if ((pos.shape != Shape{x.shape[1]} && pos.shape != Shape{x.shape[0], x.shape[1]}) || pos.dtype != DType::i32)
    op_fail(g, n, "positions must be int32 [length] or [batch, length] (qkv's dims 0 and 1)");
  out[0] = {x.shape, x.dtype};
}

// Two multiplies and an add per rotated element (the group's queries and the key: (G+1)/(G+2) of qkv).
OpCost cost_rope(const Graph& g, const Node& n) {
  const int64_t parts = attrs_of<RopeAttrs>(n).group + 2;
  return OpCost{.flops = 3 * in_val(g, n, 0).shape.numel() / parts * (parts - 1), .bytes = io_bytes(g, n)};
}

void vjp_rope(VjpCtx& c) {
  if (c.out_ct[0] == kNoValue || !c.needs[0]) return;
  RopeAttrs a = attrs_of<RopeAttrs>(c.node);
  a.inverse = !a.inverse;
  c.in_ct[0] = c.emit1(OpKind::rope, {c.out_ct[0], c.in_id(1)}, a);
}

}  // namespace loom
