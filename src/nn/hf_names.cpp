#include "nn/hf_names.h"

#include "core/error.h"
#include "nn/transformer.h"

namespace loom::nn {

namespace {
void need(bool ok, const char* key, const std::string& problem) {
  if (!ok)
    throw UserError(key, problem + ": GPT2LMHeadModel cannot hold this model",
                    "GPT-2's variant is block_order = attn_first, norm = layernorm, mlp = gelu_tanh or gelu, "
                    "position = learned, tie_embeddings = true, causal_mask = true (configs/gpt2_124m.toml)");
}
}  // namespace

HfModelMap hf_model_map(const ModelConfig& c) {
  need(c.kind == ModelKind::transformer, "model.kind", "is not transformer");
  need(c.block_order == BlockOrder::attn_first, "model.block_order", "is not attn_first");
  need(c.norm == NormKind::layernorm, "model.norm", "is not layernorm");
  need(c.mlp != MlpKind::swiglu, "model.mlp", "is swiglu");
  need(c.position == PositionKind::learned, "model.position", "is not learned (GPT-2 has a position table)");
  need(c.num_kv_heads == 0 || c.num_kv_heads * c.head_dim == c.hidden_size, "model.num_kv_heads",
       "is fewer than num_heads (GPT-2 has no grouped-query attention)");
  need(c.tie_embeddings, "model.tie_embeddings", "is false (loom's untied head has a bias, GPT-2's lm_head none)");
  need(c.causal_mask, "model.causal_mask", "is false");
  const int64_t C = c.hidden_size, D = c.head_dim, H = C / D, F = mlp_width(c);
  HfModelMap m{.architecture = "GPT2LMHeadModel", .model_type = "gpt2", .heads = H, .head_dim = D, .params = {}};
  auto add = [&](std::string hf, Shape hf_shape, std::string path, Shape shape, HfLayout layout = HfLayout::same) {
    if (!c.use_bias && path.ends_with("/bias")) path.clear();
    m.params.push_back({.hf_name = "transformer." + hf,
                        .hf_shape = hf_shape,
                        .path = std::move(path),
                        .shape = shape,
                        .layout = layout});
  };
  add("wte.weight", Shape{c.vocab_size, C}, "embed/embedding", Shape{c.vocab_size, C});
  add("wpe.weight", Shape{c.max_seq_len, C}, "pos_emb", Shape{c.max_seq_len, C});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".", b = "block_" + std::to_string(l) + "/";
    add(h + "ln_1.weight", Shape{C}, b + "attn/pre_norm/scale", Shape{C});
    add(h + "ln_1.bias", Shape{C}, b + "attn/pre_norm/bias", Shape{C});
    add(h + "attn.c_attn.weight", Shape{C, 3 * C}, b + "attn/qkv/kernel", Shape{C, H, 3 * D}, HfLayout::qkv_columns);
    add(h + "attn.c_attn.bias", Shape{3 * C}, b + "attn/qkv/bias", Shape{H, 3 * D}, HfLayout::qkv_columns);
    add(h + "attn.c_proj.weight", Shape{C, C}, b + "attn/output_layer/kernel", Shape{H, D, C});
    add(h + "attn.c_proj.bias", Shape{C}, b + "attn/output_layer/bias", Shape{C});
    add(h + "ln_2.weight", Shape{C}, b + "mlp/pre_norm/scale", Shape{C});
    add(h + "ln_2.bias", Shape{C}, b + "mlp/pre_norm/bias", Shape{C});
    add(h + "mlp.c_fc.weight", Shape{C, F}, b + "mlp/input_layer/kernel", Shape{C, F});
    add(h + "mlp.c_fc.bias", Shape{F}, b + "mlp/input_layer/bias", Shape{F});
    add(h + "mlp.c_proj.weight", Shape{F, C}, b + "mlp/output_layer/kernel", Shape{F, C});
    add(h + "mlp.c_proj.bias", Shape{C}, b + "mlp/output_layer/bias", Shape{C});
  }
  add("ln_f.weight", Shape{C}, "post_norm/scale", Shape{C});
  add("ln_f.bias", Shape{C}, "post_norm/bias", Shape{C});
  return m;
}

}  // namespace loom::nn
