// Llama (transformers' LlamaForCausalLM, model_type "llama": SmolLM, Llama 2 and 3, TinyLlama) as
// a Hugging Face architecture of the transformer family: loom's transformer with block_order =
// attn_first, norm = rmsnorm, mlp = swiglu, position = rope, no biases and causal attention.
//
// config.json -> model.*: hidden_size, num_hidden_layers -> num_layers, head_dim (null:
// hidden_size / num_attention_heads), num_attention_heads -> num_heads, intermediate_size, num_key_value_heads (null:
// num_attention_heads) -> num_kv_heads, vocab_size -> vocab_size and num_outputs,
// max_position_embeddings -> max_seq_len, rms_norm_eps (1e-6) -> layer_norm_eps, rope_theta (or
// rope_parameters.rope_theta; 10000), tie_word_embeddings (false); norm rmsnorm, mlp swiglu,
// position rope, no biases, causal fixed; embed_dropout false by default. Missing keys take
// LlamaConfig's defaults. Another activation, biases, or rope scaling (rope_parameters or
// rope_scaling of a type other than default) is refused.
//
// Tensors: KV = num_kv_heads key/value heads, G = H / KV query heads per key/value head, F = the
// MLP width. nn.Linear stores [out, in], loom's kernels [in, out]: every matrix is transposed.
// Per layer l (loom block_l/... <- model.layers.l.<...>):
//   attn/pre_norm/scale [C]             input_layernorm.weight
//   attn/qkv/kernel [C, KV, (G+2)·D]    self_attn.q_proj.weight [H·D, C]   slots 0..G-1 of each kv head
//                                       self_attn.k_proj.weight [KV·D, C]  slot G
//                                       self_attn.v_proj.weight [KV·D, C]  slot G+1
//   attn/output_layer/kernel [H, D, C]  self_attn.o_proj.weight [C, H·D]
//   mlp/pre_norm/scale                  post_attention_layernorm.weight
//   mlp/gate_layer/kernel [C, F]        mlp.gate_proj.weight [F, C]
//   mlp/up_layer/kernel [C, F]          mlp.up_proj.weight [F, C]
//   mlp/output_layer/kernel [F, C]      mlp.down_proj.weight [C, F]
// and embed/embedding <- model.embed_tokens.weight, post_norm/scale <- model.norm.weight, an
// untied head's output_layer/kernel [C, V] <- lm_head.weight [V, C]. Query head h = j·G + g uses
// key/value head j (transformers' repeat_kv); rotary embeddings use the same rotate_half layout
// (graph/ops.def, rope), so q and k rows are copied without a permutation.
#include "core/error.h"
#include "nn/models/hf_arch.h"
#include "nn/models/transformer/transformer.h"

namespace loom::nn {

namespace {

constexpr const char* kArchitecture = "LlamaForCausalLM";

bool claims(const ModelConfig& c) { return c.norm == NormKind::rmsnorm; }

// LlamaConfig's defaults; rotary embeddings of the default type only.
void read_config(const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys) {
  const int64_t hidden = j.integer("hidden_size", 4096), layers = j.integer("num_hidden_layers", 32);
  const int64_t heads = j.integer("num_attention_heads", 32), kv = j.integer("num_key_value_heads", heads);
  const int64_t inter = j.integer("intermediate_size", 11008), vocab = j.integer("vocab_size", 32000);
  const int64_t positions = j.integer("max_position_embeddings", 2048);
  // head_dim may be independent of the width (q_proj maps hidden_size to heads·head_dim features).
  if (!j.find("head_dim") && hidden % heads != 0)
    j.fail("num_attention_heads",
           "does not divide hidden_size = " + std::to_string(hidden) + " and head_dim is absent");
  const int64_t head_dim = j.integer("head_dim", hidden / heads);
  if (heads % kv != 0) j.fail("num_key_value_heads", "does not divide num_attention_heads = " + std::to_string(heads));
  const double eps = j.number("rms_norm_eps", 1e-6);
  const std::string act = j.text("hidden_act", "silu");
  if (act != "silu") j.fail("hidden_act", "is \"" + act + "\"; loom's SwiGLU MLP is SiLU-gated");
  if (j.boolean("attention_bias", false)) j.fail("attention_bias", "is true; loom's Llama layers have no biases");
  if (j.boolean("mlp_bias", false)) j.fail("mlp_bias", "is true; loom's Llama layers have no biases");
  // transformers 5 writes rope_parameters {rope_theta, rope_type}; older versions rope_theta
  // and rope_scaling (null or {"rope_type" or "type": ...}). transformers 5 also honours a
  // rope_scaling left beside rope_parameters, so neither may ask for another type.
  double theta = j.number("rope_theta", 10000);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const nlohmann::json* r = j.find(key);
    if (!r) continue;
    if (!r->is_object()) j.fail(key, "is not an object or null");
    if (auto t = r->find("rope_theta"); t != r->end()) {
      if (!t->is_number() || !(t->get<double>() > 0))
        j.fail(std::string(key) + ".rope_theta", "is not a positive number");
      theta = t->get<double>();
    }
    const nlohmann::json type = r->value("rope_type", r->value("type", nlohmann::json("default")));
    if (type != "default")
      j.fail(key, "asks for rope_type " + type.dump() + "; loom's rotary embeddings are the default type");
  }
  const bool tied = j.boolean("tie_word_embeddings", false);

  m.kind = ModelKind::transformer;
  m.hidden_size = hidden;
  m.num_layers = layers;
  m.head_dim = head_dim;
  m.num_heads = heads;
  m.intermediate_size = inter;
  m.vocab_size = m.num_outputs = vocab;
  m.max_seq_len = positions;
  m.layer_norm_eps = eps;
  m.block_order = BlockOrder::attn_first;
  m.norm = NormKind::rmsnorm;
  m.mlp = MlpKind::swiglu;
  m.position = PositionKind::rope;
  m.rope_theta = theta;
  m.num_kv_heads = kv;
  m.use_bias = false;
  m.tie_embeddings = tied;
  m.causal_mask = true;
  m.embed_dropout = false;
  m.init = InitScheme::gpt2;
  const std::string a = kArchitecture;
  const auto n = [](int64_t v) { return std::to_string(v); };
  keys = {
      {.key = "model.kind", .origin = a},
      {.key = "model.hidden_size", .origin = "hidden_size = " + n(hidden)},
      {.key = "model.num_layers", .origin = "num_hidden_layers = " + n(layers)},
      {.key = "model.head_dim", .origin = "head_dim = " + n(head_dim)},
      {.key = "model.num_heads", .origin = "num_attention_heads = " + n(heads)},
      {.key = "model.intermediate_size", .origin = "intermediate_size = " + n(inter)},
      {.key = "model.vocab_size", .origin = "vocab_size = " + n(vocab)},
      {.key = "model.num_outputs", .origin = "vocab_size = " + n(vocab)},
      {.key = "model.max_seq_len", .origin = "max_position_embeddings = " + n(positions)},
      {.key = "model.layer_norm_eps", .origin = "rms_norm_eps = " + nlohmann::json(eps).dump()},
      {.key = "model.tie_embeddings", .origin = std::string("tie_word_embeddings = ") + (tied ? "true" : "false")},
      {.key = "model.block_order", .origin = a + " (attention before MLP)"},
      {.key = "model.norm", .origin = a + " (RMSNorm)"},
      {.key = "model.mlp", .origin = "hidden_act = \"silu\" (SwiGLU)"},
      {.key = "model.position", .origin = a + " (rotary embeddings)"},
      {.key = "model.rope_theta", .origin = "rope_theta = " + nlohmann::json(theta).dump()},
      {.key = "model.num_kv_heads", .origin = "num_key_value_heads = " + n(kv)},
      {.key = "model.use_bias", .origin = a + " (no biases)"},
      {.key = "model.causal_mask", .origin = a + " (causal)"},
      {.key = "model.embed_dropout", .origin = a + " (no embedding dropout)", .fixed = false},
      {.key = "model.init", .origin = a, .fixed = false},
  };
}

nlohmann::json write_config(const ModelConfig& c, const HfModelMap& map) {
  return {
      {"architectures", {map.architecture}},
      {"model_type", map.model_type},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", mlp_width(c)},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", map.heads},
      {"num_key_value_heads", map.kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.max_seq_len},
      {"vocab_size", c.vocab_size},
      {"rms_norm_eps", c.layer_norm_eps},
      // Both spellings: transformers 5 reads rope_parameters, 4.x rope_theta and rope_scaling.
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", c.tie_embeddings},
      {"pretraining_tp", 1},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"dtype", "float32"},
  };
}

// The rotary inverse frequencies older checkpoints saved (loom recomputes them from rope_theta).
bool is_buffer(const std::string& name) { return name.ends_with(".rotary_emb.inv_freq"); }

HfModelMap tensor_map(const ModelConfig& c) {
  const HfNeeds need{kArchitecture,
                     "Llama's variant is block_order = attn_first, norm = rmsnorm, mlp = swiglu, position = rope, "
                     "use_bias = false, causal_mask = true; model.norm = rmsnorm chose it (a GPT-2 has layernorm)"};
  hf_check_decoder(c, need);
  need(c.mlp == MlpKind::swiglu, "model.mlp", "is not swiglu (Llama's MLP is SiLU-gated)");
  need(c.position == PositionKind::rope, "model.position", "is not rope (Llama has no position table)");
  need(!c.use_bias, "model.use_bias", "is true (Llama's layers have no biases)");
  need(c.num_outputs == c.vocab_size, "model.num_outputs", "differs from vocab_size (lm_head is [vocab_size, C])");
  need(!c.qk_norm, "model.qk_norm", "is true (Llama does not normalise q and k; Qwen3ForCausalLM does)");
  need(!c.post_norms, "model.post_norms", "is true (Llama has no norms after its branches)");
  const int64_t C = c.hidden_size, D = c.head_dim, H = num_heads(c), F = mlp_width(c);
  const int64_t KV = c.num_kv_heads > 0 ? c.num_kv_heads : H, G = H / KV;
  HfModelMap m{.architecture = kArchitecture,
               .model_type = "llama",
               .prefix = "model.",
               .heads = H,
               .head_dim = D,
               .kv_heads = KV,
               .params = {},
               .is_buffer = is_buffer};
  const HfMapBuilder add{m, false};
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

const HfArchitecture& llama_architecture() {
  static const HfArchitecture a{
      .architecture = kArchitecture,
      .model_type = "llama",
      .listed_as = "LlamaForCausalLM (model_type \"llama\": SmolLM, Llama 3 without rope scaling)",
      .claims = claims,
      .read_config = read_config,
      .write_config = write_config,
      .tensor_map = tensor_map};
  return a;
}

}  // namespace loom::nn
