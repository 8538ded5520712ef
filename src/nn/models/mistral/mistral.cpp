// Mistral (transformers' MistralForCausalLM, model_type "mistral") as a Hugging Face architecture
// of the transformer family: Llama's blocks (nn/models/llama/llama.h) with sliding-window attention
// in every layer: sliding_window W -> model.sliding_window, query i seeing keys i − W < j <= i
// (transformers' sliding_window_overlay on the causal mask). sliding_window null (Mistral 7B v0.2
// and later) is no window: model.sliding_window = 0, which exports as LlamaForCausalLM, the same
// computation.
//
// config.json -> model.*: as Llama's, with MistralConfig's defaults (vocab 32000, intermediate
// 14336, 8 key/value heads, 131072 positions, sliding_window 4096 when the key is absent).
// Tensors: Llama's names and layouts.
#include "core/error.h"
#include "nn/models/llama/llama.h"

namespace loom::nn {

namespace {

constexpr LlamaStyle kMistral{
    .architecture = "MistralForCausalLM",
    .model_type = "mistral",
    .vocab_size = 32000,
    .intermediate_size = 14336,
    .num_key_value_heads = 8,
    .max_position_embeddings = 4096 * 32,
    .tie_word_embeddings = false,
    .qkv_bias = false,
    .sliding_window = 4096,
    .bias_keys = false,
    .variant =
        "Mistral's variant is Llama's (block_order = attn_first, norm = rmsnorm, mlp = swiglu, position = "
        "rope, use_bias = false, qkv_bias = false, causal_mask = true) with a sliding_window > 0; "
        "model.sliding_window chose it"};

bool claims(const ModelConfig& c) {
  return c.transformer.norm == NormKind::rmsnorm && c.transformer.sliding_window > 0;
}

void read_config(const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys) {
  llama_style_read(kMistral, j, m, keys);
}

nlohmann::json write_config(const ModelConfig& c, const HfModelMap& map) {
  nlohmann::json j = llama_style_write(kMistral, c, map);
  j["head_dim"] = c.transformer.head_dim;
  j["sliding_window"] = c.transformer.sliding_window;
  return j;
}

HfModelMap tensor_map(const ModelConfig& c) { return llama_style_map(kMistral, c); }

}  // namespace

const HfArchitecture& mistral_architecture() {
  static const HfArchitecture a{.architecture = kMistral.architecture,
                                .model_type = kMistral.model_type,
                                .listed_as = "MistralForCausalLM (model_type \"mistral\": sliding_window or none)",
                                .claims = claims,
                                .read_config = read_config,
                                .write_config = write_config,
                                .tensor_map = tensor_map,
                                .gguf_architecture = "llama",
                                .gguf_rotate_pairs = true};
  return a;
}

}  // namespace loom::nn
