// The Transformer language model of the Part 1.2 tutorial (seed 001), exactly as it writes it:
//   embed (nn.Embed, dtype) + pos_emb[:T] (normal 0.02, cast to dtype)
//   num_layers × TransformerBlock: x = x + MLPBlock(x); x = x + AttentionBlock(x)   (mlp_first)
//   post_norm LayerNorm -> output_layer Dense(num_outputs) -> cast float32
// MLPBlock: pre_norm -> input_layer Dense(mlp_expansion·C) -> gelu -> output_layer Dense(C) -> dropout
// AttentionBlock: pre_norm -> qkv DenseGeneral((H, 3·D)) -> dot_product_attention(softmax_dtype)
//                 -> output_layer DenseGeneral(C, axis=(-2, -1)) -> dropout
// Parameter paths are those of the tutorial with scan_layers=False ("block_3/mlp/input_layer/kernel");
// the stacked scan layout is a file-format mapping (nn/param_layout.h), not a different program.
// Remat regions: `MLP` -> block_l/mlp, `Attn` -> block_l/attn, `Block` -> block_l.
// The GPT-2 variant (configs/gpt2_124m.toml): attn_first, tied embeddings, GPT-2 init, embedding
// dropout. Its qkv projection keeps the tutorial's (H, 3·D) column layout — a permutation of
// GPT-2's (3, H, D) c_attn columns that changes nothing when training from scratch.
#pragma once
#include <cstdint>

#include "nn/model.h"

namespace loom::nn {

struct TransformerSpec {
  DType dtype = DType::f32;
  DType softmax_dtype = DType::f32;
  int64_t hidden_size = 1024;
  int64_t num_layers = 12;
  int64_t head_dim = 128;
  int64_t mlp_expansion = 4;
  int64_t vocab_size = 2048;
  int64_t num_outputs = 2048;
  int64_t max_seq_len = 512;
  float dropout_rate = 0.f;
  float layer_norm_eps = 1e-6f;
  bool causal_mask = true;
  bool attn_first = false;  // GPT-2 block order: x + attn(x), then x + mlp(x)
  bool remat_mlp = false, remat_attn = false, remat_block = false;
  // GPT-2 / nanoGPT variant switches (the tutorial's model: true, false, false, false):
  bool use_bias = true;         // biases in the Dense layers (nanoGPT's `bias`)
  bool tie_embeddings = false;  // logits = x · embeddingᵀ (nn.Embed.attend; no output layer params)
  bool gpt2_init = false;       // normal(0.02) everywhere, residual projections 0.02/sqrt(2·layers)
  bool embed_dropout = false;   // dropout after token + position embedding (GPT-2)
};

ModelGraph build_transformer(const TransformerSpec& spec, int64_t batch, int64_t seq_len, bool train);

// The same model as a one-token decoding program with a key/value cache (KV-cached sampling,
// sample/sample.h): run once per token, with the same program for every position. Inputs:
// "inputs" [B, 1] i32, the current tokens; "positions" [1] i32, their position p (< max_len; the
// attention's scalar `pos` is a view of it); per layer the persistent caches
// "block_<l>/attn/k_cache" and "block_<l>/attn/v_cache" [B, max_len, H, head_dim] in spec.dtype,
// which attention_decode fills at row p. Output (m.output, marked): logits [B, 1, num_outputs] f32,
// equal to build_transformer's logits at position p given the tokens 0..p (to kernel rounding).
// Parameters and their paths are build_transformer's (one block builder serves both), so
// io/param_io.h loads a checkpoint into it. No loss, no dropout, no remat. Requires
// spec.causal_mask and 1 <= max_len <= spec.max_seq_len (std::invalid_argument otherwise).
ModelGraph build_transformer_decoder(const TransformerSpec& spec, int64_t batch, int64_t max_len);

}  // namespace loom::nn
