// Gemma 3 text (transformers' Gemma3ForCausalLM, model_type "gemma3_text": gemma-3-270m,
// gemma-3-1b) as a Hugging Face architecture of the transformer family: loom's transformer with
// block_order = attn_first, norm = gemma_rmsnorm (x·rstd·(1 + w)), the four norms per layer
// (post_norms), mlp = geglu (gelu_pytorch_tanh), qk_norm (1 + w as well), position = rope, no
// biases, causal attention, and what only Gemma 3 has:
//   scale_embeddings        the embeddings times sqrt(hidden_size) (Gemma3TextScaledWordEmbedding;
//                           the tied head uses the table unscaled)
//   query_pre_attn_scalar   logits scaled by query_pre_attn_scalar^-0.5
//   sliding_window_pattern  local and global layers (nn::layer_attention): local ones attend to
//                           the last sliding_window tokens with rope_local_theta, global ones to
//                           every earlier token with rope_theta
//
// config.json -> model.*: hidden_size, num_hidden_layers -> num_layers, num_attention_heads ->
// num_heads, num_key_value_heads -> num_kv_heads, head_dim, intermediate_size, vocab_size ->
// vocab_size and num_outputs, max_position_embeddings -> max_seq_len, rms_norm_eps ->
// layer_norm_eps, query_pre_attn_scalar, sliding_window, tie_word_embeddings (true); layer_types
// (or, absent, sliding_window_pattern, default 6) -> sliding_window_pattern N: layer l must be
// "full_attention" exactly when (l + 1) % N == 0 (all "sliding_attention": N = 0); the rope bases
// from rope_parameters.full_attention / .sliding_attention .rope_theta (transformers 5) or
// rope_theta / rope_local_base_freq (4.x) -> rope_theta / rope_local_theta. Missing keys take
// Gemma3TextConfig's defaults. Refused, naming the key: another activation, attention_bias,
// a rope_type other than "default" (the 4B+ models' linear scaling of the global layers),
// final_logit_softcapping or attn_logit_softcapping (Gemma 2's), use_bidirectional_attention
// (EmbeddingGemma), a layer_types list no pattern gives.
//
// Tensors: Llama's names and layouts (llama/llama.cpp) for the embedding, q/k/v/o_proj, the MLP,
// model.norm and an untied lm_head, plus per layer l (loom block_l/... <- model.layers.l.<...>):
//   attn/pre_norm/scale [C]    input_layernorm.weight
//   attn/q_norm/scale [D]      self_attn.q_norm.weight
//   attn/k_norm/scale [D]      self_attn.k_norm.weight
//   attn/post_norm/scale [C]   post_attention_layernorm.weight
//   mlp/pre_norm/scale [C]     pre_feedforward_layernorm.weight
//   mlp/post_norm/scale [C]    post_feedforward_layernorm.weight
// Every norm weight is the w of 1 + w, as in the file. llama.cpp's gemma3 (which adds 1 to the
// norms and hard-codes the layer pattern 6) is not written: `loom export gguf` refuses it.
#include <cmath>
#include <string>

#include "core/error.h"
#include "nn/models/hf_arch.h"
#include "nn/models/llama/llama.h"
#include "nn/models/transformer/transformer.h"

namespace loom::nn {

namespace {

constexpr const char* kArchitecture = "Gemma3ForCausalLM";
constexpr const char* kModelType = "gemma3_text";
constexpr const char* kFull = "full_attention";
constexpr const char* kSliding = "sliding_attention";

bool claims(const ModelConfig& c) { return c.transformer.norm == NormKind::gemma_rmsnorm; }

// Gemma3TextConfig's defaults (transformers 5).
const nlohmann::json& defaults() {
  static const nlohmann::json d = {
      {"vocab_size", 262208},
      {"hidden_size", 2304},
      {"intermediate_size", 9216},
      {"num_hidden_layers", 26},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 4},
      {"head_dim", 256},
      {"max_position_embeddings", 131072},
      {"rms_norm_eps", 1e-6},
      {"query_pre_attn_scalar", 256},
      {"sliding_window", 4096},
      {"sliding_window_pattern", 6},
      {"rope_theta", 1e6},
      {"rope_local_base_freq", 1e4},
      {"tie_word_embeddings", true},
  };
  return d;
}

// The layer pattern N of model.sliding_window_pattern from layer_types, or transformers'
// sliding_window_pattern when it is absent.
int64_t read_pattern(const HfConfigJson& j, int64_t layers) {
  const nlohmann::json* types = j.find("layer_types");
  if (!types) return j.integer("sliding_window_pattern", 6);
  if (!types->is_array() || static_cast<int64_t>(types->size()) != layers)
    j.fail("layer_types", "is not a list of num_hidden_layers = " + std::to_string(layers) + " layer types");
  int64_t pattern = 0;  // the first global layer's index + 1; 0 when every layer is local
  for (int64_t l = 0; l < layers && pattern == 0; ++l)
    if ((*types)[static_cast<size_t>(l)] == kFull) pattern = l + 1;
  for (int64_t l = 0; l < layers; ++l) {
    const nlohmann::json& t = (*types)[static_cast<size_t>(l)];
    const bool global = pattern > 0 && (l + 1) % pattern == 0;
    if (t != (global ? kFull : kSliding))
      j.fail("layer_types", "has " + t.dump() + " at layer " + std::to_string(l) +
                                "; loom runs layers of \"sliding_attention\" with every Nth (N = " +
                                std::to_string(pattern) + " here) \"full_attention\", as sliding_window_pattern gives");
  }
  return pattern;
}

// The RoPE base of one layer type: rope_parameters.<type> (transformers 5), or the 4.x key.
double read_theta(const HfConfigJson& j, const char* type, const char* legacy) {
  const nlohmann::json* params = j.find("rope_parameters");
  if (params && !params->is_object()) j.fail("rope_parameters", "is not an object or null");
  if (!params || !params->contains(type)) return j.number(legacy, defaults()[legacy].get<double>());
  const std::string key = std::string("rope_parameters.") + type;
  const nlohmann::json& p = params->at(type);
  if (!p.is_object()) j.fail(key, "is not an object");
  const nlohmann::json rope_type = p.value("rope_type", p.value("type", nlohmann::json("default")));
  if (rope_type != "default")
    j.fail(key + ".rope_type", "is " + rope_type.dump() +
                                   "; loom runs Gemma 3's default rotary frequencies (gemma-3-270m and 1b), not the "
                                   "scaled ones of the larger models");
  const auto theta = p.find("rope_theta");
  if (theta == p.end() || theta->is_null()) return j.number(legacy, defaults()[legacy].get<double>());
  if (!theta->is_number() || !(theta->get<double>() > 0)) j.fail(key + ".rope_theta", "is not a positive number");
  return theta->get<double>();
}

void read_config(const HfConfigJson& file, ModelConfig& m, std::vector<ArchKey>& keys) {
  const HfConfigJson j(file, defaults());
  HfDecoderSizes d{.hidden_size = j.integer("hidden_size", 0),
                   .num_layers = j.integer("num_hidden_layers", 0),
                   .num_heads = j.integer("num_attention_heads", 0),
                   .num_kv_heads = j.integer("num_key_value_heads", 0),
                   .head_dim = j.integer("head_dim", 0),
                   .intermediate_size = j.integer("intermediate_size", 0),
                   .vocab_size = j.integer("vocab_size", 0),
                   .max_positions = j.integer("max_position_embeddings", 0)};
  if (d.num_heads % d.num_kv_heads != 0)
    j.fail("num_key_value_heads", "does not divide num_attention_heads = " + std::to_string(d.num_heads));
  d.norm_eps = j.number("rms_norm_eps", 0);
  const double qpas = j.number("query_pre_attn_scalar", 0);
  for (const char* act_key : {"hidden_activation", "hidden_act"})
    if (const std::string act = j.text(act_key, "gelu_pytorch_tanh"); act != "gelu_pytorch_tanh")
      j.fail(act_key, "is \"" + act + "\"; loom's GeGLU MLP (model.mlp = geglu) uses the tanh GELU, gelu_pytorch_tanh");
  if (j.boolean("attention_bias", false)) j.fail("attention_bias", "is true; loom's Gemma 3 layers have no biases");
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"})
    if (j.find(cap)) j.fail(cap, "is not null; Gemma 3 has no softcapping (Gemma 2 has), and loom runs none");
  if (j.boolean("use_bidirectional_attention", false))
    j.fail("use_bidirectional_attention", "is true (EmbeddingGemma); loom's Gemma 3 attention is causal");
  if (const nlohmann::json* s = j.find("rope_scaling"); s && !(s->is_object() && s->empty()))
    if (!s->is_object() || s->value("rope_type", s->value("type", nlohmann::json("default"))) != "default")
      j.fail("rope_scaling", "is " + s->dump() +
                                 "; loom runs Gemma 3's default rotary frequencies (gemma-3-270m and 1b), not the "
                                 "scaled global layers of the larger models");
  const int64_t pattern = read_pattern(j, d.num_layers);
  const int64_t window = j.find("sliding_window") ? j.integer("sliding_window", 0) : 0;
  if (window == 0 && pattern != 1) j.fail("sliding_window", "is null, but layer_types has sliding-window layers");
  const double theta = read_theta(j, kFull, "rope_theta"), local = read_theta(j, kSliding, "rope_local_base_freq");
  d.tie_embeddings = j.boolean("tie_word_embeddings", true);

  const std::string a = kArchitecture;
  keys = hf_read_decoder(a, d, m);
  m.transformer.norm = NormKind::gemma_rmsnorm;
  m.transformer.post_norms = true;
  m.transformer.qk_norm = true;
  m.transformer.mlp = MlpKind::geglu;
  m.transformer.rope_theta = theta;
  m.transformer.rope_local_theta = local;
  m.transformer.rope_scaling = RopeScaling::none;
  m.transformer.sliding_window = window;
  m.transformer.sliding_window_pattern = pattern;
  m.transformer.query_pre_attn_scalar = qpas;
  m.transformer.scale_embeddings = true;
  const auto n = [](auto v) { return nlohmann::json(v).dump(); };
  keys.insert(keys.end(),
              {
                  {.key = "model.norm", .origin = a + " (Gemma3RMSNorm, 1 + weight)"},
                  {.key = "model.post_norms", .origin = a + " (post_attention_layernorm, post_feedforward_layernorm)"},
                  {.key = "model.qk_norm", .origin = a + " (q_norm, k_norm)"},
                  {.key = "model.mlp", .origin = "hidden_activation = \"gelu_pytorch_tanh\" (GeGLU)"},
                  {.key = "model.rope_theta", .origin = "the full_attention layers' rope_theta = " + n(theta)},
                  {.key = "model.rope_local_theta", .origin = "the sliding_attention layers' rope_theta = " + n(local)},
                  {.key = "model.rope_scaling", .origin = a + " (default rotary frequencies)"},
                  {.key = "model.sliding_window", .origin = "sliding_window = " + n(window)},
                  {.key = "model.sliding_window_pattern",
                   .origin = pattern > 0 ? "layer_types (every " + n(pattern) + "th layer full_attention)"
                                         : std::string("layer_types (every layer sliding_attention)")},
                  {.key = "model.query_pre_attn_scalar", .origin = "query_pre_attn_scalar = " + n(qpas)},
                  {.key = "model.scale_embeddings", .origin = a + " (embeddings times sqrt(hidden_size))"},
              });
}

nlohmann::json write_config(const ModelConfig& c, const HfModelMap& map) {
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < c.transformer.num_layers; ++l)
    types.push_back(layer_attention(c, l).window > 0 ? kSliding : kFull);
  const double local = c.transformer.rope_local_theta > 0 ? c.transformer.rope_local_theta : c.transformer.rope_theta;
  return {
      {"architectures", {map.architecture}},
      {"model_type", map.model_type},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", mlp_width(c)},
      {"num_hidden_layers", c.transformer.num_layers},
      {"num_attention_heads", map.heads},
      {"num_key_value_heads", map.kv_heads},
      {"head_dim", c.transformer.head_dim},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"max_position_embeddings", c.transformer.max_seq_len},
      {"vocab_size", c.transformer.vocab_size},
      {"rms_norm_eps", c.layer_norm_eps},
      {"query_pre_attn_scalar",
       static_cast<int64_t>(c.transformer.query_pre_attn_scalar > 0 ? c.transformer.query_pre_attn_scalar
                                                                    : double(c.transformer.head_dim))},
      {"sliding_window",
       c.transformer.sliding_window > 0 ? nlohmann::json(c.transformer.sliding_window) : nlohmann::json(nullptr)},
      {"sliding_window_pattern", c.transformer.sliding_window_pattern},
      {"layer_types", types},
      {"rope_parameters",
       {{kFull, {{"rope_theta", c.transformer.rope_theta}, {"rope_type", "default"}}},
        {kSliding, {{"rope_theta", local}, {"rope_type", "default"}}}}},
      {"final_logit_softcapping", nullptr},
      {"attn_logit_softcapping", nullptr},
      {"use_bidirectional_attention", false},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", c.transformer.tie_embeddings},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"dtype", "float32"},
  };
}

// The rotary inverse frequencies older checkpoints saved (loom recomputes them).
bool is_rope_buffer(const std::string& name) { return name.find(".rotary_emb") != std::string::npos; }

HfModelMap tensor_map(const ModelConfig& c) {
  const HfNeeds need{kArchitecture,
                     "Gemma 3's variant is block_order = attn_first, norm = gemma_rmsnorm, post_norms = true, qk_norm "
                     "= true, mlp = geglu, position = rope, use_bias = false, scale_embeddings = true, a "
                     "sliding_window > 0, causal_mask = true; model.norm = gemma_rmsnorm chose it"};
  ModelConfig plain = c;  // the options only Gemma has, which hf_check_decoder refuses elsewhere
  plain.transformer.sliding_window_pattern = 0;
  plain.transformer.rope_local_theta = 0;
  plain.transformer.query_pre_attn_scalar = 0;
  plain.transformer.scale_embeddings = false;
  hf_check_decoder(plain, need);
  need(c.transformer.post_norms, "model.post_norms", "is false (Gemma 3 normalises each branch's output)");
  need(c.transformer.qk_norm, "model.qk_norm", "is false (Gemma 3 normalises q and k)");
  need(c.transformer.mlp == MlpKind::geglu, "model.mlp", "is not geglu (Gemma 3's MLP is tanh-GELU-gated)");
  need(c.transformer.position == PositionKind::rope, "model.position", "is not rope (Gemma 3 has no position table)");
  need(c.transformer.rope_scaling == RopeScaling::none, "model.rope_scaling",
       "is not none (loom writes Gemma 3's default rope)");
  need(!c.transformer.use_bias && !c.transformer.qkv_bias, "model.use_bias",
       "or model.qkv_bias is true (Gemma 3's layers have no biases)");
  need(c.transformer.scale_embeddings, "model.scale_embeddings",
       "is false (Gemma 3 scales its embeddings by sqrt(hidden_size))");
  need(c.transformer.sliding_window > 0 || c.transformer.sliding_window_pattern == 1, "model.sliding_window",
       "is 0 (Gemma 3's local layers have a window; only sliding_window_pattern = 1 has none)");
  need(c.transformer.query_pre_attn_scalar == std::floor(c.transformer.query_pre_attn_scalar),
       "model.query_pre_attn_scalar", "is not a whole number (Gemma3TextConfig's query_pre_attn_scalar is an integer)");
  need(c.transformer.num_outputs == c.transformer.vocab_size, "model.num_outputs",
       "differs from vocab_size (lm_head is [vocab_size, C])");
  const int64_t C = c.hidden_size, D = c.transformer.head_dim, H = num_heads(c),
                KV = c.transformer.num_kv_heads > 0 ? c.transformer.num_kv_heads : H;
  HfModelMap m{.architecture = kArchitecture,
               .model_type = kModelType,
               .prefix = "model.",
               .heads = H,
               .head_dim = D,
               .kv_heads = KV,
               .params = {},
               .is_buffer = is_rope_buffer};
  const HfMapBuilder add{m, false};
  add("embed_tokens.weight", Shape{c.transformer.vocab_size, C}, "embed/embedding", Shape{c.transformer.vocab_size, C});
  for (int64_t l = 0; l < c.transformer.num_layers; ++l) {
    const std::string h = "layers." + std::to_string(l) + ".", b = "block_" + std::to_string(l) + "/";
    llama_attention_tensors(add, c, l);
    add(h + "self_attn.q_norm.weight", Shape{D}, b + "attn/q_norm/scale", Shape{D});
    add(h + "self_attn.k_norm.weight", Shape{D}, b + "attn/k_norm/scale", Shape{D});
    llama_mlp_tensors(add, c, l);
    add(h + "input_layernorm.weight", Shape{C}, b + "attn/pre_norm/scale", Shape{C});
    add(h + "post_attention_layernorm.weight", Shape{C}, b + "attn/post_norm/scale", Shape{C});
    add(h + "pre_feedforward_layernorm.weight", Shape{C}, b + "mlp/pre_norm/scale", Shape{C});
    add(h + "post_feedforward_layernorm.weight", Shape{C}, b + "mlp/post_norm/scale", Shape{C});
  }
  add("norm.weight", Shape{C}, "post_norm/scale", Shape{C});
  if (!c.transformer.tie_embeddings)
    add("lm_head.weight", Shape{c.transformer.vocab_size, C}, "output_layer/kernel", Shape{C, c.transformer.vocab_size},
        HfLayout::transposed);
  return m;
}

}  // namespace

const HfArchitecture& gemma3_architecture() {
  static const HfArchitecture a{.architecture = kArchitecture,
                                .model_type = kModelType,
                                .listed_as = "Gemma3ForCausalLM (model_type \"gemma3_text\": gemma-3-270m, gemma-3-1b)",
                                .claims = claims,
                                .read_config = read_config,
                                .write_config = write_config,
                                .tensor_map = tensor_map};
  return a;
}

}  // namespace loom::nn
