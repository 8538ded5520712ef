#include "nn/models/transformer/transformer.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/layers.h"
#include "nn/lora.h"
#include "nn/models.h"

namespace loom::nn {

namespace {

// Reshape (a view: no copy, no memory).
ValueId view(const Scope& s, ValueId x, Shape shape) { return s.op1(OpKind::reshape, {x}, ShapeAttrs{shape}); }

// Kernel init: Flax's lecun_normal(fan_in), or GPT-2's normal(0.02) (scaled by 1/sqrt(2·layers)
// on the projections that write into the residual stream).
ParamInit kernel_init(const ModelConfig& c, int64_t fan_in, bool residual_proj) {
  if (c.transformer.init != InitScheme::gpt2) return lecun_normal(fan_in);
  const double std = residual_proj ? 0.02 / std::sqrt(2.0 * static_cast<double>(c.transformer.num_layers)) : 0.02;
  return ParamInit{ParamInit::normal, static_cast<float>(std)};
}

// A Dense / DenseGeneral layer with the variant's bias and init choices: the kernel's first
// `in_dims` dims are contracted with x's last dim (flattened), the rest are the output features;
// the bias (model.use_bias, or `bias`) has the output features' shape. A block's kernel (not the
// `head`) is stored as lora.base_dtype says; a quantized one is created as its [K, N] product, the
// shape the formats are defined on (core/quant.h; the file's DenseGeneral shape loads into it).
ValueId linear(const Scope& s, ValueId x, Shape kernel_shape, const ModelConfig& c, bool residual_proj, int in_dims = 1,
               bool bias = false, bool head = false) {
  const int64_t fan_in = s.graph().value(x).shape.last();
  const int64_t out = kernel_shape.numel() / fan_in;
  const DType stored = head ? DType::f32 : c.lora.base_storage();
  const Shape param_shape = dtype_is_quantized(stored) ? Shape{fan_in, out} : kernel_shape;
  const ValueId w = s.param("kernel", param_shape, as_kernel(kernel_init(c, fan_in, residual_proj)));
  if (stored != DType::f32) s.graph().set_param_dtype(w, stored);
  const ValueId wv = param_shape.rank == 2 ? w : view(s, w, Shape{fan_in, out});
  if (!c.transformer.use_bias && !bias) return s.op1(OpKind::dense, {x, wv}, DenseAttrs{c.dtype});
  Shape bias_shape;
  for (int i = in_dims; i < kernel_shape.rank; ++i) bias_shape.push_back(kernel_shape[i]);
  const ValueId b = s.param("bias", bias_shape, ParamInit{ParamInit::zeros, 0});
  const ValueId bv = bias_shape.rank == 1 ? b : view(s, b, Shape{out});
  return s.op1(OpKind::dense, {x, wv, bv}, DenseAttrs{c.dtype});
}

// y with the LoRA update of PEFT module `m` (nn/lora.h) when lora.targets names it; x is the layer's input.
ValueId adapt(const Scope& s, LoraTarget m, ValueId x, ValueId y, const ModelConfig& c, bool train) {
  if (!c.lora.enabled() || !lora_modules(c.lora, gated_mlp(c)).has(m)) return y;
  const LoraSlice whole{.suffix = "b", .offset = 0, .width = s.graph().value(y).shape.last(), .heads = 1};
  return lora_update(s / ("lora_" + std::string(choice_name(m))), x, y, {&whole, 1}, c.lora, c.dtype, train);
}

// The packed qkv [B, T, KV, (G+2)·D] with its adapters: per key/value head the q columns [0, G·D),
// the k columns [G·D, (G+1)·D) and the v columns [(G+1)·D, (G+2)·D); c_attn adapts all three with one A.
ValueId adapt_qkv(const Scope& s, ValueId x, ValueId qkv, const ModelConfig& c, bool train) {
  if (!c.lora.enabled()) return qkv;
  const ChoiceSet<LoraTarget> modules = lora_modules(c.lora, gated_mlp(c));
  const int64_t H = c.hidden_size / c.transformer.head_dim, D = c.transformer.head_dim;
  const int64_t KV = c.transformer.num_kv_heads > 0 ? c.transformer.num_kv_heads : H, G = H / KV;
  const LoraSlice slices[] = {{.suffix = "b_q", .offset = 0, .width = G * D, .heads = KV},
                              {.suffix = "b_k", .offset = G * D, .width = D, .heads = KV},
                              {.suffix = "b_v", .offset = (G + 1) * D, .width = D, .heads = KV}};
  if (modules.has(LoraTarget::c_attn)) return lora_update(s / "lora_c_attn", x, qkv, slices, c.lora, c.dtype, train);
  const LoraTarget own[] = {LoraTarget::q_proj, LoraTarget::k_proj, LoraTarget::v_proj};
  for (size_t i = 0; i < 3; ++i) {
    if (!modules.has(own[i])) continue;
    LoraSlice one = slices[i];
    one.suffix = "b";
    qkv = lora_update(s / ("lora_" + std::string(choice_name(own[i]))), x, qkv, {&one, 1}, c.lora, c.dtype, train);
  }
  return qkv;
}

// The block's and the final normalisation (model.norm): LayerNorm (biases per model.use_bias) or
// RMSNorm (none; Gemma's scaled by 1 + scale), all with model.layer_norm_eps.
ValueId norm(const Scope& s, ValueId x, const ModelConfig& c) {
  const auto eps = static_cast<float>(c.layer_norm_eps);
  if (c.transformer.norm == NormKind::layernorm) return layer_norm(s, x, c.dtype, eps, c.transformer.use_bias);
  return rms_norm(s, x, c.dtype, eps, c.transformer.norm == NormKind::gemma_rmsnorm);
}

// MLPBlock: [B, T, C] -> [B, T, C]
ValueId mlp_block(const Scope& s, ValueId x, const ModelConfig& c, bool train) {
  const int64_t features = s.graph().value(x).shape.last(), F = mlp_width(c);
  ValueId h = norm(s / "pre_norm", x, c);
  // Each dense layer with the LoRA adapter of its PEFT module, if targeted.
  auto dense = [&](const char* name, ValueId x, Shape kernel, bool residual, LoraTarget module) {
    const Scope ls = s / name;
    return adapt(ls, module, x, linear(ls, x, kernel, c, residual), c, train);
  };
  const bool gated = gated_mlp(c);
  if (gated) {
    const ValueId gate = dense("gate_layer", h, Shape{features, F}, false, LoraTarget::gate_proj);  // [B, T, F]
    const ValueId up = dense("up_layer", h, Shape{features, F}, false, LoraTarget::up_proj);        // [B, T, F]
    h = s.op1(c.transformer.mlp == MlpKind::swiglu ? OpKind::silu_mul : OpKind::gelu_mul, {gate, up});
  } else {
    h = dense("input_layer", h, Shape{features, F}, false, LoraTarget::c_fc);  // [B, T, F]
    h = s.op1(c.transformer.mlp == MlpKind::gelu ? OpKind::gelu_erf : OpKind::gelu, {h});
  }
  h = dense("output_layer", h, Shape{F, features}, true,
            gated ? LoraTarget::down_proj : LoraTarget::c_proj);  // [B, T, C]
  if (c.transformer.post_norms) h = norm(s / "post_norm", h, c);
  return dropout(s, h, c.dropout_rate, train);
}

// The cached programs' state (build_transformer_decoder, build_transformer_prefill): each layer's
// key/value caches, and which rows the tokens go to.
struct Cache {
  int64_t max_len = 0;     // cache rows
  ValueId pos = kNoValue;  // decoder: int32 scalar, the one token's position; prefill: kNoValue, rows 0..T-1
  // Prefill: int32 [B], row b·T + T − 1 of each sequence, the only rows of the stream [B·T, C]
  // that go on past the blocks (the logits of the last token only).
  ValueId last_rows = kNoValue;
};

// Key/value heads (model.num_kv_heads, 0 = one per query head) and query heads per key/value head.
struct HeadGroups {
  int64_t kv, group;
};
HeadGroups head_groups(const ModelConfig& c) {
  const int64_t H = num_heads(c), kv = c.transformer.num_kv_heads > 0 ? c.transformer.num_kv_heads : H;
  return {kv, H / kv};
}

// This layer's persistent caches "<scope>/k_cache" and "<scope>/v_cache" [B, max_len, KV, D] (in the
// compute dtype) and the attention over them: the decoder's attention_decode of one token, which
// updates row pos; the prefill's causal attention over its T tokens, whose keys and values
// kv_cache_write stores in rows 0..T-1.
ValueId cached_attention(const Scope& s, ValueId qkv, const ModelConfig& c, const AttentionAttrs& attrs,
                         const Cache& d) {
  Graph& g = s.graph();
  const Shape q = g.value(qkv).shape;
  const Shape cache{q[0], d.max_len, q[2], c.transformer.head_dim};
  const ValueId k = g.add_input(s.path() + "/k_cache", cache, c.dtype);
  const ValueId v = g.add_input(s.path() + "/v_cache", cache, c.dtype);
  if (d.pos != kNoValue) return s.op1(OpKind::attention_decode, {qkv, k, v, d.pos}, attrs);
  s.op(OpKind::kv_cache_write, {qkv, k, v}, attrs);
  return s.op(OpKind::attention, {qkv}, attrs).at(0);
}

RopeAttrs rope_attrs(const ModelConfig& c, double theta, int32_t group) {
  RopeAttrs a{.theta = static_cast<float>(theta), .group = group};
  if (c.transformer.rope_scaling == RopeScaling::llama3) {
    a.llama3_factor = static_cast<float>(c.transformer.rope_factor);
    a.low_freq_factor = static_cast<float>(c.transformer.rope_low_freq_factor);
    a.high_freq_factor = static_cast<float>(c.transformer.rope_high_freq_factor);
    a.original_max_position = static_cast<int32_t>(c.transformer.rope_original_max_position);
  }
  return a;
}

// AttentionBlock of layer `layer`: [B, T, C] -> [B, T, C] (with `dec`: over the KV caches, see
// Cache); the tokens' positions [T] rotate q and k when model.position = rope, with the layer's
// base, and the layer's window masks (layer_attention). Per-token positions [B, T] (packed rows)
// also confine attention to each example (ops.def: attention's positions).
ValueId attention_block(const Scope& s, int64_t layer, ValueId x, ValueId positions, const ModelConfig& c, bool train,
                        const Cache* dec) {
  Graph& g = s.graph();
  const Shape xs = g.value(x).shape;
  const int64_t B = xs[0], T = xs[1], C = xs[2];
  const int64_t H = num_heads(c), D = c.transformer.head_dim;
  const auto [KV, G] = head_groups(c);
  ValueId h = norm(s / "pre_norm", x, c);
  // DenseGeneral(features=(KV, (G+2)·D)): kernel [C, KV, (G+2)·D] and bias [KV, (G+2)·D], used as a
  // [C, KV·(G+2)·D] dense: per key/value head its G queries, its key and its value. G = 1 is the
  // tutorial's (H, 3D).
  const Scope qs = s / "qkv";
  ValueId qkv = linear(qs, h, Shape{C, KV, (G + 2) * D}, c, false, 1, c.transformer.qkv_bias);  // [B, T, KV·(G+2)·D]
  qkv = adapt_qkv(qs, h, view(qs, qkv, Shape{B, T, KV, (G + 2) * D}), c, train);    // [B, T, KV, (G+2)·D]
  const auto group = static_cast<int32_t>(G);
  if (c.transformer.qk_norm) {  // Qwen3: each query and key head normalised over D, before rope
    const ParamInit init{c.transformer.norm == NormKind::gemma_rmsnorm ? ParamInit::zeros : ParamInit::ones, 0};
    const ValueId q_scale = (s / "q_norm").param("scale", Shape{D}, init);
    const ValueId k_scale = (s / "k_norm").param("scale", Shape{D}, init);
    qkv = s.op(OpKind::qk_norm, {qkv, q_scale, k_scale},
               QkNormAttrs{.eps = static_cast<float>(c.layer_norm_eps),
                           .group = group,
                           .unit_offset = c.transformer.norm == NormKind::gemma_rmsnorm})
              .at(0);
  }
  const LayerAttention la = layer_attention(c, layer);
  if (c.transformer.position ==
      PositionKind::rope)  // the decoder's cache then holds rotated keys, as transformers' does
    qkv = s.op1(OpKind::rope, {qkv, positions}, rope_attrs(c, la.rope_theta, group));
  const AttentionAttrs attrs{.causal = c.transformer.causal_mask,
                             .softmax_dtype = c.transformer.softmax_dtype,
                             .group = group,
                             .window = static_cast<int32_t>(la.window),
                             .scale = c.transformer.query_pre_attn_scalar > 0
                                          ? static_cast<float>(std::pow(c.transformer.query_pre_attn_scalar, -0.5))
                                          : 0.f};
  std::vector<ValueId> att_in{qkv};
  if (g.value(positions).shape.rank == 2) att_in.push_back(positions);  // packed rows
  const ValueId att =
      dec ? cached_attention(s, qkv, c, attrs, *dec) : s.op(OpKind::attention, att_in, attrs).at(0);  // [B, T, H, D]
  // DenseGeneral(features=C, axis=(-2, -1)): kernel [H, D, C] (fan_in H·D), bias [C].
  const Scope os = s / "output_layer";
  const ValueId att_flat = view(os, att, Shape{B, T, H * D});
  ValueId o = linear(os, att_flat, Shape{H, D, C}, c, true, 2);  // [B, T, C]
  o = adapt(os, gated_mlp(c) ? LoraTarget::o_proj : LoraTarget::c_proj, att_flat, o, c, train);
  if (c.transformer.post_norms) o = norm(s / "post_norm", o, c);
  return dropout(s, o, c.dropout_rate, train);
}

// The remat regions layer l opens: its own choice under model.remat = auto, else model.remat.
ChoiceSet<RematRegion> layer_remat(const ModelConfig& c, int64_t l) {
  return c.remat_layers.empty() ? c.remat : c.remat_layers.at(static_cast<size_t>(l)).regions;
}

ValueId transformer_block(const Scope& s, int32_t layer, ValueId x, ValueId positions, const ModelConfig& c, bool train,
                          const Cache* dec) {
  const ChoiceSet<RematRegion> remat = layer_remat(c, layer);
  const Scope mlp_s = remat.has(RematRegion::MLP) ? (s / "mlp").remat_region(layer) : s / "mlp";
  const Scope attn_s = remat.has(RematRegion::Attn) ? (s / "attn").remat_region(layer) : s / "attn";
  auto mlp = [&](ValueId v) { return s.op1(OpKind::add, {v, mlp_block(mlp_s, v, c, train)}); };
  auto attn = [&](ValueId v) {
    return s.op1(OpKind::add, {v, attention_block(attn_s, layer, v, positions, c, train, dec)});
  };
  return c.transformer.block_order == BlockOrder::attn_first ? mlp(attn(x)) : attn(mlp(x));
}

// Rows `rows` ([B] int32) of the stream x [B, T, C] flattened to [B·T, C], as [B, 1, C]: an
// embedding lookup with the stream as its table. It is exact: the table is float32, and a 16-bit
// stream widened to it rounds back to itself.
ValueId take_rows(const Scope& s, ValueId x, ValueId rows) {
  const Value& xv = s.graph().value(x);
  const Shape xs = xv.shape;
  const DType dt = xv.dtype;
  ValueId table = view(s, x, Shape{xs[0] * xs[1], xs[2]});
  if (dt != DType::f32) table = cast(s, table, DType::f32);
  return view(s, s.op1(OpKind::embedding, {rows, table}, DTypeAttrs{dt}), Shape{xs[0], 1, xs[2]});
}

// The trunk's final hidden states [B, T, C] (or [B, 1, C]) in the compute dtype, and the output
// layer's kernel: the embedding table, used transposed, when the embeddings are tied.
struct Trunk {
  ValueId x;
  ValueId kernel;  // kNoValue for an untied head, whose kernel (and bias) its user creates in `head`
  Scope head;      // the output layer's scope
};

// Embeddings, blocks, final norm and the output layer's kernel, shared by the training graph and
// the cached programs.
Trunk transformer_trunk(Graph& g, ValueId tokens, ValueId positions, const ModelConfig& c, bool train,
                        const Cache* dec) {
  const Scope root = Scope(g).frozen(c.lora.enabled());  // with LoRA only the adapters train
  const int64_t C = c.hidden_size;
  // nn.Embed's default init: variance_scaling(1, fan_in, normal, out_axis=0) -> N(0, 1/C).
  const Scope es = root / "embed";
  const float embed_std =
      c.transformer.init == InitScheme::gpt2 ? 0.02f : static_cast<float>(1.0 / std::sqrt(double(C)));
  const ValueId table =
      es.param("embedding", Shape{c.transformer.vocab_size, C}, ParamInit{ParamInit::normal, embed_std});
  ValueId x = es.op1(OpKind::embedding, {tokens, table}, DTypeAttrs{c.dtype});  // [B, T, C]
  if (c.transformer.scale_embeddings)  // Gemma's normaliser, a float32 buffer cast to the compute dtype
    x = es.op1(OpKind::scale, {x}, ScaleAttrs{static_cast<float>(std::sqrt(static_cast<double>(C)))});
  if (c.transformer.position == PositionKind::learned) {
    // pos_emb.astype(dtype)[:T]: a gather of rows 0..T-1 rounds exactly like the cast-then-slice.
    const ValueId pos_emb =
        root.param("pos_emb", Shape{c.transformer.max_seq_len, C}, ParamInit{ParamInit::normal, 0.02f});
    const ValueId pos = root.op1(OpKind::embedding, {positions, pos_emb}, DTypeAttrs{c.dtype});  // [T, C] or [B, T, C]
    x = root.op1(OpKind::add, {x, pos});
  }
  if (c.transformer.embed_dropout) x = dropout(root, x, c.dropout_rate, train);
  for (int64_t l = 0; l < c.transformer.num_layers; ++l) {
    std::string name = "block_";
    name += std::to_string(l);
    const Scope bs = root / name;
    const auto layer = static_cast<int32_t>(l);
    x = transformer_block(layer_remat(c, l).has(RematRegion::Block) ? bs.remat_region(layer) : bs, layer, x, positions,
                          c, train, dec);
  }
  if (dec && dec->last_rows != kNoValue) x = take_rows(root / "last_rows", x, dec->last_rows);  // [B, 1, C]
  x = norm(root / "post_norm", x, c);
  if (c.transformer.tie_embeddings)
    return Trunk{x, table, es};                      // wte.attend(x): the table, transposed, is the output layer
  return Trunk{x, kNoValue, root / "output_layer"};  // its own kernel: the caller creates it
}

// The logits [B, T, V] of tokens [B, T] at positions [T] (or per token, [B, T]: packed rows), in the compute dtype. The
// tutorial's logits.astype(float32) before the loss is inside the loss ops (graph/ops/loss.cpp: they widen
// low-precision logits exactly), so a bfloat16 model keeps no float32 copy of the logits or of
// their gradient; the cached programs cast for the sampler.
ValueId transformer_logits(Graph& g, ValueId tokens, ValueId positions, const ModelConfig& c, bool train,
                           const Cache* dec) {
  const Trunk t = transformer_trunk(g, tokens, positions, c, train, dec);
  if (c.transformer.tie_embeddings)
    return t.head.op1(OpKind::dense, {t.x, t.kernel}, DenseAttrs{c.dtype, /*transpose_w=*/true});      // [B, T, V]
  return linear(t.head, t.x, Shape{c.hidden_size, c.transformer.num_outputs}, c, false, 1, false,
                /*head=*/true);  // [B, T, V]
}

// A persistent int32 input [n] whose contents never change (uploaded once: ModelGraph::constants).
ValueId constant_i32(ModelGraph& m, const std::string& name, const std::vector<int32_t>& values) {
  const ValueId v = m.graph.add_input(name, Shape{static_cast<int64_t>(values.size())}, DType::i32);
  std::vector<unsigned char> bytes(values.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  m.constants.emplace_back(v, std::move(bytes));
  return v;
}

// Positions 0..T-1.
ValueId positions_from_zero(ModelGraph& m, int64_t T) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  std::iota(p.begin(), p.end(), 0);
  return constant_i32(m, "positions", p);
}

// The cached programs' requirements, and the model without remat (no backward: nothing to recompute).
ModelConfig cached_model(const ModelConfig& config, int64_t max_len, const char* who) {
  if (!config.transformer.causal_mask) throw std::invalid_argument(std::string(who) + ": the model must be causal");
  if (max_len < 1 || max_len > config.transformer.max_seq_len)
    throw std::invalid_argument(std::string(who) + ": max_len must be in [1, max_seq_len]");
  ModelConfig c = config;
  c.remat = {};
  c.remat_layers.clear();
  return c;
}

}  // namespace

ModelGraph build_transformer(const ModelConfig& c, const ModelInput& in, bool train) {
  ModelGraph m;
  m.name = "Transformer";
  Graph& g = m.graph;
  m.inputs = g.add_input("inputs", Shape{in.batch, in.seq_len}, DType::i32);  // [B, T] token ids
  m.labels = g.add_input("labels", Shape{in.batch, in.seq_len}, DType::i32);  // [B, T] next tokens
  if (in.packed) {
    if (!c.transformer.causal_mask)
      throw UserError("model.causal_mask = false", "packed rows of examples need causal attention",
                      "set model.causal_mask = true to train on chat data");
    m.positions = g.add_input("positions", Shape{in.batch, in.seq_len}, DType::i32);  // [B, T] in their examples
  }
  const ValueId positions = in.packed ? m.positions : positions_from_zero(m, in.seq_len);  // [B, T] or [T]
  // auto unresolved (kHeadChunkAuto): the plain head.
  const int64_t chunk = c.transformer.head_chunk == kHeadChunkAuto ? 0 : c.transformer.head_chunk;
  if (chunk == 0) {
    add_classification_loss(m, Scope(g), transformer_logits(g, m.inputs, positions, c, train, nullptr));
    return m;
  }
  // The head and the loss fused (model.head_chunk): no [B, T, V] logits. An untied head has
  // linear()'s kernel and (model.use_bias) bias: the same paths, order and init.
  const Trunk t = transformer_trunk(g, m.inputs, positions, c, train, nullptr);
  ValueId kernel = t.kernel, bias = kNoValue;
  if (!c.transformer.tie_embeddings) {
    kernel = t.head.param("kernel", Shape{c.hidden_size, c.transformer.num_outputs},
                          as_kernel(kernel_init(c, c.hidden_size, false)));
    if (c.transformer.use_bias)
      bias = t.head.param("bias", Shape{c.transformer.num_outputs}, ParamInit{ParamInit::zeros, 0});
  }
  add_fused_classification_loss(
      m, t.head, t.x, kernel, bias,
      LinearCrossEntropyAttrs{.compute = c.dtype, .transpose_w = c.transformer.tie_embeddings, .chunk = chunk});
  return m;
}

ModelGraph build_transformer_decoder(const ModelConfig& config, int64_t batch, int64_t max_len) {
  const ModelConfig c = cached_model(config, max_len, "build_transformer_decoder");
  ModelGraph m;
  m.name = "TransformerDecoder";
  Graph& g = m.graph;
  m.inputs = g.add_input("inputs", Shape{batch, 1}, DType::i32);                   // [B, 1] the current tokens
  const ValueId positions = g.add_input("positions", Shape{1}, DType::i32);        // [1] their position
  const Cache dec{.max_len = max_len, .pos = view(Scope(g), positions, Shape{})};  // the same int, as a scalar
  m.output = cast(Scope(g), transformer_logits(g, m.inputs, positions, c, /*train=*/false, &dec),
                  DType::f32);  // [B, 1, V] f32, what the sampler reads
  g.mark_output(m.output);
  return m;
}

ModelGraph build_transformer_prefill(const ModelConfig& config, int64_t batch, int64_t len, int64_t max_len) {
  const ModelConfig c = cached_model(config, max_len, "build_transformer_prefill");
  if (len < 1 || len > max_len) throw std::invalid_argument("build_transformer_prefill: len must be in [1, max_len]");
  ModelGraph m;
  m.name = "TransformerPrefill";
  Graph& g = m.graph;
  m.inputs = g.add_input("inputs", Shape{batch, len}, DType::i32);  // [B, T] the tokens
  const ValueId positions = positions_from_zero(m, len);            // [T]
  std::vector<int32_t> last(static_cast<size_t>(batch));
  for (size_t b = 0; b < last.size(); ++b) last[b] = static_cast<int32_t>((static_cast<int64_t>(b) + 1) * len - 1);
  const Cache pre{.max_len = max_len, .last_rows = constant_i32(m, "last_rows", last)};
  m.output = cast(Scope(g), transformer_logits(g, m.inputs, positions, c, /*train=*/false, &pre),
                  DType::f32);  // [B, 1, V] f32: the last token's
  g.mark_output(m.output);
  return m;
}

LayerAttention layer_attention(const ModelConfig& c, int64_t layer) {
  const int64_t p = c.transformer.sliding_window_pattern;
  if (p > 0 && (layer + 1) % p == 0) return {.window = 0, .rope_theta = c.transformer.rope_theta};
  return {.window = c.transformer.sliding_window,
          .rope_theta = c.transformer.rope_local_theta > 0 ? c.transformer.rope_local_theta : c.transformer.rope_theta};
}

bool gated_mlp(const ModelConfig& c) {
  return c.transformer.mlp == MlpKind::swiglu || c.transformer.mlp == MlpKind::geglu;
}

int64_t num_heads(const ModelConfig& c) {
  return c.transformer.num_heads > 0 ? c.transformer.num_heads : c.hidden_size / c.transformer.head_dim;
}

int64_t mlp_width(const ModelConfig& c) {
  if (c.transformer.intermediate_size > 0) return c.transformer.intermediate_size;
  const int64_t f = c.transformer.mlp_expansion * c.hidden_size;
  return gated_mlp(c) ? (2 * f / 3 + 255) / 256 * 256 : f;
}

void validate_transformer(const ModelConfig& c) {
  check_key(c.transformer.num_layers >= 1, "model.num_layers", "must be >= 1", "e.g. 12");
  check_key(c.transformer.head_dim >= 1, "model.head_dim", "must be >= 1", "e.g. 64");
  check_key(c.transformer.num_heads >= 0, "model.num_heads", "must be >= 0", "0 takes hidden_size / head_dim");
  check_key(c.transformer.num_heads > 0 || c.hidden_size % c.transformer.head_dim == 0, "model.hidden_size",
            "hidden_size " + std::to_string(c.hidden_size) + " is not a multiple of model.head_dim " +
                std::to_string(c.transformer.head_dim),
            "num_heads = hidden_size / head_dim must be whole: change either, or set model.num_heads");
  const int64_t H = num_heads(c);
  check_key(c.transformer.num_kv_heads >= 0 && (c.transformer.num_kv_heads == 0 || H % c.transformer.num_kv_heads == 0),
            "model.num_kv_heads",
            std::to_string(c.transformer.num_kv_heads) + " does not divide num_heads " + std::to_string(H) +
                (c.transformer.num_heads > 0 ? " (model.num_heads)" : " (model.hidden_size / model.head_dim)"),
            "use a divisor of num_heads, or 0 for one key/value head per query head");
  check_key(c.transformer.mlp_expansion >= 1, "model.mlp_expansion", "must be >= 1", "the tutorial uses 4");
  check_key(c.transformer.intermediate_size >= 0, "model.intermediate_size", "must be >= 0",
            "0 takes the default width (nn::mlp_width), e.g. 4 × hidden_size");
  check_key(c.transformer.vocab_size >= 2, "model.vocab_size", "must be >= 2", "e.g. 2048");
  check_key(c.transformer.num_outputs >= 1, "model.num_outputs", "must be >= 1", "usually the vocabulary size");
  check_key(c.transformer.max_seq_len >= 1, "model.max_seq_len", "must be >= 1", "e.g. 512");
  check_key(c.transformer.position != PositionKind::rope || c.transformer.head_dim % 2 == 0, "model.head_dim",
            "is odd: rotary embeddings (model.position = rope) turn pairs of a head's dims", "use an even head_dim");
  check_key(c.transformer.rope_theta > 0, "model.rope_theta", "must be > 0", "Llama uses 10000 (Llama 3: 500000)");
  check_key(c.transformer.sliding_window >= 0 && c.transformer.sliding_window <= INT32_MAX, "model.sliding_window",
            "must be in [0, 2^31)", "0 for no window; Mistral 7B v0.1 uses 4096");
  check_key(c.transformer.sliding_window_pattern >= 0, "model.sliding_window_pattern", "must be >= 0",
            "0: every layer local; Gemma 3 uses 6 (every 6th layer global)");
  check_key(c.transformer.rope_local_theta >= 0, "model.rope_local_theta", "must be >= 0",
            "0 takes rope_theta; Gemma 3 uses 10000");
  check_key(c.transformer.query_pre_attn_scalar >= 0, "model.query_pre_attn_scalar", "must be >= 0",
            "0 scales the attention logits by head_dim^-0.5; Gemma 3 270M and 1B use 256");
  check_key(c.transformer.sliding_window == 0 || c.transformer.causal_mask, "model.sliding_window",
            "needs model.causal_mask = true (a query sees the window of keys before it)", "set causal_mask = true");
  check_key(c.transformer.rope_scaling == RopeScaling::none || c.transformer.position == PositionKind::rope,
            "model.rope_scaling", "scales rotary embeddings, but model.position is not rope",
            "set model.position = rope, or rope_scaling = none");
  if (c.transformer.rope_scaling == RopeScaling::llama3) {
    check_key(c.transformer.rope_factor > 0, "model.rope_factor", "must be > 0", "Llama 3.1 uses 8, Llama 3.2 32");
    check_key(c.transformer.rope_low_freq_factor > 0 &&
                  c.transformer.rope_high_freq_factor > c.transformer.rope_low_freq_factor,
              "model.rope_high_freq_factor", "must be > model.rope_low_freq_factor > 0", "Llama 3.1 uses 4 and 1");
    check_key(c.transformer.rope_original_max_position >= 1 && c.transformer.rope_original_max_position <= INT32_MAX,
              "model.rope_original_max_position", "must be in [1, 2^31)", "Llama 3.1 uses 8192");
  }
  if (c.lora.enabled()) {
    check_key(c.lora.alpha > 0, "lora.alpha", "must be > 0", "PEFT's default is 8; often 2 × lora.rank");
    check_key(c.lora.dropout >= 0 && c.lora.dropout < 1, "lora.dropout", "must be in [0, 1)", "e.g. 0.05");
    lora_modules(c.lora, gated_mlp(c));  // names the family lacks
  }
  check_key(c.transformer.head_chunk >= 0 || c.transformer.head_chunk == kHeadChunkAuto, "model.head_chunk",
            "must be >= 0 or auto", "0 for the plain head, e.g. 8192 columns per chunk");
  check_key(c.transformer.head_chunk != kHeadChunkAuto || c.remat.has(RematRegion::auto_), "model.head_chunk",
            "auto is chosen by model.remat = auto, which this run does not use",
            "set model.remat = auto (with train.memory_budget), or a number of columns");
  check_key(!c.transformer.tie_embeddings || c.transformer.num_outputs == c.transformer.vocab_size,
            "model.tie_embeddings", "tied embeddings need model.num_outputs == model.vocab_size",
            "set num_outputs to the vocabulary size");
}

const ModelKindInfo& transformer_family() {
  static const ModelKindInfo row{.name = {},
                                 .language_model = true,
                                 .build = build_transformer,
                                 .validate = validate_transformer,
                                 .build_decoder = build_transformer_decoder,
                                 .build_prefill = build_transformer_prefill,
                                 .keys = transformer_keys};
  return row;
}

}  // namespace loom::nn
