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
};

ModelGraph build_transformer(const TransformerSpec& spec, int64_t batch, int64_t seq_len, bool train);

}  // namespace loom::nn
