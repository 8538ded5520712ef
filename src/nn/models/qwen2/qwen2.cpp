// Qwen2 (transformers' Qwen2ForCausalLM, model_type "qwen2": Qwen2 and Qwen2.5) as a Hugging Face
// architecture of the transformer family: Llama's blocks (nn/models/llama/llama.h) with biases on
// q_proj, k_proj and v_proj (always: Qwen2Config has no flag) and on no other layer, so
// model.use_bias = false, model.qkv_bias = true.
//
// config.json -> model.*: as Llama's, with Qwen2Config's defaults (vocab 151936, intermediate
// 22016, 32 key/value heads, 32768 positions; rope_theta 10000, Qwen2.5's files say 1e6).
// use_sliding_window = true (sliding attention in layers max_window_layers and up) is refused:
// loom's sliding window is the same in every layer; Qwen2.5's files have false.
//
// Tensors: Llama's map plus, per layer l, model.layers.l.self_attn.{q,k,v}_proj.bias [H·D], [KV·D],
// [KV·D] -> block_l/attn/qkv/bias [KV, (G+2)·D], in the kernel's slots (q: 0..G-1, k: G, v: G+1).
#include "core/error.h"
#include "nn/models/llama/llama.h"

namespace loom::nn {

namespace {

constexpr LlamaStyle kQwen2{
    .architecture = "Qwen2ForCausalLM",
    .model_type = "qwen2",
    .vocab_size = 151936,
    .intermediate_size = 22016,
    .num_key_value_heads = 32,
    .max_position_embeddings = 32768,
    .tie_word_embeddings = false,
    .qkv_bias = true,
    .sliding_window = 0,
    .bias_keys = false,
    .variant =
        "Qwen2's variant is Llama's (block_order = attn_first, norm = rmsnorm, mlp = swiglu, position = "
        "rope, causal_mask = true, sliding_window = 0) with use_bias = false, qkv_bias = true; "
        "model.qkv_bias = true chose it"};

// Qwen2ForCausalLM's layers apply the window only from max_window_layers up (Qwen2Config).
constexpr int64_t kMaxWindowLayers = 28;

bool claims(const ModelConfig& c) {
  return c.transformer.norm == NormKind::rmsnorm && c.transformer.qkv_bias && !c.transformer.use_bias;
}

void read_config(const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys) {
  llama_style_read(kQwen2, j, m, keys);
  if (j.boolean("use_sliding_window", false))
    j.fail("use_sliding_window",
           "is true (sliding-window attention in the layers from max_window_layers up); loom runs Qwen2 with "
           "use_sliding_window = false, as Qwen2.5 is released, and a window only in every layer (Mistral)");
  if (const nlohmann::json* t = j.find("layer_types")) {
    if (!t->is_array()) j.fail("layer_types", "is not a list");
    for (const nlohmann::json& l : *t)
      if (!l.is_string() || l.get<std::string>() != "full_attention")
        j.fail("layer_types", "has " + l.dump() + "; loom runs Qwen2 with every layer \"full_attention\"");
  }
}

nlohmann::json write_config(const ModelConfig& c, const HfModelMap& map) {
  nlohmann::json j = llama_style_write(kQwen2, c, map);
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = kMaxWindowLayers;
  j["layer_types"] = std::vector<std::string>(static_cast<size_t>(c.transformer.num_layers), "full_attention");
  return j;
}

HfModelMap tensor_map(const ModelConfig& c) { return llama_style_map(kQwen2, c); }

}  // namespace

const HfArchitecture& qwen2_architecture() {
  static const HfArchitecture a{.architecture = kQwen2.architecture,
                                .model_type = kQwen2.model_type,
                                .listed_as = "Qwen2ForCausalLM (model_type \"qwen2\": Qwen2, Qwen2.5)",
                                .claims = claims,
                                .read_config = read_config,
                                .write_config = write_config,
                                .tensor_map = tensor_map,
                                .gguf_architecture = "qwen2"};
  return a;
}

}  // namespace loom::nn
