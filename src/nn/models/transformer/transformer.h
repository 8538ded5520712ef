// The Transformer language model of the Part 1.2 tutorial (seed 001), exactly as it writes it:
//   embed (nn.Embed, dtype) + pos_emb[:T] (normal 0.02, cast to dtype; none with model.position =
//   rope, where a rope op rotates q and k of the packed qkv at the tokens' positions instead;
//   model.scale_embeddings: the embeddings times sqrt(C) first, Gemma's)
//   num_layers × TransformerBlock: x = x + MLPBlock(x); x = x + AttentionBlock(x)   (mlp_first)
//   post_norm LayerNorm -> output_layer Dense(num_outputs) -> cast float32
// MLPBlock: pre_norm -> input_layer Dense(F) -> gelu -> output_layer Dense(C) -> dropout, F = mlp_width
//   (model.mlp = gelu: the exact GELU; swiglu: output_layer(silu(gate_layer(h)) · up_layer(h)),
//   transformers' LlamaMLP with down_proj = output_layer; geglu the same with the tanh GELU, Gemma's;
//   biases per model.use_bias as everywhere; model.post_norms: a norm "post_norm" after output_layer,
//   in the attention block too, Gemma's post_attention_layernorm and post_feedforward_layernorm)
// AttentionBlock: pre_norm -> qkv DenseGeneral((H, 3·D)) -> dot_product_attention(softmax_dtype)
//                 -> output_layer DenseGeneral(C, axis=(-2, -1)) -> dropout
//   (H = model.num_heads, hidden_size / head_dim when 0, so H·D may differ from C; model.qk_norm:
//   qk_norm normalises each query and key head over D, scales q_norm/scale and k_norm/scale [D],
//   before rope, as transformers' Qwen3Attention; each layer's window and RoPE base per
//   layer_attention; model.query_pre_attn_scalar: logits scaled by its ^-0.5, not D^-0.5)
// Parameter paths are those of the tutorial with scan_layers=False ("block_3/mlp/input_layer/kernel");
// the stacked scan layout is a file-format mapping (nn/param_layout.h), not a different program.
// Remat regions: `MLP` -> block_l/mlp, `Attn` -> block_l/attn, `Block` -> block_l.
// The GPT-2 variant (configs/gpt2_124m.toml): attn_first, tied embeddings, GPT-2 init, embedding
// dropout. Its qkv projection keeps the tutorial's (H, 3·D) column layout — a permutation of
// GPT-2's (3, H, D) c_attn columns that changes nothing when training from scratch.
#pragma once
#include <cstdint>

#include <vector>

#include "core/config_key.h"
#include "nn/config.h"
#include "nn/model.h"

namespace loom::nn {

// The model of `c` (model.kind = transformer) for `in.batch` sequences of `in.seq_len` tokens.
// With in.packed, a row holds several examples: the input "positions" [B, T] (m.positions) restarts
// the position embeddings (learned or rotary) at each example and keeps attention within it;
// it needs model.causal_mask (a UserError otherwise).
// The tutorial's model is block_order = mlp_first, use_bias, untied, init = flax, no embed_dropout.
ModelGraph build_transformer(const ModelConfig& c, const ModelInput& in, bool train);
// model.head_chunk = auto: model.remat = auto chooses the head, plain or a chunk (train/fit.h). A
// program built with it unresolved (`loom eval` of the config) has the plain head.
inline constexpr int64_t kHeadChunkAuto = -1;
// The MLP's hidden width: model.intermediate_size, or when 0, mlp_expansion·hidden_size for the
// GELU MLPs and for the gated ones (swiglu, geglu) Meta's Llama rule, 2/3 of that rounded up to a multiple of 256
// (hidden 576 -> 1536 as SmolLM, 4096 -> 11008 as Llama 2 7B; transformers' LlamaConfig files
// state intermediate_size, which an import takes). The 2/3 keeps swiglu's three matrices at the
// GELU MLP's parameters and FLOPs, which ⌊8·hidden/3⌋ matches without the rounding.
int64_t mlp_width(const ModelConfig& c);
// Layer `layer`'s attention: the window it masks with (0: every earlier token) and its RoPE base.
// Global layers (model.sliding_window_pattern N > 0, layer + 1 a multiple of N) attend to
// everything with rope_theta; the others, every layer when N = 0, use model.sliding_window and
// rope_local_theta (rope_theta when 0): Mistral's window in every layer, Gemma 3's local/global mix.
struct LayerAttention {
  int64_t window;
  double rope_theta;
};
LayerAttention layer_attention(const ModelConfig& c, int64_t layer);
// Whether the MLP is gated (swiglu, geglu: gate_layer and up_layer into the activation's product).
bool gated_mlp(const ModelConfig& c);
// The attention heads: model.num_heads, or hidden_size / head_dim when it is 0.
int64_t num_heads(const ModelConfig& c);
// Its model.* keys (num_heads = hidden_size / head_dim must be whole when model.num_heads is 0,
// ...): UserError naming the key.
void validate_transformer(const ModelConfig& c);

// The same model as a one-token decoding program with a key/value cache (KV-cached sampling,
// sample/sample.h): run once per token, with the same program for every position. Inputs:
// "inputs" [B, 1] i32, the current tokens; "positions" [1] i32, their position p (< max_len; the
// attention's scalar `pos` is a view of it); per layer the persistent caches
// "block_<l>/attn/k_cache" and "block_<l>/attn/v_cache" [B, max_len, KV, head_dim] in c.dtype
// (KV = model.num_kv_heads, or num_heads when 0),
// which attention_decode fills at row p. Output (m.output, marked): logits [B, 1, num_outputs] f32,
// equal to build_transformer's logits at position p given the tokens 0..p (to kernel rounding).
// Parameters and their paths are build_transformer's (one block builder serves both), so
// io/param_io.h loads a checkpoint into it. No loss, no dropout, no remat. Requires
// c.causal_mask and 1 <= max_len <= c.max_seq_len (std::invalid_argument otherwise).
ModelGraph build_transformer_decoder(const ModelConfig& c, int64_t batch, int64_t max_len);

// The decoder's batched prefill (sample/sample.h): `len` tokens per sequence at positions
// 0..len-1 through the network as one pass (every matmul over len rows, causal attention), which
// also stores their keys and values in rows 0..len-1 of the same caches (kv_cache_write; rows
// len.. are left as they were). Inputs: "inputs" [B, len] i32; the constants (m.constants)
// "positions" [len] and "last_rows" [B]; the caches, named and shaped as the decoder's, so one set
// of buffers serves both programs (Executor::External). Output (m.output, marked): the logits of
// each sequence's last token [B, 1, num_outputs] f32, equal to the decoder's after feeding the
// tokens one at a time (to kernel rounding); only that row goes through post_norm and the head.
// Parameters as build_transformer's. Requires c.causal_mask and 1 <= len <= max_len <=
// c.max_seq_len (std::invalid_argument otherwise).
ModelGraph build_transformer_prefill(const ModelConfig& c, int64_t batch, int64_t len, int64_t max_len);

// Its model.* keys (models/transformer/keys.cpp; ModelKindInfo::keys).
std::vector<KeySpec<ModelConfig>> transformer_keys();

}  // namespace loom::nn
