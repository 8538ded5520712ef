// Llama (transformers' LlamaForCausalLM, model_type "llama": SmolLM, Llama 2 and 3, TinyLlama) as
// a Hugging Face architecture of the transformer family: loom's transformer with block_order =
// attn_first, norm = rmsnorm, mlp = swiglu, position = rope, no biases and causal attention.
//
// config.json -> model.*: hidden_size, num_hidden_layers -> num_layers, head_dim (null:
// hidden_size / num_attention_heads), num_attention_heads -> num_heads, intermediate_size,
// num_key_value_heads (null: num_attention_heads) -> num_kv_heads, vocab_size -> vocab_size and num_outputs,
// max_position_embeddings -> max_seq_len, rms_norm_eps (1e-6) -> layer_norm_eps, rope_theta and
// rope_parameters / rope_scaling (rope_type default or llama3, with its factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings) -> model.rope_* (hf_read_rope),
// tie_word_embeddings (false); norm rmsnorm, mlp swiglu, position rope, no biases, causal fixed;
// embed_dropout false by default. Missing keys take LlamaConfig's defaults. Another activation,
// biases, or another rope_type (linear, dynamic, yarn, longrope) is refused.
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
#include "nn/models/llama/llama.h"

#include "core/error.h"
#include "nn/models/transformer/transformer.h"

namespace loom::nn {

void llama_style_read(const LlamaStyle& s, const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys) {
  const int64_t hidden = j.integer("hidden_size", 4096), layers = j.integer("num_hidden_layers", 32);
  const int64_t heads = j.integer("num_attention_heads", 32);
  const int64_t kv = j.integer("num_key_value_heads", s.num_key_value_heads > 0 ? s.num_key_value_heads : heads);
  const int64_t inter = j.integer("intermediate_size", s.intermediate_size);
  const int64_t vocab = j.integer("vocab_size", s.vocab_size);
  const int64_t positions = j.integer("max_position_embeddings", s.max_position_embeddings);
  // head_dim may be independent of the width (q_proj maps hidden_size to heads·head_dim features).
  if (!j.find("head_dim") && hidden % heads != 0)
    j.fail("num_attention_heads",
           "does not divide hidden_size = " + std::to_string(hidden) + " and head_dim is absent");
  const int64_t head_dim = j.integer("head_dim", hidden / heads);
  if (heads % kv != 0) j.fail("num_key_value_heads", "does not divide num_attention_heads = " + std::to_string(heads));
  const double eps = j.number("rms_norm_eps", 1e-6);
  const std::string act = j.text("hidden_act", "silu");
  if (act != "silu") j.fail("hidden_act", "is \"" + act + "\"; loom's SwiGLU MLP is SiLU-gated");
  if (s.bias_keys) {
    if (j.boolean("attention_bias", false)) j.fail("attention_bias", "is true; loom's Llama layers have no biases");
    if (j.boolean("mlp_bias", false)) j.fail("mlp_bias", "is true; loom's Llama layers have no biases");
  }
  const bool tied = j.boolean("tie_word_embeddings", s.tie_word_embeddings);
  // A window the config class has: its default when the key is absent, none when it is null.
  int64_t window = 0;
  if (s.sliding_window > 0) window = j.present("sliding_window") ? j.integer("sliding_window", 0) : s.sliding_window;

  const std::string a = s.architecture;
  keys = hf_read_decoder(a,
                         {.hidden_size = hidden,
                          .num_layers = layers,
                          .num_heads = heads,
                          .num_kv_heads = kv,
                          .head_dim = head_dim,
                          .intermediate_size = inter,
                          .vocab_size = vocab,
                          .max_positions = positions,
                          .norm_eps = eps,
                          .tie_embeddings = tied,
                          .qkv_bias = s.qkv_bias},
                         m);
  m.transformer.norm = NormKind::rmsnorm;
  m.transformer.mlp = MlpKind::swiglu;
  m.transformer.sliding_window = window;
  keys.insert(keys.end(),
              {
                  {.key = "model.norm", .origin = a + " (RMSNorm)"},
                  {.key = "model.mlp", .origin = "hidden_act = \"silu\" (SwiGLU)"},
                  {.key = "model.sliding_window",
                   .origin = s.sliding_window > 0 ? "sliding_window = " + (window ? std::to_string(window) : "null")
                                                  : a + " (attends to every earlier token)"},
              });
  hf_read_rope(j, positions, m, keys);
}

nlohmann::json llama_style_write(const LlamaStyle& s, const ModelConfig& c, const HfModelMap& map) {
  nlohmann::json j = {
      {"architectures", {map.architecture}},
      {"model_type", map.model_type},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", mlp_width(c)},
      {"num_hidden_layers", c.transformer.num_layers},
      {"num_attention_heads", map.heads},
      {"num_key_value_heads", map.kv_heads},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.transformer.max_seq_len},
      {"vocab_size", c.transformer.vocab_size},
      {"rms_norm_eps", c.layer_norm_eps},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", c.transformer.tie_embeddings},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"dtype", "float32"},
  };
  if (s.bias_keys) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j.update(hf_rope_json(c));
  return j;
}

// The rotary inverse frequencies older checkpoints saved (loom recomputes them from rope_theta).
bool is_rope_buffer(const std::string& name) { return name.ends_with(".rotary_emb.inv_freq"); }

HfModelMap llama_style_map(const LlamaStyle& s, const ModelConfig& c) {
  const HfNeeds need{s.architecture, s.variant};
  hf_check_decoder(c, need);
  need(c.transformer.mlp == MlpKind::swiglu, "model.mlp", "is not swiglu (the MLP is SiLU-gated)");
  need(c.transformer.position == PositionKind::rope, "model.position", "is not rope (there is no position table)");
  need(!c.transformer.use_bias, "model.use_bias", "is true (the Dense layers have no biases)");
  need(c.transformer.qkv_bias == s.qkv_bias, "model.qkv_bias",
       s.qkv_bias ? "is false (q_proj, k_proj and v_proj have biases)"
                  : "is true (q_proj, k_proj and v_proj have no biases)");
  need(s.sliding_window || c.transformer.sliding_window == 0, "model.sliding_window",
       "is not 0 (every layer attends to all earlier tokens)");
  need(c.transformer.num_outputs == c.transformer.vocab_size, "model.num_outputs",
       "differs from vocab_size (lm_head is [vocab_size, C])");
  need(!c.transformer.qk_norm, "model.qk_norm", "is true (Llama does not normalise q and k; Qwen3ForCausalLM does)");
  need(!c.transformer.post_norms, "model.post_norms", "is true (Llama has no norms after its branches)");
  const int64_t C = c.hidden_size, H = num_heads(c),
                KV = c.transformer.num_kv_heads > 0 ? c.transformer.num_kv_heads : H;
  HfModelMap m{.architecture = s.architecture,
               .model_type = s.model_type,
               .prefix = "model.",
               .heads = H,
               .head_dim = c.transformer.head_dim,
               .kv_heads = KV,
               .params = {},
               .is_buffer = is_rope_buffer};
  const HfMapBuilder add{m, s.qkv_bias};
  add("embed_tokens.weight", Shape{c.transformer.vocab_size, C}, "embed/embedding", Shape{c.transformer.vocab_size, C});
  for (int64_t l = 0; l < c.transformer.num_layers; ++l) {
    const std::string h = "layers." + std::to_string(l) + ".", b = "block_" + std::to_string(l) + "/";
    add(h + "input_layernorm.weight", Shape{C}, b + "attn/pre_norm/scale", Shape{C});
    llama_attention_tensors(add, c, l);
    add(h + "post_attention_layernorm.weight", Shape{C}, b + "mlp/pre_norm/scale", Shape{C});
    llama_mlp_tensors(add, c, l);
  }
  add("norm.weight", Shape{C}, "post_norm/scale", Shape{C});
  if (!c.transformer.tie_embeddings)
    add("lm_head.weight", Shape{c.transformer.vocab_size, C}, "output_layer/kernel", Shape{C, c.transformer.vocab_size},
        HfLayout::transposed);
  return m;
}

void llama_attention_tensors(const HfMapBuilder& add, const ModelConfig& c, int64_t l) {
  const int64_t C = c.hidden_size, D = c.transformer.head_dim, H = num_heads(c);
  const int64_t KV = c.transformer.num_kv_heads > 0 ? c.transformer.num_kv_heads : H, G = H / KV;
  const auto R = HfLayout::qkv_rows;
  const std::string h = "layers." + std::to_string(l) + ".self_attn.", b = "block_" + std::to_string(l) + "/attn/";
  const Shape qkv{C, KV, (G + 2) * D}, bias{KV, (G + 2) * D};
  add(h + "q_proj.weight", Shape{H * D, C}, b + "qkv/kernel", qkv, R, 0, G);
  if (c.transformer.qkv_bias) add(h + "q_proj.bias", Shape{H * D}, b + "qkv/bias", bias, R, 0, G);
  add(h + "k_proj.weight", Shape{KV * D, C}, b + "qkv/kernel", qkv, R, G, 1);
  if (c.transformer.qkv_bias) add(h + "k_proj.bias", Shape{KV * D}, b + "qkv/bias", bias, R, G, 1);
  add(h + "v_proj.weight", Shape{KV * D, C}, b + "qkv/kernel", qkv, R, G + 1, 1);
  if (c.transformer.qkv_bias) add(h + "v_proj.bias", Shape{KV * D}, b + "qkv/bias", bias, R, G + 1, 1);
  add(h + "o_proj.weight", Shape{C, H * D}, b + "output_layer/kernel", Shape{H, D, C}, HfLayout::transposed);
}

void llama_mlp_tensors(const HfMapBuilder& add, const ModelConfig& c, int64_t l) {
  const int64_t C = c.hidden_size, F = mlp_width(c);
  const auto T = HfLayout::transposed;
  const std::string h = "layers." + std::to_string(l) + ".mlp.", b = "block_" + std::to_string(l) + "/mlp/";
  add(h + "gate_proj.weight", Shape{F, C}, b + "gate_layer/kernel", Shape{C, F}, T);
  add(h + "up_proj.weight", Shape{F, C}, b + "up_layer/kernel", Shape{C, F}, T);
  add(h + "down_proj.weight", Shape{C, F}, b + "output_layer/kernel", Shape{F, C}, T);
}

namespace {

// LlamaConfig's defaults.
constexpr LlamaStyle kLlama{
    .architecture = "LlamaForCausalLM",
    .model_type = "llama",
    .vocab_size = 32000,
    .intermediate_size = 11008,
    .num_key_value_heads = 0,
    .max_position_embeddings = 2048,
    .tie_word_embeddings = false,
    .qkv_bias = false,
    .sliding_window = 0,
    .bias_keys = true,
    .variant =
        "Llama's variant is block_order = attn_first, norm = rmsnorm, mlp = swiglu, position = rope, "
        "use_bias = false, qkv_bias = false, sliding_window = 0, causal_mask = true; model.norm = rmsnorm "
        "chose it (a GPT-2 has layernorm)"};

bool claims(const ModelConfig& c) { return c.transformer.norm == NormKind::rmsnorm; }

void read_config(const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys) {
  llama_style_read(kLlama, j, m, keys);
}

nlohmann::json write_config(const ModelConfig& c, const HfModelMap& map) {
  nlohmann::json j = llama_style_write(kLlama, c, map);
  j["head_dim"] = c.transformer.head_dim;
  return j;
}

HfModelMap tensor_map(const ModelConfig& c) { return llama_style_map(kLlama, c); }

}  // namespace

const HfArchitecture& llama_architecture() {
  static const HfArchitecture a{
      .architecture = kLlama.architecture,
      .model_type = kLlama.model_type,
      .listed_as = "LlamaForCausalLM (model_type \"llama\": SmolLM, Llama 2, Llama 3 and 3.1-3.3)",
      .claims = claims,
      .read_config = read_config,
      .write_config = write_config,
      .tensor_map = tensor_map,
      .gguf_architecture = "llama",
      .gguf_rotate_pairs = true};
  return a;
}

}  // namespace loom::nn
