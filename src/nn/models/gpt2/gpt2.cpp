// GPT-2 (transformers' GPT2LMHeadModel, model_type "gpt2") as a Hugging Face architecture of the
// transformer family: loom's transformer with block_order = attn_first, norm = layernorm, learned
// positions, use_bias, tie_embeddings and causal attention (configs/gpt2_124m.toml).
//
// config.json -> model.*: n_embd -> hidden_size, n_layer -> num_layers, n_embd / n_head ->
// head_dim, n_inner / n_embd (null: 4) -> mlp_expansion, vocab_size -> vocab_size and num_outputs,
// n_positions -> max_seq_len, layer_norm_epsilon (1e-5) -> layer_norm_eps, tie_word_embeddings ->
// tie_embeddings, activation_function gelu_new or gelu_pytorch_tanh (the default) -> mlp
// gelu_tanh, gelu -> mlp gelu; block_order attn_first, use_bias, causal_mask fixed; embed_dropout
// true by default. Missing keys take GPT2Config's defaults. An untied head, another activation,
// unscaled or layer-scaled attention or cross-attention is refused. On export the dropout rates
// are model.dropout_rate (attn_pdrop 0: loom has no attention dropout).
//
// Tensors, per layer l (loom block_l/... <- transformer.h.l.<...>):
//   attn/pre_norm/{scale,bias}      ln_1.{weight,bias}                    [C]
//   attn/qkv/kernel [C, H, 3D]      attn.c_attn.weight [C, 3C]            columns (3, H, D) -> (H, 3, D)
//   attn/qkv/bias [H, 3D]           attn.c_attn.bias [3C]                 the same permutation
//   attn/output_layer/kernel [H, D, C]  attn.c_proj.weight [C, C]         Conv1D stores [in, out]: as is
//   attn/output_layer/bias          attn.c_proj.bias
//   mlp/pre_norm/{scale,bias}       ln_2.{weight,bias}
//   mlp/input_layer/{kernel,bias}   mlp.c_fc.{weight [C, 4C], bias}
//   mlp/output_layer/{kernel,bias}  mlp.c_proj.{weight [4C, C], bias}
// and embed/embedding <- transformer.wte.weight, pos_emb <- transformer.wpe.weight [n_positions, C],
// post_norm/{scale,bias} <- transformer.ln_f.{weight,bias}; the tied head has no tensor of its
// own (lm_head.weight is wte's). A model without biases (use_bias = false, nanoGPT's bias=False:
// the default main job) is GPT-2 with every bias zero: its bias entries have no loom path.
#include "core/error.h"
#include "nn/models/hf_arch.h"
#include "nn/models/transformer/transformer.h"

namespace loom::nn {

namespace {

constexpr const char* kArchitecture = "GPT2LMHeadModel";

bool claims(const ModelConfig& c) { return c.transformer.norm == NormKind::layernorm; }

void read_config(const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys) {
  const int64_t n_embd = j.integer("n_embd", 768), n_layer = j.integer("n_layer", 12), n_head = j.integer("n_head", 12);
  const int64_t n_positions = j.integer("n_positions", 1024), vocab = j.integer("vocab_size", 50257);
  if (n_embd % n_head != 0) j.fail("n_head", "n_embd = " + std::to_string(n_embd) + " is not a multiple of it");
  int64_t inner = 4 * n_embd;
  std::string inner_origin = "n_inner = null (4 × n_embd)";
  if (j.find("n_inner")) {
    inner = j.integer("n_inner", 0);
    inner_origin = "n_inner / n_embd = " + std::to_string(inner) + " / " + std::to_string(n_embd);
    if (inner % n_embd != 0) j.fail("n_inner", "is not a multiple of n_embd = " + std::to_string(n_embd));
  }
  const double eps = j.number("layer_norm_epsilon", 1e-5);
  const std::string act = j.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu")
    j.fail("activation_function", "is \"" + act + "\"; loom runs gelu_new, gelu_pytorch_tanh (tanh GELU) and gelu");
  const bool tied = j.boolean("tie_word_embeddings", true);
  if (!tied) j.fail("tie_word_embeddings", "is false; loom runs GPT-2 with its tied head (lm_head = wte)");
  if (!j.boolean("scale_attn_weights", true)) j.fail("scale_attn_weights", "is false; loom scales by 1/sqrt(head dim)");
  if (j.boolean("scale_attn_by_inverse_layer_idx", false))
    j.fail("scale_attn_by_inverse_layer_idx", "is true, which loom does not do");
  if (j.boolean("add_cross_attention", false)) j.fail("add_cross_attention", "is true: not a decoder-only model");

  m.kind = ModelKind::transformer;
  m.hidden_size = n_embd;
  m.transformer.num_layers = n_layer;
  m.transformer.head_dim = n_embd / n_head;
  m.transformer.mlp_expansion = inner / n_embd;
  m.transformer.intermediate_size = 0;
  m.transformer.vocab_size = m.transformer.num_outputs = vocab;
  m.transformer.max_seq_len = n_positions;
  m.layer_norm_eps = eps;
  m.transformer.block_order = BlockOrder::attn_first;
  m.transformer.norm = NormKind::layernorm;
  m.transformer.mlp = act == "gelu" ? MlpKind::gelu : MlpKind::gelu_tanh;
  m.transformer.position = PositionKind::learned;
  m.transformer.num_kv_heads = 0;
  m.transformer.use_bias = true;
  m.transformer.tie_embeddings = true;
  m.transformer.causal_mask = true;
  m.transformer.embed_dropout = true;
  m.transformer.init = InitScheme::gpt2;
  const std::string a = kArchitecture;
  keys = {
      {.key = "model.kind", .origin = a},
      {.key = "model.hidden_size", .origin = "n_embd = " + std::to_string(n_embd)},
      {.key = "model.num_layers", .origin = "n_layer = " + std::to_string(n_layer)},
      {.key = "model.head_dim",
       .origin = "n_embd / n_head = " + std::to_string(n_embd) + " / " + std::to_string(n_head)},
      {.key = "model.mlp_expansion", .origin = inner_origin},
      {.key = "model.intermediate_size", .origin = inner_origin + " (0: from mlp_expansion)"},
      {.key = "model.vocab_size", .origin = "vocab_size = " + std::to_string(vocab)},
      {.key = "model.num_outputs", .origin = "vocab_size = " + std::to_string(vocab)},
      {.key = "model.max_seq_len", .origin = "n_positions = " + std::to_string(n_positions)},
      {.key = "model.layer_norm_eps", .origin = "layer_norm_epsilon = " + nlohmann::json(eps).dump()},
      {.key = "model.tie_embeddings", .origin = "tie_word_embeddings = true"},
      {.key = "model.block_order", .origin = a + " (attention before MLP)"},
      {.key = "model.norm", .origin = a + " (LayerNorm)"},
      {.key = "model.mlp", .origin = "activation_function = \"" + act + "\""},
      {.key = "model.position", .origin = a + " (learned wpe)"},
      {.key = "model.num_kv_heads", .origin = a + " (every head has its keys and values)"},
      {.key = "model.use_bias", .origin = a + " (biases everywhere)"},
      {.key = "model.causal_mask", .origin = a + " (causal)"},
      {.key = "model.embed_dropout", .origin = "embd_pdrop", .fixed = false},
      {.key = "model.init", .origin = a, .fixed = false},
  };
}

nlohmann::json write_config(const ModelConfig& c, const HfModelMap& map) {
  const int64_t width = mlp_width(c);
  return {
      {"architectures", {map.architecture}},
      {"model_type", map.model_type},
      {"n_embd", c.hidden_size},
      {"n_layer", c.transformer.num_layers},
      {"n_head", map.heads},
      {"n_inner", width == 4 * c.hidden_size ? nlohmann::json(nullptr) : nlohmann::json(width)},
      {"n_positions", c.transformer.max_seq_len},
      {"n_ctx", c.transformer.max_seq_len},
      {"vocab_size", c.transformer.vocab_size},
      {"layer_norm_epsilon", c.layer_norm_eps},
      {"activation_function", c.transformer.mlp == MlpKind::gelu ? "gelu" : "gelu_new"},
      {"resid_pdrop", c.dropout_rate},
      {"embd_pdrop", c.transformer.embed_dropout ? c.dropout_rate : 0.0},
      {"attn_pdrop", 0.0},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"dtype", "float32"},
  };
}

// The causal masks older checkpoints saved per layer (h.<l>.attn.bias and .masked_bias).
bool is_buffer(const std::string& name) {
  return (name.starts_with("h.") || name.starts_with("transformer.h.")) &&
         (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
}

HfModelMap tensor_map(const ModelConfig& c) {
  const HfNeeds need{
      kArchitecture,
      "GPT-2's variant is block_order = attn_first, norm = layernorm, mlp = gelu_tanh or gelu, "
      "position = learned, tie_embeddings = true, causal_mask = true (configs/gpt2_124m.toml); model.norm = layernorm "
      "chose it (a Llama has rmsnorm)"};
  hf_check_decoder(c, need);
  need(c.transformer.norm == NormKind::layernorm, "model.norm", "is " + std::string(choice_name(c.transformer.norm)));
  need(c.transformer.mlp == MlpKind::gelu_tanh || c.transformer.mlp == MlpKind::gelu, "model.mlp",
       "is " + std::string(choice_name(c.transformer.mlp)));
  need(c.transformer.position == PositionKind::learned, "model.position",
       "is not learned (GPT-2 has a position table)");
  need(c.transformer.num_kv_heads == 0 || c.transformer.num_kv_heads * c.transformer.head_dim == c.hidden_size,
       "model.num_kv_heads", "is fewer than num_heads (GPT-2 has no grouped-query attention)");
  need(c.transformer.use_bias || !c.transformer.qkv_bias, "model.qkv_bias",
       "is true without use_bias (GPT-2 has all biases or none)");
  need(c.transformer.sliding_window == 0, "model.sliding_window", "is not 0 (GPT-2 attends to every earlier token)");
  need(c.transformer.tie_embeddings, "model.tie_embeddings",
       "is false (loom's untied head has a bias, GPT-2's lm_head none)");
  need(num_heads(c) * c.transformer.head_dim == c.hidden_size, "model.num_heads",
       "× head_dim is not hidden_size (GPT-2's heads split the width)");
  need(!c.transformer.qk_norm, "model.qk_norm", "is true (GPT-2 does not normalise q and k)");
  need(!c.transformer.post_norms, "model.post_norms", "is true (GPT-2 has no norms after its branches)");
  const int64_t C = c.hidden_size, D = c.transformer.head_dim, H = C / D, F = mlp_width(c);
  HfModelMap m{.architecture = kArchitecture,
               .model_type = "gpt2",
               .prefix = "transformer.",
               .heads = H,
               .head_dim = D,
               .kv_heads = H,
               .conv1d = true,
               .params = {},
               .is_buffer = is_buffer};
  const HfMapBuilder add{m, c.transformer.use_bias};
  add("wte.weight", Shape{c.transformer.vocab_size, C}, "embed/embedding", Shape{c.transformer.vocab_size, C});
  add("wpe.weight", Shape{c.transformer.max_seq_len, C}, "pos_emb", Shape{c.transformer.max_seq_len, C});
  for (int64_t l = 0; l < c.transformer.num_layers; ++l) {
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

}  // namespace

const HfArchitecture& gpt2_architecture() {
  static const HfArchitecture a{.architecture = kArchitecture,
                                .model_type = "gpt2",
                                .listed_as = "GPT2LMHeadModel (model_type \"gpt2\")",
                                .claims = claims,
                                .read_config = read_config,
                                .write_config = write_config,
                                .tensor_map = tensor_map,
                                .gguf_architecture = "gpt2"};
  return a;
}

}  // namespace loom::nn
