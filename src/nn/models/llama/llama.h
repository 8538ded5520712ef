// What the Llama-style architectures share (LlamaForCausalLM, and the families that are Llama
// with a difference: Qwen2's q/k/v biases, Mistral's sliding window): config.json in and out and
// the tensor map of loom's transformer with block_order = attn_first, norm = rmsnorm, mlp =
// swiglu, position = rope and causal attention. Each row (nn/models/<family>/) describes its
// config class's defaults and its difference in a LlamaStyle and adds its own keys.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "nn/models/hf_arch.h"

namespace loom::nn {

struct LlamaStyle {
  const char* architecture;  // "LlamaForCausalLM"
  const char* model_type;    // "llama"
  // The config class's defaults for absent keys (num_key_value_heads 0: num_attention_heads).
  int64_t vocab_size, intermediate_size, num_key_value_heads, max_position_embeddings;
  bool tie_word_embeddings;
  bool qkv_bias;  // q_proj, k_proj and v_proj have biases (Qwen2), no other layer does
  // The config class's sliding_window (Mistral: 4096; null in a file: none), applied to every
  // layer; 0: the config has no window.
  int64_t sliding_window;
  bool bias_keys;       // the config has attention_bias and mlp_bias (LlamaConfig), which must be false
  const char* variant;  // what the refusal of a model this architecture cannot hold says it needs
};

// config.json -> m (loom's defaults on entry) and the model.* keys it sets, with their origins.
void llama_style_read(const LlamaStyle& s, const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys);
// The config.json of `c` (without bos/eos), with the keys every such config class writes.
nlohmann::json llama_style_write(const LlamaStyle& s, const ModelConfig& c, const HfModelMap& map);
// The map of `c`'s parameters; a model the architecture cannot hold is a UserError naming the key.
HfModelMap llama_style_map(const LlamaStyle& s, const ModelConfig& c);
// Layer l's tensors in Llama's names and layouts, appended through `add` (prefix "layers.l.",
// loom's "block_l/"): the attention's q/k/v_proj (with their biases when c.qkv_bias) and o_proj;
// the MLP's gate/up/down_proj. Rows with Llama's projections and other norms (Gemma 3) share them.
void llama_attention_tensors(const HfMapBuilder& add, const ModelConfig& c, int64_t l);
void llama_mlp_tensors(const HfMapBuilder& add, const ModelConfig& c, int64_t l);

}  // namespace loom::nn
