// The transformer family's model.* keys (nn/config_keys.h), in `loom help config` order.
#include "nn/config_keys.h"
#include "nn/models/transformer/transformer.h"

namespace loom::nn {

using namespace keys;

#define REF(member) LOOM_KEY_REF(ModelConfig, transformer.member)

namespace {
// An integer, or "auto" stored as kHeadChunkAuto (model.head_chunk).
template <class Get>
KeySpec<ModelConfig> integer_or_auto(const char* key, const char* help, Get ref) {
  KeySpec<ModelConfig> k = integer<ModelConfig>(key, help, ref);
  k.type = "int|auto";
  k.expected = "an integer or \"auto\"";
  k.set_value = [ref](ModelConfig& c, const KeyValue& v) {
    if (const auto* s = std::get_if<std::string>(&v); s && *s == "auto")
      ref(c) = kHeadChunkAuto;
    else if (const auto* i = std::get_if<int64_t>(&v))
      ref(c) = *i;
    else
      throw std::invalid_argument("not an integer or \"auto\"");
  };
  k.set_text = [ref](ModelConfig& c, const std::string& s) { ref(c) = s == "auto" ? kHeadChunkAuto : parse_int(s); };
  k.get = [ref](const ModelConfig& c) {
    const int64_t v = ref(const_cast<ModelConfig&>(c));
    return v == kHeadChunkAuto ? std::string("\"auto\"") : std::to_string(v);
  };
  return k;
}
}  // namespace

std::vector<KeySpec<ModelConfig>> transformer_keys() {
  std::vector<KeySpec<ModelConfig>> k = {
      hidden_size_key(),
      dropout_rate_key(),
      layer_norm_eps_key(),
      architecture(integer<ModelConfig>("model.num_layers", "transformer blocks", REF(num_layers))),
      architecture(integer<ModelConfig>("model.head_dim", "attention head width", REF(head_dim))),
      architecture(
          integer<ModelConfig>("model.num_heads",
                               "attention heads, each of head_dim features (q is num_heads·head_dim wide, the output "
                               "projection maps that back to hidden_size); 0: hidden_size / head_dim",
                               REF(num_heads))),
      architecture(integer<ModelConfig>("model.mlp_expansion",
                                        "MLP hidden width = mlp_expansion × hidden_size (see intermediate_size)",
                                        REF(mlp_expansion))),
      architecture(integer<ModelConfig>("model.vocab_size", "token embedding rows", REF(vocab_size))),
      architecture(integer<ModelConfig>(
          "model.num_outputs", "output logits per position (the vocabulary for a language model)", REF(num_outputs))),
      architecture(
          integer<ModelConfig>("model.max_seq_len", "rows of the learned position embedding", REF(max_seq_len))),
      dtype<ModelConfig>("model.softmax_dtype", "dtype of the attention logits and softmax", REF(softmax_dtype)),
      architecture(boolean<ModelConfig>("model.causal_mask", "causal attention mask", REF(causal_mask))),
  };
  for (KeySpec<ModelConfig>& r : remat_keys()) k.push_back(std::move(r));
  std::vector<KeySpec<ModelConfig>> block = {
      boolean<ModelConfig>(
          "model.scan_layers",
          "parameter layout of files: stacked [num_layers, ...] (the tutorial's nn.scan); execution is the same",
          REF(scan_layers)),
      architecture(
          choice<ModelConfig>("model.block_order", "order of the residual branches in a block", REF(block_order))),
      architecture(
          choice<ModelConfig>("model.norm", "normalisation layers (epsilon: model.layer_norm_eps)", REF(norm))),
      architecture(choice<ModelConfig>("model.mlp", "the MLP of each block", REF(mlp))),
      architecture(
          integer<ModelConfig>("model.intermediate_size",
                               "MLP hidden width; 0: mlp_expansion × hidden_size, and for swiglu and geglu Llama's "
                               "2/3 of that rounded up to a multiple of 256",
                               REF(intermediate_size))),
      architecture(choice<ModelConfig>("model.position", "how token positions enter: learned table or rotary (RoPE)",
                                       REF(position))),
      architecture(
          number<ModelConfig>("model.rope_theta", "RoPE frequency base (model.position = rope)", REF(rope_theta))),
      architecture(choice<ModelConfig>("model.rope_scaling", "RoPE frequency scaling (transformers' rope_type)",
                                       REF(rope_scaling))),
      architecture(number<ModelConfig>(
          "model.rope_factor", "llama3 rope_scaling: how much the low frequencies are divided by", REF(rope_factor))),
      architecture(
          number<ModelConfig>("model.rope_low_freq_factor",
                              "llama3 rope_scaling: wavelengths above rope_original_max_position / this are scaled",
                              REF(rope_low_freq_factor))),
      architecture(
          number<ModelConfig>("model.rope_high_freq_factor",
                              "llama3 rope_scaling: wavelengths below rope_original_max_position / this are kept",
                              REF(rope_high_freq_factor))),
      architecture(
          integer<ModelConfig>("model.rope_original_max_position",
                               "llama3 rope_scaling: the pretraining context length the wavelengths are compared to",
                               REF(rope_original_max_position))),
      architecture(integer<ModelConfig>("model.num_kv_heads",
                                        "key/value heads, dividing num_heads (grouped-query attention; 0 = num_heads)",
                                        REF(num_kv_heads))),
      architecture(
          boolean<ModelConfig>("model.qk_norm",
                               "RMSNorm of each query and key head over head_dim before rope, one [head_dim] scale for "
                               "the queries and one for the keys (Qwen3's q_norm and k_norm)",
                               REF(qk_norm))),
      architecture(
          boolean<ModelConfig>("model.post_norms",
                               "normalise each branch's output (after its output layer) before the residual add, as "
                               "Gemma's post_attention_layernorm and post_feedforward_layernorm (model.norm)",
                               REF(post_norms))),
      architecture(
          boolean<ModelConfig>("model.use_bias", "biases in the Dense layers (nanoGPT's bias)", REF(use_bias))),
      architecture(boolean<ModelConfig>(
          "model.qkv_bias", "biases in the q/k/v projection even when use_bias is false (Qwen2's q/k/v_proj)",
          REF(qkv_bias))),
      architecture(
          integer<ModelConfig>("model.sliding_window",
                               "each query attends to the last sliding_window tokens, itself included (Mistral's "
                               "sliding_window); 0: to all earlier tokens",
                               REF(sliding_window))),
      architecture(
          integer<ModelConfig>("model.sliding_window_pattern",
                               "local and global layers: N > 0 makes every Nth layer (l + 1 a multiple of N) global, "
                               "attending to all earlier tokens with rope_theta, the others local with sliding_window "
                               "and rope_local_theta (Gemma 3: 6); 0: every layer local",
                               REF(sliding_window_pattern))),
      architecture(number<ModelConfig>("model.rope_local_theta",
                                       "RoPE frequency base of the local layers (sliding_window_pattern; Gemma 3's "
                                       "rope_local_base_freq); 0: rope_theta",
                                       REF(rope_local_theta))),
      architecture(
          number<ModelConfig>("model.query_pre_attn_scalar",
                              "attention logits scaled by query_pre_attn_scalar^-0.5 (Gemma 3); 0: by head_dim^-0.5",
                              REF(query_pre_attn_scalar))),
      architecture(boolean<ModelConfig>(
          "model.scale_embeddings",
          "token embeddings times sqrt(hidden_size), rounded to the compute dtype (Gemma); the tied "
          "head uses the table unscaled",
          REF(scale_embeddings))),
      architecture(boolean<ModelConfig>("model.tie_embeddings",
                                        "logits = x · embeddingᵀ (GPT-2 weight tying; needs num_outputs = vocab_size)",
                                        REF(tie_embeddings))),
      integer_or_auto("model.head_chunk",
                      "training and evaluation run the output layer and the loss fused, this many "
                      "vocabulary columns of logits at a time, so [tokens, vocabulary] logits are never "
                      "held whole (sampling keeps the plain head); 0: the plain head and loss; auto: "
                      "model.remat = auto chooses (the plain head or a chunk) with the layers' remat",
                      REF(head_chunk)),
      choice<ModelConfig>("model.init", "parameter init", REF(init)),
      boolean<ModelConfig>("model.embed_dropout", "dropout after the token + position embedding (GPT-2)",
                           REF(embed_dropout)),
  };
  k.insert(k.end(), block.begin(), block.end());
  return k;
}

#undef REF

}  // namespace loom::nn
