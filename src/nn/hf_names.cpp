#include "nn/hf_names.h"

#include "core/error.h"
#include "nn/transformer.h"

namespace loom::nn {

namespace {

// Refuses a model `architecture` cannot hold, naming the key and what the architecture needs.
struct Needs {
  const char* architecture;
  const char* variant;
  void operator()(bool ok, const char* key, const std::string& problem) const {
    if (!ok) throw UserError(key, problem + ": " + architecture + " cannot hold this model", variant);
  }
};

// Appends the entries of one architecture's map (prefix added to the names).
struct MapBuilder {
  HfModelMap& m;
  bool use_bias;
  void operator()(const std::string& hf, Shape hf_shape, std::string path, Shape shape,
                  HfLayout layout = HfLayout::same, int64_t slot = 0, int64_t slots = 0) const {
    if (!use_bias && path.ends_with("/bias")) path.clear();
    m.params.push_back({.hf_name = (hf == "lm_head.weight" ? "" : m.prefix) + hf,
                        .hf_shape = hf_shape,
                        .path = std::move(path),
                        .shape = shape,
                        .layout = layout,
                        .slot = slot,
                        .slots = slots});
  }
};

void check_common(const ModelConfig& c, const Needs& need) {
  need(c.kind == ModelKind::transformer, "model.kind", "is not transformer");
  need(c.block_order == BlockOrder::attn_first, "model.block_order", "is not attn_first");
  need(c.causal_mask, "model.causal_mask", "is false");
}

HfModelMap gpt2_map(const ModelConfig& c) {
  const Needs need{
      "GPT2LMHeadModel",
      "GPT-2's variant is block_order = attn_first, norm = layernorm, mlp = gelu_tanh or gelu, "
      "position = learned, tie_embeddings = true, causal_mask = true (configs/gpt2_124m.toml); model.norm = layernorm "
      "chose it (a Llama has rmsnorm)"};
  check_common(c, need);
  need(c.mlp != MlpKind::swiglu, "model.mlp", "is swiglu");
  need(c.position == PositionKind::learned, "model.position", "is not learned (GPT-2 has a position table)");
  need(c.num_kv_heads == 0 || c.num_kv_heads * c.head_dim == c.hidden_size, "model.num_kv_heads",
       "is fewer than num_heads (GPT-2 has no grouped-query attention)");
  need(c.tie_embeddings, "model.tie_embeddings", "is false (loom's untied head has a bias, GPT-2's lm_head none)");
  const int64_t C = c.hidden_size, D = c.head_dim, H = C / D, F = mlp_width(c);
  HfModelMap m{.architecture = "GPT2LMHeadModel",
               .model_type = "gpt2",
               .prefix = "transformer.",
               .heads = H,
               .head_dim = D,
               .kv_heads = H,
               .params = {}};
  const MapBuilder add{m, c.use_bias};
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

HfModelMap llama_map(const ModelConfig& c) {
  const Needs need{"LlamaForCausalLM",
                   "Llama's variant is block_order = attn_first, norm = rmsnorm, mlp = swiglu, position = rope, "
                   "use_bias = false, causal_mask = true; model.norm = rmsnorm chose it (a GPT-2 has layernorm)"};
  check_common(c, need);
  need(c.mlp == MlpKind::swiglu, "model.mlp", "is not swiglu (Llama's MLP is SiLU-gated)");
  need(c.position == PositionKind::rope, "model.position", "is not rope (Llama has no position table)");
  need(!c.use_bias, "model.use_bias", "is true (Llama's layers have no biases)");
  need(c.num_outputs == c.vocab_size, "model.num_outputs", "differs from vocab_size (lm_head is [vocab_size, C])");
  const int64_t C = c.hidden_size, D = c.head_dim, H = C / D, F = mlp_width(c);
  const int64_t KV = c.num_kv_heads > 0 ? c.num_kv_heads : H, G = H / KV;
  HfModelMap m{.architecture = "LlamaForCausalLM",
               .model_type = "llama",
               .prefix = "model.",
               .heads = H,
               .head_dim = D,
               .kv_heads = KV,
               .params = {}};
  const MapBuilder add{m, false};
  const auto T = HfLayout::transposed;
  add("embed_tokens.weight", Shape{c.vocab_size, C}, "embed/embedding", Shape{c.vocab_size, C});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string h = "layers." + std::to_string(l) + ".", b = "block_" + std::to_string(l) + "/";
    const std::string qkv = b + "attn/qkv/kernel";
    const Shape qkv_shape{C, KV, (G + 2) * D};
    add(h + "input_layernorm.weight", Shape{C}, b + "attn/pre_norm/scale", Shape{C});
    add(h + "self_attn.q_proj.weight", Shape{H * D, C}, qkv, qkv_shape, HfLayout::qkv_rows, 0, G);
    add(h + "self_attn.k_proj.weight", Shape{KV * D, C}, qkv, qkv_shape, HfLayout::qkv_rows, G, 1);
    add(h + "self_attn.v_proj.weight", Shape{KV * D, C}, qkv, qkv_shape, HfLayout::qkv_rows, G + 1, 1);
    add(h + "self_attn.o_proj.weight", Shape{C, H * D}, b + "attn/output_layer/kernel", Shape{H, D, C}, T);
    add(h + "post_attention_layernorm.weight", Shape{C}, b + "mlp/pre_norm/scale", Shape{C});
    add(h + "mlp.gate_proj.weight", Shape{F, C}, b + "mlp/gate_layer/kernel", Shape{C, F}, T);
    add(h + "mlp.up_proj.weight", Shape{F, C}, b + "mlp/up_layer/kernel", Shape{C, F}, T);
    add(h + "mlp.down_proj.weight", Shape{C, F}, b + "mlp/output_layer/kernel", Shape{F, C}, T);
  }
  add("norm.weight", Shape{C}, "post_norm/scale", Shape{C});
  if (!c.tie_embeddings)
    add("lm_head.weight", Shape{c.vocab_size, C}, "output_layer/kernel", Shape{C, c.vocab_size}, T);
  return m;
}

}  // namespace

HfModelMap hf_model_map(const ModelConfig& c) { return c.norm == NormKind::rmsnorm ? llama_map(c) : gpt2_map(c); }

}  // namespace loom::nn
