#include "nn/transformer.h"

#include <cmath>
#include <cstring>
#include <string>

#include "nn/layers.h"

namespace loom::nn {

namespace {

// Reshape (a view: no copy, no memory).
ValueId view(const Scope& s, ValueId x, Shape shape) { return s.op1(OpKind::reshape, {x}, ShapeAttrs{shape}); }

// MLPBlock: [B, T, C] -> [B, T, C]
ValueId mlp_block(const Scope& s, ValueId x, const TransformerSpec& c, bool train) {
  const int64_t features = s.graph().value(x).shape.last();
  ValueId h = layer_norm(s / "pre_norm", x, c.dtype, c.layer_norm_eps);
  h = dense(s / "input_layer", h, c.mlp_expansion * features, c.dtype);  // [B, T, 4C]
  h = s.op1(OpKind::gelu, {h});
  h = dense(s / "output_layer", h, features, c.dtype);  // [B, T, C]
  return dropout(s, h, c.dropout_rate, train);
}

// AttentionBlock: [B, T, C] -> [B, T, C]
ValueId attention_block(const Scope& s, ValueId x, const TransformerSpec& c, bool train) {
  Graph& g = s.graph();
  const Shape xs = g.value(x).shape;
  const int64_t B = xs[0], T = xs[1], C = xs[2];
  const int64_t H = c.hidden_size / c.head_dim, D = c.head_dim;
  ValueId h = layer_norm(s / "pre_norm", x, c.dtype, c.layer_norm_eps);
  // DenseGeneral(features=(H, 3D)): kernel [C, H, 3D] and bias [H, 3D], used as a [C, H·3D] dense.
  const Scope qs = s / "qkv";
  const ValueId wq = qs.param("kernel", Shape{C, H, 3 * D}, lecun_normal(C));
  const ValueId bq = qs.param("bias", Shape{H, 3 * D}, ParamInit{ParamInit::zeros, 0});
  ValueId qkv = qs.op1(OpKind::dense, {h, view(qs, wq, Shape{C, H * 3 * D}), view(qs, bq, Shape{H * 3 * D})},
                       DenseAttrs{c.dtype});                                          // [B, T, H·3D]
  qkv = view(qs, qkv, Shape{B, T, H, 3 * D});                                         // [B, T, H, 3D]
  const ValueId att = s.op(OpKind::attention, {qkv}, AttentionAttrs{c.causal_mask, c.softmax_dtype}).at(0);  // [B, T, H, D]
  // DenseGeneral(features=C, axis=(-2, -1)): kernel [H, D, C] (fan_in H·D), bias [C].
  const Scope os = s / "output_layer";
  const ValueId wo = os.param("kernel", Shape{H, D, C}, lecun_normal(H * D));
  const ValueId bo = os.param("bias", Shape{C}, ParamInit{ParamInit::zeros, 0});
  ValueId o = os.op1(OpKind::dense, {view(os, att, Shape{B, T, H * D}), view(os, wo, Shape{H * D, C}), bo},
                     DenseAttrs{c.dtype});  // [B, T, C]
  return dropout(s, o, c.dropout_rate, train);
}

ValueId transformer_block(const Scope& s, ValueId x, const TransformerSpec& c, bool train) {
  const Scope mlp_s = c.remat_mlp ? (s / "mlp").remat_region() : s / "mlp";
  const Scope attn_s = c.remat_attn ? (s / "attn").remat_region() : s / "attn";
  auto mlp = [&](ValueId v) { return s.op1(OpKind::add, {v, mlp_block(mlp_s, v, c, train)}); };
  auto attn = [&](ValueId v) { return s.op1(OpKind::add, {v, attention_block(attn_s, v, c, train)}); };
  return c.attn_first ? mlp(attn(x)) : attn(mlp(x));
}

}  // namespace

ModelGraph build_transformer(const TransformerSpec& c, int64_t batch, int64_t seq_len, bool train) {
  ModelGraph m;
  m.name = "Transformer";
  Graph& g = m.graph;
  m.inputs = g.add_input("inputs", Shape{batch, seq_len}, DType::i32);  // [B, T] token ids
  m.labels = g.add_input("labels", Shape{batch, seq_len}, DType::i32);  // [B, T] next tokens
  const ValueId positions = g.add_input("positions", Shape{seq_len}, DType::i32);  // 0..T-1
  std::vector<unsigned char> pos_bytes(static_cast<size_t>(seq_len) * 4);
  for (int32_t t = 0; t < seq_len; ++t) std::memcpy(pos_bytes.data() + t * 4, &t, 4);
  m.constants.emplace_back(positions, std::move(pos_bytes));

  const Scope root(g);
  const int64_t C = c.hidden_size;
  // nn.Embed's default init: variance_scaling(1, fan_in, normal, out_axis=0) -> N(0, 1/C).
  const Scope es = root / "embed";
  const ValueId table = es.param("embedding", Shape{c.vocab_size, C},
                                 ParamInit{ParamInit::normal, static_cast<float>(1.0 / std::sqrt(double(C)))});
  ValueId x = es.op1(OpKind::embedding, {m.inputs, table}, DTypeAttrs{c.dtype});  // [B, T, C]
  // pos_emb.astype(dtype)[:T]: a gather of rows 0..T-1 rounds exactly like the cast-then-slice.
  const ValueId pos_emb = root.param("pos_emb", Shape{c.max_seq_len, C}, ParamInit{ParamInit::normal, 0.02f});
  const ValueId pos = root.op1(OpKind::embedding, {positions, pos_emb}, DTypeAttrs{c.dtype});  // [T, C]
  x = root.op1(OpKind::add, {x, pos});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    std::string name = "block_";
    name += std::to_string(l);
    const Scope bs = root / name;
    x = transformer_block(c.remat_block ? bs.remat_region() : bs, x, c, train);
  }
  x = layer_norm(root / "post_norm", x, c.dtype, c.layer_norm_eps);
  x = dense(root / "output_layer", x, c.num_outputs, c.dtype);  // [B, T, V]
  x = cast(root, x, DType::f32);
  add_classification_loss(m, root, x);
  return m;
}

}  // namespace loom::nn
